"""`open_store` and `Store`: the one entry point of the library.

A `Store` wraps the event store (`store.events`) with its projections and the capture of
rollouts; training is built on it, in functions that take the store (`artstore.replay`,
`artstore.rescore`, `artstore.TrainingFramework`).
"""

from __future__ import annotations

import asyncio
import getpass
import math
import sys
from collections.abc import Collection, Iterable
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Any, Literal

from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError

from artstore.arguments import (
    check_callable,
    check_choice,
    check_json,
    check_model_name,
    check_name,
    check_names,
    check_url,
    check_whole_numbers,
)
from artstore.errors import DatabaseUnavailableError, InvalidArgumentError, NotFoundError
from artstore.eventstore.database import Database, connect, database_class, translate_error
from artstore.eventstore.records import InStatement, Projector, SideBySide
from artstore.eventstore.store import EventStore
from artstore.names import kind_of
from artstore.redaction import learn
from artstore.schema import migrate
from artstore.urls import resolve_url

if TYPE_CHECKING:
    import art

    from artstore.capture.rollout import Rollout, RolloutCheck
    from artstore.events import Feedback


def check_finite(argument: str, value: Any) -> None:
    """A score: a finite number, or None."""
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise InvalidArgumentError(argument, f"must be a finite number, not {value!r}")


class Store:
    """The artstore: the event store, its projections, and what is built on them.

    Open one with `await artstore.open_store(url)`; use it with `async with`. It wraps an
    `EventStore` (`store.events`), whose appends and reads it offers as its own.
    """

    def __init__(
        self,
        database: Database,
        *,
        projector: Projector | None = None,
        projected_types: Collection[str] | None = None,
        side_by_side: SideBySide | None = None,
        in_statement: InStatement | None = None,
    ) -> None:
        events = EventStore(
            database,
            projector=projector,
            projected_types=projected_types,
            side_by_side=side_by_side,
            in_statement=in_statement,
        )
        self.events = events
        self.database = database
        self.redact = events.redact  # the credentials every payload is cleaned of
        # The event store's own methods, bound once: capture calls them per LLM call.
        self.append = events.append
        self.append_nowait = events.append_nowait
        self.append_together_nowait = events.append_together_nowait
        self.flush = events.flush
        self.read_stream = events.read_stream
        self.read_streams = events.read_streams
        self.read_all = events.read_all
        self.iter_all = events.iter_all
        self.stream_version = events.stream_version
        self.last_position = events.last_position
        self.get_blobs = events.get_blobs

    @property
    def dialect(self) -> str:
        return self.database.dialect

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The event loop the store's writer runs on (for appends from other threads)."""
        return self.events.loop

    @property
    def transactions(self) -> int:
        """Write transactions committed (group commit at work)."""
        return self.events.transactions

    @property
    def single_statement_transactions(self) -> int:
        return self.events.single_statement_transactions

    @property
    def side_by_side_transactions(self) -> int:
        return self.events.side_by_side_transactions

    async def __aenter__(self) -> Store:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Fail the rollout blocks still running in this process (their calls on the way
        recorded as incomplete: none is left `running`), write everything queued, then
        release every connection."""
        try:
            # No rollout block can be open where capture was never imported (a reader's
            # store): closing it imports nothing.
            if "artstore.capture.rollout" in sys.modules:
                from artstore.capture.rollout import end_open_rollouts

                await end_open_rollouts(self)
        finally:
            await self.events.close()

    # --- capture ------------------------------------------------------------------------

    def rollout(
        self,
        model: Any,
        *,
        scenario: Any = None,
        run: str | None = None,
        group_id: str | None = None,
        scenario_index: int | None = None,
        role: Literal["policy", "validation"] = "policy",
        policy_step: int | None = None,
        rollout_id: str | None = None,
        check: RolloutCheck | None = None,
        resumes: str | None = None,
    ) -> AbstractAsyncContextManager[Rollout]:
        """Record a rollout of `model`: `async with store.rollout(model, scenario=s) as r:`.

        See `artstore.capture.rollout` for what is recorded and when it is durable, and
        for `check` (run in the transactions that record the rollout's start and end).
        `resumes` names an earlier attempt that did not finish: its recorded calls are
        served back to the agent while its requests match (`artstore.capture.replay`).
        """
        from artstore.capture.rollout import rollout, to_json_value

        check_model_name(model)
        check_json("scenario", to_json_value(scenario))
        check_names(
            optional=True, run=run, group_id=group_id, rollout_id=rollout_id, resumes=resumes
        )
        check_whole_numbers(optional=True, scenario_index=scenario_index, policy_step=policy_step)
        check_choice("role", role, ("policy", "validation"))
        if check is not None:
            check_callable("check", check)
        return rollout(
            self,
            model,
            scenario=scenario,
            run=run,
            group_id=group_id,
            scenario_index=scenario_index,
            role=role,
            policy_step=policy_step,
            rollout_id=rollout_id,
            check=check,
            resumes=resumes,
        )

    # --- feedback -----------------------------------------------------------------------

    async def feedback(
        self,
        rollout_id: str,
        *,
        score: float | None = None,
        label: str | None = None,
        comment: str | None = None,
        name: str | None = None,
        call_index: int | None = None,
    ) -> Feedback:
        """Record a person's judgement of a rollout (or of its LLM call `call_index`).

        A score of the rollout is a reward by the scorer `human:<name>` (`name`: the
        user's login name by default), which replay, datasets and the views use like any
        scorer's. Nothing is changed: a second judgement is recorded beside the first, and
        the latest score is the scorer's latest reward.
        """
        from artstore.events import Feedback

        check_name("rollout_id", rollout_id)
        name = check_name("name", getpass.getuser() if name is None else name)
        check_whole_numbers(optional=True, call_index=call_index)
        check_finite("score", score)
        for argument, text in (("label", label), ("comment", comment)):
            if text is not None and not isinstance(text, str):
                raise InvalidArgumentError(argument, f"must be a str, not {kind_of(text)}")
        if score is None and not label and not comment:
            raise InvalidArgumentError("score", "give a score, a label or a comment")
        row = await self._rollout_row(rollout_id)
        if call_index is not None and call_index >= row.num_llm_calls:
            raise InvalidArgumentError(
                "call_index", f"rollout {rollout_id} has {row.num_llm_calls} LLM calls"
            )
        if score is not None and call_index is None and row.group_id is None:
            raise InvalidArgumentError(
                "score", f"rollout {rollout_id} is in no group, so it has no rewards to join"
            )
        event = Feedback(
            rollout_id=rollout_id,
            name=name,
            group_id=row.group_id,
            call_index=call_index,
            score=None if score is None else float(score),
            label=label,
            comment=comment,
        )
        await self.append(f"feedback-{rollout_id}", [event])
        return event

    async def _rollout_row(self, rollout_id: str) -> Any:
        from sqlalchemy import select

        from artstore.schema import tables as t

        ro = t.rollouts
        async with self.database.read() as connection:
            found = (
                await connection.execute(
                    select(ro.c.group_id, ro.c.num_llm_calls).where(ro.c.rollout_id == rollout_id)
                )
            ).first()
        if found is None:
            raise NotFoundError(f"no rollout {rollout_id} in this store")
        return found

    # --- projections --------------------------------------------------------------------

    async def trajectory(self, rollout_id: str, *, scorer: str | None = None) -> art.Trajectory:
        """The `art.Trajectory` of a rollout, projected from its events.

        Its reward is the latest one recorded by `scorer` (by any scorer when None; 0.0
        when there is none), with that scorer's metrics merged into the rollout's.
        """
        found = await self.trajectories([rollout_id], scorer=scorer)
        return found[rollout_id]

    async def trajectories(
        self, rollout_ids: Iterable[str], *, scorer: str | None = None
    ) -> dict[str, art.Trajectory]:
        """Several trajectories at once (one query for all their events and messages)."""
        if isinstance(rollout_ids, str):
            raise InvalidArgumentError("rollout_ids", "must be rollout ids (a list), not a str")
        rollout_ids = list(rollout_ids)
        for rollout_id in rollout_ids:
            check_name("rollout_id", rollout_id)
        check_name("scorer", scorer, optional=True)
        from artstore.projections.art_trajectories import read_trajectories

        return await read_trajectories(self.events, list(dict.fromkeys(rollout_ids)), scorer)

    # --- maintenance --------------------------------------------------------------------

    async def rebuild_projections(self) -> int:
        """Recompute every projection table from the event log; returns the events replayed."""
        from artstore.projections import rebuild

        def locked_rebuild(connection: Connection) -> int:
            # Hold appenders off: an append projected meanwhile would update deleted rows.
            self.database.lock_appends(connection)
            return rebuild(connection)

        await self.flush()
        return await self.database.run_write(lambda c: c.run_sync(locked_rebuild))


async def open_store(
    url: str | None = None,
    *,
    migrate_schema: bool = True,
    read_only: bool = False,
    create: bool = True,
) -> Store:
    """Open the store at `url`, `$ARTSTORE_URL`, or `.artstore/artstore.db` here.

    The schema is brought up to date unless `migrate_schema` is False; a database written
    by a newer artstore is refused (SchemaTooNewError), and an unreachable one raises
    DatabaseUnavailableError.

    `read_only=True` opens an existing store for reading (what `artstore runs`, `show`,
    `sql` and `export` do): nothing is created or migrated, the SQLite file is opened
    read-only (read-only media work, writers are never waited for), PostgreSQL sessions
    are read-only; a missing database, another application's, or one that needs
    `artstore db upgrade` is a clear error, and appending raises ReadOnlyStoreError.

    `create=False` opens an existing store for writing (what `artstore rescore` and
    `replay` do): a missing SQLite file or an empty database is the same clear error as
    for reading, and nothing is created; an artstore store is still migrated.
    """
    resolved = resolve_url(check_url(url), create_folder=create and not read_only)
    learn(urls=[resolved.render_as_string(hide_password=False)])  # its password, if any
    if not create and not read_only:
        database_class(resolved).check_exists(resolved)  # connecting would create it
    database = connect(resolved, read_only=read_only)
    try:
        await database.check_reachable()
        if read_only:
            await check_readable(database)
        else:
            await prepare_schema(database, upgrade=migrate_schema, create=create)
    except BaseException:
        await database.dispose()
        raise
    if read_only:  # it never appends: no projector (LangChain and the projections stay unloaded)
        return Store(database)
    from artstore.capture import credentials
    from artstore.projections import (  # not for `--help`
        in_statement,
        project,
        projected_types,
        side_by_side,
    )

    credentials.install()  # a store that writes learns the keys of the requests sent from now

    types = projected_types()
    return Store(
        database,
        projector=project,
        projected_types=types,
        side_by_side=side_by_side.SideBySide(types),
        in_statement=in_statement,
    )


async def check_readable(database: Database) -> str:
    """The schema revision of a store opened read-only (see `migrate.check_readable`)."""
    try:
        async with database.read() as connection:
            return await connection.run_sync(migrate.check_readable, database.location)
    except DBAPIError as exc:  # a file that is no database, a server that refuses us
        message = (str(exc.orig or exc).strip().splitlines() or [""])[0]
        raise DatabaseUnavailableError(
            f"cannot read the database at {database.location}: {message}"
        ) from None


async def prepare_schema(database: Database, *, upgrade: bool, create: bool = True) -> str | None:
    """Check the schema revision and migrate to head when allowed; returns the revision.

    `create=False`: an empty (or foreign) database is refused, never given the schema."""

    async def work(connection) -> str | None:
        await database.lock_migrations(connection)
        found = await connection.run_sync(migrate.check_revision, upgrade_allowed=upgrade)
        if found is None and not create:
            await connection.run_sync(migrate.check_readable, database.location)
        if upgrade and found != migrate.HEAD_REVISION:
            await connection.run_sync(migrate.upgrade)
        return await connection.run_sync(migrate.current_revision)

    try:
        return await database.run_write(work)
    except (DatabaseUnavailableError, OSError) as exc:
        raise translate_error(exc, database) from None
