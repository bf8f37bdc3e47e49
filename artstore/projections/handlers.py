"""One handler per event type, writing the projection tables in the appending transaction.

Handlers are synchronous SQLAlchemy Core: the event store runs a whole write transaction
in one call (on SQLite, in its writer thread; on PostgreSQL through `run_sync`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sqlalchemy import delete, select, update
from sqlalchemy.engine import Connection

from artstore.errors import GroupAlreadyConsumedError
from artstore.events import (
    CheckpointPushed,
    Event,
    GroupSealed,
    LLMCall,
    RewardsRecorded,
    RolloutFailed,
    RolloutFinished,
    RolloutStarted,
    RunFinished,
    RunImported,
    RunResumed,
    RunStarted,
    TrainStepCompleted,
    TrainStepFailed,
    TrainStepStarted,
    TrajectoryImported,
    TrajectoryRecorded,
)
from artstore.eventstore.store import RecordedEvent, recorded_from_row
from artstore.projections.imported import blob_hashes, imported_message_rows, load_bodies
from artstore.projections.recorded import recorded_blob_hashes
from artstore.projections.trajectories import load_calls, message_rows
from artstore.schema import tables as t

Handler = Callable[[Connection, Any, RecordedEvent], None]

# PostgreSQL's json functions cannot read a text holding NUL (\u0000): `tool_calls` ->>
# 'name' would fail for the whole view. The JSON the views take apart (tool calls, train
# metrics) is projected with NUL as U+FFFD, as text columns are (`ProjectedText`); the
# events keep it, and so do the JSON columns the views only pass through.


def without_nul(value: Any) -> Any:
    """`value` (JSON) with NUL replaced in every string, keys included."""
    if isinstance(value, str):
        return value.replace("\x00", t.REPLACEMENT_CHARACTER) if "\x00" in value else value
    if isinstance(value, list):
        return [without_nul(item) for item in value]
    if isinstance(value, dict):
        return {without_nul(key): without_nul(item) for key, item in value.items()}
    return value


HANDLERS: dict[str, Handler] = {}


def handles(event_class: type[Event]):
    def register(handler: Handler) -> Handler:
        HANDLERS[event_class.type] = handler
        return handler

    return register


def project(connection: Connection, recorded: list[RecordedEvent]) -> None:
    """Apply each event to the projection tables (events without a handler are skipped)."""
    for event in recorded:
        handler = HANDLERS.get(event.type)
        if handler is not None:
            handler(connection, event.decode(), event)


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
        project(connection, page)
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
    # has a row already (`_implicit_run`): the start says what the run is.
    found = c.execute(update(t.runs).where(t.runs.c.run == e.run).values(**values)).rowcount
    if not found:
        c.execute(t.runs.insert().values(run=e.run, started_at=r.recorded_at, **values))


def _implicit_run(c: Connection, run: str | None, model: str | None, at: Any) -> None:
    """A run exists as soon as anything is recorded under its name.

    Rollouts, groups and train steps recorded under a run nobody started (a loop of its
    own, `wrap_rollout(..., run=...)`) make a row with what they say: the model
    ("project/name" for a train step, the model's name for a rollout), status `recorded`,
    the default scorer `reward`, and no configuration. `run.started` completes it.
    """
    if run is None or c.execute(select(t.runs.c.run).where(t.runs.c.run == run)).first():
        return
    project, _, name = (model or "").rpartition("/")
    c.execute(
        t.runs.insert().values(
            run=run,
            project=project,
            model=name or run,
            scorer="reward",
            status="recorded",
            config={},
            num_scenarios=0,
            started_at=at,
        )
    )


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


@handles(RolloutStarted)
def _rollout_started(c: Connection, e: RolloutStarted, r: RecordedEvent) -> None:
    if e.role == "policy":
        _implicit_run(c, e.run, e.model, r.recorded_at)
    c.execute(
        t.rollouts.insert().values(
            rollout_id=e.rollout_id,
            run=e.run,
            group_id=e.group_id,
            scenario_index=e.scenario_index,
            scenario=e.scenario,
            model=e.model,
            role=e.role,
            policy_step=e.policy_step,
            status="running",
            num_llm_calls=0,
            started_at=e.started_at,
            imported=False,
        )
    )


@handles(LLMCall)
def _llm_call(c: Connection, e: LLMCall, r: RecordedEvent) -> None:
    rollout_id = r.stream_id.removeprefix("rollout-")
    prompt, completion = e.prompt_tokens, e.completion_tokens
    if e.supersedes is not None:  # the same call, recorded again: one row per real call
        c.execute(delete(t.llm_calls).where(t.llm_calls.c.call_id == e.supersedes))
    c.execute(
        t.llm_calls.insert().values(
            call_id=e.call_id,
            rollout_id=rollout_id,
            call_index=e.index,
            model=e.model,
            prompt_tokens=prompt,
            completion_tokens=completion,
            total_tokens=None if prompt is None or completion is None else prompt + completion,
            latency_s=e.latency_s,
            finish_reason=e.finish_reason,
            num_input_messages=len(e.input),
            tool_calls=without_nul(
                [{"name": tc["name"], "args": tc.get("args")} for tc in e.tool_calls]
            )
            or None,
            has_logprobs=e.num_logprobs > 0,
            error_type=e.error_type,
            error_message=e.error_message,
            started_at=e.started_at,
            position=r.position,
            source=e.source,
            endpoint=e.endpoint,
            streamed=e.stream,
            art_exchange=e.art_exchange,
        )
    )
    if e.supersedes is None:
        c.execute(
            update(t.rollouts)
            .where(t.rollouts.c.rollout_id == rollout_id)
            .values(num_llm_calls=t.rollouts.c.num_llm_calls + 1)
        )


@handles(RolloutFinished)
def _rollout_finished(c: Connection, e: RolloutFinished, r: RecordedEvent) -> None:
    c.execute(
        update(t.rollouts)
        .where(t.rollouts.c.rollout_id == e.rollout_id)
        .values(
            status="finished", result=e.result, finished_at=r.recorded_at, duration_s=e.duration_s
        )
    )
    _project_trajectory_messages(c, e.rollout_id)


def _project_trajectory_messages(c: Connection, rollout_id: str) -> None:
    recorded = _recorded_trajectory(c, rollout_id)
    if recorded is not None:  # the loop's own trajectory, not one rebuilt from its calls
        rows = imported_message_rows(recorded, load_bodies(c, recorded_blob_hashes([recorded])))
    else:
        calls = (load_calls(c, [rollout_id]))[rollout_id]
        rows = message_rows(rollout_id, calls.conversations())
    if rows:
        c.execute(t.trajectory_messages.insert(), _nul_free_tool_calls(rows))


def _nul_free_tool_calls(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{**row, "tool_calls": without_nul(row.get("tool_calls"))} for row in rows]


def _recorded_trajectory(c: Connection, rollout_id: str) -> TrajectoryRecorded | None:
    row = c.execute(
        select(t.events)
        .where(
            t.events.c.stream_id == f"rollout-{rollout_id}",
            t.events.c.type == TrajectoryRecorded.type,
        )
        .order_by(t.events.c.version.desc())
        .limit(1)
    ).first()
    return None if row is None else recorded_from_row(row).decode()  # type: ignore[return-value]


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


@handles(GroupSealed)
def _group_sealed(c: Connection, e: GroupSealed, r: RecordedEvent) -> None:
    members = [*e.rollout_ids, *e.validation_rollout_ids, *e.failed_rollout_ids]
    first = c.execute(
        select(t.rollouts.c.model).where(t.rollouts.c.rollout_id.in_(members[:1]))
    ).scalar()
    _implicit_run(c, e.run, first, r.recorded_at)
    # Rollouts recorded outside any group (`wrap_rollout`) belong to the group that
    # sealed them, and to its run.
    for column, value in (("group_id", e.group_id), ("run", e.run)):
        if value is not None:
            c.execute(
                update(t.rollouts)
                .where(t.rollouts.c.rollout_id.in_(members), t.rollouts.c[column].is_(None))
                .values({column: value})
            )
    c.execute(
        t.groups.insert().values(
            group_id=e.group_id,
            run=e.run,
            epoch=e.epoch,
            batch=e.batch,
            scenario_index=e.scenario_index,
            size=len(e.rollout_ids),
            num_validation=len(e.validation_rollout_ids),
            num_failed=len(e.failed_rollout_ids),
            sealed_at=r.recorded_at,
            position=r.position,
        )
    )


@handles(RewardsRecorded)
def _rewards_recorded(c: Connection, e: RewardsRecorded, r: RecordedEvent) -> None:
    rows = [
        {
            "rollout_id": rollout_id,
            "group_id": e.group_id,
            "scorer": e.scorer,
            "reward": reward,
            "metrics": e.metrics.get(rollout_id),
            "rescored": e.rescored,
            "recorded_at": r.recorded_at,
            "position": r.position,
        }
        for rollout_id, reward in e.rewards.items()
    ]
    if rows:
        c.execute(t.rewards.insert(), rows)


# --- training ---------------------------------------------------------------------------


@handles(TrainStepStarted)
def _train_step_started(c: Connection, e: TrainStepStarted, r: RecordedEvent) -> None:
    _implicit_run(c, e.run, e.model, r.recorded_at)
    c.execute(
        t.train_steps.insert().values(
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
        "metrics": without_nul(e.metrics),
        "checkpoint": e.checkpoint,
        "reconciled": e.reconciled,
        "finished_at": r.recorded_at,
        "duration_s": e.duration_s,
    }
    _implicit_run(c, e.run, e.model, r.recorded_at)
    step_id = _open_step_id(c, e.run, e.model)
    if step_id is None:  # reconciled after a crash, or recorded by a replay of its own
        c.execute(
            t.train_steps.insert().values(
                run=e.run,
                model=e.model,
                step_before=e.step - 1,
                scorer=e.scorer,
                group_ids=e.group_ids,
                num_groups=len(e.group_ids),
                **values,
            )
        )
    else:
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


@handles(TrajectoryImported)
def _trajectory_imported(c: Connection, e: TrajectoryImported, r: RecordedEvent) -> None:
    # Follows the rollout's end: messages are projected for a finished rollout only, as
    # `_rollout_finished` does for a recorded one.
    status = (
        c.execute(
            update(t.rollouts)
            .where(t.rollouts.c.rollout_id == e.rollout_id)
            .values(imported=True)
            .returning(t.rollouts.c.status)
        )
    ).scalar()
    rows = imported_message_rows(e, load_bodies(c, blob_hashes([e])))
    if rows and status == "finished":
        c.execute(t.trajectory_messages.insert(), _nul_free_tool_calls(rows))
