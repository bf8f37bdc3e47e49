"""Ids as people type them: a rollout or group id, or the first characters of one."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from sqlalchemy import select

from artstore.errors import NotFoundError
from artstore.schema.views import view_table

if TYPE_CHECKING:
    from artstore.store import Store

Kind = Literal["rollout", "group"]

_COLUMNS = {"rollout": ("v_rollouts", "rollout_id"), "group": ("v_groups", "group_id")}


class AmbiguousIdError(NotFoundError):
    """A prefix that starts more than one id."""


async def resolve_id(store: Store, kind: Kind, given: str) -> str:
    """The full id of the `kind` that `given` names: itself, or the one id it starts.

    Raises NotFoundError when none matches, AmbiguousIdError when several do.
    """
    view_name, column_name = _COLUMNS[kind]
    column = view_table(view_name).c[column_name]
    given = given.strip()
    if not given:
        raise NotFoundError(f"give a {kind} id (or its first characters)")
    async with store.database.read() as connection:
        exact = (await connection.execute(select(column).where(column == given).limit(1))).scalar()
        if exact is not None:
            return str(exact)
        found = (
            (
                await connection.execute(
                    select(column)
                    .where(column.startswith(given, autoescape=True))
                    .distinct()
                    .order_by(column)
                    .limit(4)
                )
            )
            .scalars()
            .all()
        )
    if not found:
        raise NotFoundError(f"no {kind} id starts with {given!r} in this store")
    if len(found) > 1:
        shown = ", ".join(str(i) for i in found[:3]) + (", ..." if len(found) > 3 else "")
        raise AmbiguousIdError(
            f"{given!r} starts several {kind} ids ({shown}): give more characters"
        )
    return str(found[0])
