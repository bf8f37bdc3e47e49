"""Runs from any loop: started and finished explicitly, or as soon as something is recorded.

`TrainingFramework` starts and resumes its runs itself. A loop of your own names a run
when it records groups (`artstore.record_group`), trains through the recording backend
(`artstore.recording_backend`) or runs ART's `PipelineTrainer` on the store; the first of these
records `run.started` with what it knows (the model, the scorer). `start_run` and
`finish_run` say more: a configuration, and when the run ended.

Rollouts recorded under a run nobody started (`wrap_rollout(..., run=...)`) make the run
too, in the projections only (status `recorded`), until something starts it.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

from sqlalchemy import select

from artstore.arguments import (
    check_art_model,
    check_json_object,
    check_name,
    check_names,
    check_store,
)
from artstore.art_versions import lineage_name
from artstore.errors import (
    ConfigurationError,
    InvalidArgumentError,
    NotFoundError,
    WrongExpectedVersionError,
)
from artstore.events import RunFinished, RunImported, RunResumed, RunStarted
from artstore.eventstore.records import NO_STREAM
from artstore.schema import tables as t
from artstore.training.lease import trainer_id

if TYPE_CHECKING:
    from artstore.store import Store

DEFAULT_SCORER = "reward"


def run_stream(run: str) -> str:
    return f"run-{run}"


def _started_event(run: str, model: Any, scorer: str, config: dict[str, Any] | None) -> RunStarted:
    if model is None:
        raise ConfigurationError(
            f"run {run!r} has not been started: pass the model (the art.Model whose "
            "rollouts these are), or start it with artstore.start_run(store, run, model=...)"
        )
    return RunStarted(
        run=run,
        project=model.project,
        model=lineage_name(model),
        base_model=getattr(model, "base_model", None),
        config=dict(config or {}),
        scenarios=[],
        scorer=scorer,
        trainer=trainer_id(),
    )


async def _check_not_imported(store: Store, run: str, first: Any) -> None:
    if isinstance(first.decode(), RunImported):
        raise ConfigurationError(
            f"run {run!r} was imported (`artstore import`): record under another run name"
        )


async def start_run(
    store: Store,
    run: str,
    *,
    model: Any,
    scorer: str = DEFAULT_SCORER,
    config: dict[str, Any] | None = None,
) -> bool:
    """Start `run` (its model, scorer and configuration), or resume it; True when resuming.

    `config` is recorded as the run's configuration (JSON: `batch_size` there is how
    `artstore replay` batches the run's groups). A resumed run keeps what it started with.
    """
    check_store(store)
    check_names(run=run, scorer=scorer)
    config = check_json_object("config", config)
    if model is not None:
        check_art_model(model)
    recorded = await store.read_stream(run_stream(run), limit=1)
    if recorded:
        await _check_not_imported(store, run, recorded[0])
        step = await model.get_step() if getattr(model, "trainable", False) else 0
        resumed = RunResumed(run=run, trainer=trainer_id(), at_step=step)
        await store.append(run_stream(run), [resumed])
        return True
    try:
        await store.append(run_stream(run), [_started_event(run, model, scorer, config)], NO_STREAM)
    except WrongExpectedVersionError:  # started meanwhile by another process
        return await start_run(store, run, model=model, scorer=scorer, config=config)
    return False


async def finish_run(store: Store, run: str, *, error: str | BaseException | None = None) -> None:
    """Record that `run` ended: finished, or failed with `error` (a message or an exception)."""
    check_store(store)
    check_name("run", run)
    if error is not None and not isinstance(error, str | BaseException):
        raise InvalidArgumentError(
            "error", f"must be a message (a str) or an exception, not a {type(error).__name__}"
        )
    if not await store.read_stream(run_stream(run), limit=1):
        raise ConfigurationError(f"run {run!r} was never started in this store")
    if isinstance(error, BaseException):
        error = f"{type(error).__name__}: {error}"
    status = "failed" if error is not None else "finished"
    await store.append(run_stream(run), [RunFinished(run=run, status=status, error=error)])


async def ensure_run(store: Store, run: str, *, model: Any, scorer: str | None) -> str:
    """Start `run` unless it was started (or imported, which is refused); its scorer."""
    recorded = await store.read_stream(run_stream(run), limit=1)
    if recorded:
        await _check_not_imported(store, run, recorded[0])
        return scorer or await run_scorer(store, run)
    if model is None and await _has_row(store, run):
        return scorer or await run_scorer(store, run)  # made by its rollouts: keep it so
    with contextlib.suppress(WrongExpectedVersionError):  # started meanwhile elsewhere
        await store.append(
            run_stream(run),
            [_started_event(run, model, scorer or DEFAULT_SCORER, None)],
            NO_STREAM,
        )
    return scorer or await run_scorer(store, run)


async def _has_row(store: Store, run: str) -> bool:
    async with store.database.read() as connection:
        found = await connection.execute(select(t.runs.c.run).where(t.runs.c.run == run))
        return found.first() is not None


async def run_scorer(store: Store, run: str) -> str:
    """The scorer `run` trains on (the default scorer for a run not recorded yet)."""
    async with store.database.read() as connection:
        found = (
            await connection.execute(select(t.runs.c.scorer).where(t.runs.c.run == run))
        ).scalar()
    return found or DEFAULT_SCORER


async def run_info(store: Store, run: str) -> Any:
    """The `runs` row of `run`, or NotFoundError."""
    async with store.database.read() as connection:
        row = (await connection.execute(select(t.runs).where(t.runs.c.run == run))).first()
    if row is None:
        raise NotFoundError(f"no run {run!r} in this store (see `artstore runs`)")
    return row


def model_name(run: Any) -> str:
    """The run's model as "project/name" (its name alone when no project is known)."""
    return f"{run.project}/{run.model}" if run.project else run.model


def own_models(run: Any) -> set[str]:
    """The keys under which the run's own model trains ("project/name")."""
    return {f"{run.project}/{run.model}", run.model}
