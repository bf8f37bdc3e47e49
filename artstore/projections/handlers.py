"""One handler per event type, writing the projection tables in the appending transaction.

The events a run records by the thousand (rollouts, calls, rewards, seals) are projected
in bulk by `artstore.projections.bulk`; this module handles the others, one by one.

Handlers are synchronous SQLAlchemy Core: the event store runs a whole write transaction
in one call (on SQLite, in its writer thread; on PostgreSQL through `run_sync`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from sqlalchemy import delete, select, update
from sqlalchemy.engine import Connection

from artstore.errors import GroupAlreadyConsumedError
from artstore.events import (
    CheckpointPushed,
    Event,
    Feedback,
    RewardsRecorded,
    RolloutFailed,
    RunFinished,
    RunImported,
    RunResumed,
    RunStarted,
    TrainStepCompleted,
    TrainStepFailed,
    TrainStepStarted,
)
from artstore.eventstore.records import RecordedEvent, recorded_from_row
from artstore.projections import rollout_rewards, trained
from artstore.projections.bulk import (
    BULK_TYPES,
    BulkProjection,
    implicit_run,
    next_id,
    storable_json,
)
from artstore.projections.checkpoints import CHECKPOINT_HANDLERS
from artstore.schema import tables as t

Handler = Callable[[Connection, Any, RecordedEvent], None]

HANDLERS: dict[str, Handler] = {**CHECKPOINT_HANDLERS}


def handles(event_class: type[Event]):
    def register(handler: Handler) -> Handler:
        HANDLERS[event_class.type] = handler
        return handler

    return register


def project(
    connection: Connection,
    recorded: list[RecordedEvent],
    blobs: Mapping[str, str] | None = None,
    *,
    whole_transaction: bool = True,
) -> None:
    """Apply each event to the projection tables (events without a handler are skipped).

    `recorded`: the events an append's transaction wrote, unless `whole_transaction` is
    False (a page of a rebuild, whose rollouts may go on in the next page). `blobs`: the
    texts that transaction's appends carried, by hash, read from memory where they are
    needed instead of from the database.
    """
    bulk = (
        BulkProjection.for_batch(connection, recorded, blobs or {})
        if whole_transaction
        else BulkProjection(connection)
    )
    for event in recorded:
        if event.type in BULK_TYPES:
            bulk.add(event.decode(), event)
            continue
        handler = HANDLERS.get(event.type)
        if handler is not None:
            bulk.flush()  # the handler may read what the bulk events wrote
            handler(connection, event.decode(), event)
    bulk.flush()


def projected_types() -> frozenset[str]:
    """The event types `project` writes anything for (others it skips)."""
    return BULK_TYPES | frozenset(HANDLERS)


def rebuild(connection: Connection, page_size: int = 2000) -> int:
    """Empty every projection table and replay the whole event log into them.

    The caller holds appenders off meanwhile (`Database.lock_appends`).
    """
    for table in reversed(t.PROJECTION_TABLES):
        connection.execute(delete(table))
    after, count = 0, 0
    while True:
        rows = (
            connection.execute(
                select(t.events)
                .where(t.events.c.position > after)
                .order_by(t.events.c.position)
                .limit(page_size)
            )
        ).all()
        if not rows:
            return count
        page = [recorded_from_row(row) for row in rows]
        project(connection, page, whole_transaction=False)
        after, count = page[-1].position, count + len(page)


# --- runs -------------------------------------------------------------------------------


@handles(RunStarted)
def _run_started(c: Connection, e: RunStarted, r: RecordedEvent) -> None:
    values = {
        "project": e.project,
        "model": e.model,
        "base_model": e.base_model,
        "validation_model": e.validation_model,
        "scorer": e.scorer,
        "status": "running",
        "config": e.config,
        "num_scenarios": len(e.scenarios),
        "trainer": e.trainer,
    }
    # A run some rollouts, groups or steps were recorded under before it was started
    # has a row already (`implicit_run`): the start says what the run is.
    found = c.execute(update(t.runs).where(t.runs.c.run == e.run).values(**values)).rowcount
    if not found:
        c.execute(t.runs.insert().values(run=e.run, started_at=r.recorded_at, **values))
    rollout_rewards.refresh_run_rewards(c, e.run)  # by this scorer now


@handles(RunResumed)
def _run_resumed(c: Connection, e: RunResumed, r: RecordedEvent) -> None:
    changes: dict[str, Any] = {"status": "running", "trainer": e.trainer}
    if e.config is not None:  # resumed with more epochs: the run's configuration now
        changes["config"] = e.config
    c.execute(
        update(t.runs).where(t.runs.c.run == e.run).values(**changes, finished_at=None, error=None)
    )


@handles(RunFinished)
def _run_finished(c: Connection, e: RunFinished, r: RecordedEvent) -> None:
    c.execute(
        update(t.runs)
        .where(t.runs.c.run == e.run)
        .values(status=e.status, error=e.error, finished_at=r.recorded_at)
    )


# --- rollouts ---------------------------------------------------------------------------


@handles(RolloutFailed)
def _rollout_failed(c: Connection, e: RolloutFailed, r: RecordedEvent) -> None:
    c.execute(
        update(t.rollouts)
        .where(t.rollouts.c.rollout_id == e.rollout_id)
        .values(
            status="failed",
            error_type=e.error_type,
            error_message=e.error_message,
            finished_at=r.recorded_at,
            duration_s=e.duration_s,
        )
    )


# --- groups and rewards -----------------------------------------------------------------


# --- training ---------------------------------------------------------------------------


@handles(TrainStepStarted)
def _train_step_started(c: Connection, e: TrainStepStarted, r: RecordedEvent) -> None:
    implicit_run(c, e.run, e.model, r.recorded_at)
    inserted = c.execute(
        t.train_steps.insert().values(
            id=next_id(c, t.train_steps),
            run=e.run,
            model=e.model,
            step_before=e.step,
            status="started",
            scorer=e.scorer,
            group_ids=e.group_ids,
            num_groups=len(e.group_ids),
            reconciled=False,
            started_at=r.recorded_at,
        )
    )
    _new_step(c, inserted.inserted_primary_key[0], e.group_ids)


def _new_step(c: Connection, step_id: int, group_ids: list[str]) -> None:
    trained.add_step_groups(c, step_id, group_ids)
    trained.refresh_trained(c, [step_id])


def _open_step_id(c: Connection, run: str, model: str) -> int | None:
    return (
        c.execute(
            select(t.train_steps.c.id)
            .where(
                t.train_steps.c.run == run,
                t.train_steps.c.model == model,
                t.train_steps.c.status == "started",
            )
            .order_by(t.train_steps.c.id.desc())
            .limit(1)
        )
    ).scalar()


@handles(TrainStepCompleted)
def _train_step_completed(c: Connection, e: TrainStepCompleted, r: RecordedEvent) -> None:
    already = (
        c.execute(
            select(t.group_consumptions.c.group_id, t.group_consumptions.c.step).where(
                t.group_consumptions.c.model == e.model,
                t.group_consumptions.c.group_id.in_(e.group_ids),
            )
        )
    ).all()
    if already:
        raise GroupAlreadyConsumedError(
            f"group {already[0].group_id} was already trained into {e.model} at step "
            f"{already[0].step}; this train step was not recorded"
        )
    values = {
        "step": e.step,
        "status": "completed",
        "metrics": storable_json(e.metrics),
        "checkpoint": e.checkpoint,
        "reconciled": e.reconciled,
        "finished_at": r.recorded_at,
        "duration_s": e.duration_s,
    }
    implicit_run(c, e.run, e.model, r.recorded_at)
    step_id = _open_step_id(c, e.run, e.model)
    if step_id is None:  # reconciled after a crash, or recorded by a replay of its own
        inserted = c.execute(
            t.train_steps.insert().values(
                id=next_id(c, t.train_steps),
                run=e.run,
                model=e.model,
                step_before=e.step - 1,
                scorer=e.scorer,
                group_ids=e.group_ids,
                num_groups=len(e.group_ids),
                **values,
            )
        )
        _new_step(c, inserted.inserted_primary_key[0], e.group_ids)
    else:  # its groups and scorer are the started step's: what it trained is summed
        c.execute(update(t.train_steps).where(t.train_steps.c.id == step_id).values(values))
    c.execute(
        t.group_consumptions.insert(),
        [
            {
                "group_id": group_id,
                "model": e.model,
                "run": e.run,
                "step": e.step,
                "scorer": e.scorer,
                "consumed_at": r.recorded_at,
                "position": r.position,
            }
            for group_id in e.group_ids
        ],
    )


@handles(TrainStepFailed)
def _train_step_failed(c: Connection, e: TrainStepFailed, r: RecordedEvent) -> None:
    step_id = _open_step_id(c, e.run, e.model)
    if step_id is not None:
        c.execute(
            update(t.train_steps)
            .where(t.train_steps.c.id == step_id)
            .values(
                status="failed",
                error_type=e.error_type,
                error_message=e.error_message,
                finished_at=r.recorded_at,
            )
        )


@handles(CheckpointPushed)
def _checkpoint_pushed(c: Connection, e: CheckpointPushed, r: RecordedEvent) -> None:
    c.execute(
        update(t.train_steps)
        .where(
            t.train_steps.c.run == e.run,
            t.train_steps.c.model == e.model,
            t.train_steps.c.step == e.step,
        )
        .values(pushed_to=e.destination or "pushed")
    )


# --- imports (`artstore import`) ----------------------------------------------------------
# (Each rollout's `trajectory.imported` is projected in bulk: artstore.projections.bulk.)


@handles(RunImported)
def _run_imported(c: Connection, e: RunImported, r: RecordedEvent) -> None:
    if (c.execute(select(t.runs.c.run).where(t.runs.c.run == e.run))).first() is None:
        c.execute(
            t.runs.insert().values(
                run=e.run,
                project=e.project,
                model=e.model,
                base_model=e.base_model,
                validation_model=e.validation_model,
                scorer=e.scorer,
                status="imported",
                config=e.config,
                num_scenarios=0,
                started_at=r.recorded_at,
                finished_at=r.recorded_at,
            )
        )
        rollout_rewards.refresh_run_rewards(c, e.run)


# --- feedback (`store.feedback`, `artstore feedback`) ----------------------------------------


def human_scorer(name: str) -> str:
    """The scorer a person's scores are rewards of."""
    return f"human:{name}"


@handles(Feedback)
def _feedback(c: Connection, e: Feedback, r: RecordedEvent) -> None:
    # A score of the whole rollout is a reward like any scorer's, projected as one: the
    # views, replay and datasets read it without knowing a person gave it.
    if e.score is None or e.call_index is not None or e.group_id is None:
        return
    bulk = BulkProjection(c)
    reward = RewardsRecorded(
        group_id=e.group_id, scorer=human_scorer(e.name), rewards={e.rollout_id: e.score}
    )
    bulk.add(reward, r)
    bulk.flush()
