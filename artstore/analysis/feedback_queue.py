"""A run's feedback queue: its rollouts that a person has not judged yet, one at a time.

For the viewer's queue page. The queue holds the run's finished rollouts that are in a
group (a score is a reward in the rollout's group: `Store.feedback`), in a stable order:
policy step, group, rollout id. A rollout leaves a person's queue once a `feedback` event
by that name judges the whole rollout (a score, a label or a comment; a judgement of one
LLM call does not count). Skipping is a cursor, `after`: the next rollout in the order
after the one skipped, so what was skipped comes back only when the queue starts again.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sqlalchemy import ColumnElement, Select, exists, func, literal, select, tuple_

from artstore.schema import tables as t

if TYPE_CHECKING:
    from artstore.store import Store

ro, ev = t.rollouts, t.events
NO_STEP = 2**31 - 1  # the largest INTEGER of both databases


@dataclass
class QueueState:
    rollout_id: str | None  # the next rollout to judge; None when none is left after `after`
    position: int | None  # its place in the run's order, from 1
    total: int  # the run's rollouts in the queue's order, judged or not
    judged: int  # those already judged by the person


def _judged(name: str) -> ColumnElement[bool]:
    """Whether `name` has judged the whole rollout (a `feedback` event on its stream)."""
    return exists(
        select(literal(1)).where(
            ev.c.stream_id == literal("feedback-").concat(ro.c.rollout_id),
            ev.c.type == "feedback",
            ev.c.data["name"].as_string() == name,
            ev.c.data["call_index"].as_string().is_(None),
        )
    )


def _order_key() -> tuple[Any, ...]:
    # A rollout of no policy step (a validation rollout) comes after the policy steps.
    return (func.coalesce(ro.c.policy_step, NO_STEP), ro.c.group_id, ro.c.rollout_id)


def _in_queue(run: str) -> Select[Any]:
    return select(ro.c.rollout_id).where(
        ro.c.run == run, ro.c.status == "finished", ro.c.group_id.is_not(None)
    )


def _after(key: tuple[Any, ...], values: Any) -> ColumnElement[bool]:
    """Rows whose key comes after `values` in the queue's order."""
    return tuple_(*key) > tuple_(*(literal(v) for v in values))


async def next_to_judge(store: Store, run: str, name: str, after: str | None = None) -> QueueState:
    """The first rollout of `run`'s queue that `name` has not judged, after the rollout
    `after` in the queue's order (from the start when None, or not in this queue)."""
    key = _order_key()
    keyed = _in_queue(run).add_columns(*key)
    async with store.database.read() as c:
        start = None
        if after:
            start = (await c.execute(keyed.where(ro.c.rollout_id == after))).first()
        pending = keyed.where(~_judged(name)).order_by(*key).limit(1)
        if start is not None:
            pending = pending.where(_after(key, start[1:]))
        found = (await c.execute(pending)).first()
        total = await _count(c, _in_queue(run))
        judged = await _count(c, _in_queue(run).where(_judged(name)))
        position = None
        if found is not None:
            position = total - await _count(c, _in_queue(run).where(_after(key, found[1:])))
    return QueueState(found[0] if found else None, position, total, judged)


async def _count(c: Any, rows: Select[Any]) -> int:
    counted = rows.with_only_columns(func.count(), maintain_column_froms=True)
    return int((await c.execute(counted)).scalar() or 0)
