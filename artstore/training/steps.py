"""Train steps: feeding sealed groups to `backend.train`, recorded so that none runs twice.

A step is `train_step.started`, ART's `backend.train` then `model.log`, then
`train_step.completed` written in the same transaction as the consumption of its groups
(invariant 4), then the checkpoint push (`checkpoint.pushed`). A crash between
`backend.train` returning and the completion being written is reconciled on the next start
with the backend's own step, and the reconciliation is itself an event (invariant 5); a
push a crash interrupted is done again.
"""

from __future__ import annotations

import math
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

from sqlalchemy import func, select

from artstore import art_versions
from artstore.errors import ArtstoreError
from artstore.events import CheckpointPushed, TrainStepCompleted, TrainStepFailed, TrainStepStarted
from artstore.groups import load_groups
from artstore.redaction import redacting_logger
from artstore.schema import tables as t
from artstore.training.lease import trainer_id

if TYPE_CHECKING:
    import art

    from artstore.store import Store

log = redacting_logger("artstore.training")


class TrainStepError(ArtstoreError):
    """`backend.train` raised; the step was recorded as failed and its groups stay unconsumed."""


class BackendStepError(ArtstoreError):
    """The backend's step is behind the steps the store recorded for the model."""


def model_key(model: Any) -> str:
    """How a trained model is named in the store: "project/<lineage>".

    The lineage is what its checkpoints are kept under: `run_name` on ART >= 0.5.20,
    `name` on 0.5.18 (`artstore.art_versions.lineage_name`).
    """
    return art_versions.model_key(model)


def train_stream(run: str) -> str:
    return f"train-{run}"


async def consumed_groups(store: Store, model: Any, group_ids: Sequence[str]) -> set[str]:
    """Which of `group_ids` were already trained into `model`."""
    found: set[str] = set()
    async with store.database.read() as connection:
        for start in range(0, len(group_ids), 500):
            query = select(t.group_consumptions.c.group_id).where(
                t.group_consumptions.c.model == model_key(model),
                t.group_consumptions.c.group_id.in_(list(group_ids[start : start + 500])),
            )
            found.update(row.group_id for row in await connection.execute(query))
    return found


async def reconcile(store: Store, model: art.TrainableModel) -> str | None:
    """Settle steps of `model` left open by a crash, with the backend's own step.

    Any run's open step counts (a replay into the model may have crashed), and only the
    model's trainer calls this, holding the model's lease. Says what was done. Also
    refuses a backend that is behind what the store recorded (its checkpoints were
    deleted, or it points at another directory): training on would reuse step numbers.
    """
    async with store.database.read() as connection:
        open_steps = (
            await connection.execute(
                select(t.train_steps)
                .where(
                    t.train_steps.c.model == model_key(model),
                    t.train_steps.c.status == "started",
                )
                .order_by(t.train_steps.c.id)
            )
        ).all()
        recorded_step = (
            await connection.execute(
                select(func.max(t.train_steps.c.step)).where(
                    t.train_steps.c.model == model_key(model),
                    t.train_steps.c.status == "completed",
                )
            )
        ).scalar()
    backend_step = await model.get_step()
    if recorded_step is not None and backend_step < recorded_step:
        raise BackendStepError(
            f"{model_key(model)} is at step {backend_step} on its backend, but the store "
            f"recorded step {recorded_step} as trained into it: its checkpoints were deleted "
            "or the backend points at another directory. Use the original backend path, or "
            "train into a new model name."
        )
    notes = []
    for number, open_step in enumerate(open_steps):
        latest = number == len(open_steps) - 1  # steps are sequential: only it can be done
        notes.append(await _settle_open_step(store, model, open_step, backend_step, latest))
    return "; ".join(notes) or None


async def _settle_open_step(
    store: Store, model: Any, open_step: Any, backend_step: int, latest: bool
) -> str:
    group_ids = list(open_step.group_ids)
    stream = train_stream(open_step.run)
    if latest and backend_step > open_step.step_before:
        # backend.train returned (or wrote its checkpoint) but the trainer died before the
        # step was recorded: the groups were trained, record that rather than train again.
        # ART's own history first (the metrics died with the trainer): a crash before the
        # record leaves the step open, and the next start logs it again, then records it;
        # recorded first, a crash in between would leave ART's history without the step.
        await _log_step(model, await load_groups(store, group_ids, open_step.scorer), backend_step)
        await store.append(
            stream,
            [
                TrainStepCompleted(
                    run=open_step.run,
                    model=model_key(model),
                    step=backend_step,
                    group_ids=group_ids,
                    scorer=open_step.scorer,
                    reconciled=True,
                )
            ],
        )
        return (
            f"step {backend_step} of run {open_step.run!r} was trained before a crash but not "
            "recorded; recorded it from the backend's step"
        )
    await store.append(
        stream,
        [
            TrainStepFailed(
                run=open_step.run,
                model=model_key(model),
                step=open_step.step_before,
                group_ids=group_ids,
                error_type="TrainerStopped",
                error_message="the trainer stopped before backend.train returned; "
                "its groups are trained again",
            )
        ],
    )
    return (
        f"step {open_step.step_before + 1} of run {open_step.run!r} was interrupted by a "
        "crash before the backend finished it; its groups are trained again"
    )


async def _log_step(model: Any, groups: list[Any], step: int, metrics: Any = None) -> None:
    try:
        await model.log(groups, metrics=metrics, step=step, split="train")
    except Exception as exc:  # ART's own logging must not undo a recorded step
        log.warning("model.log failed after step %s: %s", step, exc)


async def record_step(
    store: Store,
    *,
    run: str,
    model: art.TrainableModel,
    group_ids: Sequence[str],
    scorer: str,
    train: Callable[[], Awaitable[art.TrainResult]],
    before_completed: Callable[[art.TrainResult], Awaitable[None]] | None = None,
) -> art.TrainResult:
    """One train step: `train_step.started`, `train()`, then `train_step.completed`.

    The completion consumes the groups in its transaction (a group already consumed by
    the model refuses it, invariant 4). If `train()` raises, `train_step.failed` is
    recorded, the groups stay unconsumed, and the exception propagates.
    `before_completed(result)` runs between the two (ART's `model.log`).
    """
    step_before = await model.get_step()
    await store.append(
        train_stream(run),
        [
            TrainStepStarted(
                run=run,
                model=model_key(model),
                step=step_before,
                group_ids=list(group_ids),
                scorer=scorer,
                trainer=trainer_id(),
            )
        ],
    )
    clock = time.monotonic()
    try:
        result = await train()
    except Exception as exc:
        await store.append(
            train_stream(run),
            [
                TrainStepFailed(
                    run=run,
                    model=model_key(model),
                    step=step_before,
                    group_ids=list(group_ids),
                    error_type=type(exc).__name__,
                    error_message=store.redact(str(exc)),
                )
            ],
        )
        raise
    duration_s = time.monotonic() - clock
    if before_completed is not None:
        await before_completed(result)
    checkpoint = getattr(result, "checkpoint_path", None) or getattr(result, "artifact_name", None)
    await store.append(
        train_stream(run),
        [
            TrainStepCompleted(
                run=run,
                model=model_key(model),
                step=result.step,
                group_ids=list(group_ids),
                scorer=scorer,
                metrics=_finite_metrics(result.metrics),
                duration_s=duration_s,
                checkpoint=checkpoint if isinstance(checkpoint, str) else None,
            )
        ],
    )
    return result


def unrecorded_backend(model: Any) -> Any:
    """The model's backend, under the recording backend if it is wrapped in one.

    The training loop and replay record their steps themselves: through the recording
    backend, a step would be recorded twice.
    """
    backend = model.backend()
    return getattr(backend, "unrecorded", backend)


async def train_groups(
    store: Store,
    *,
    run: str,
    model: art.TrainableModel,
    group_ids: Sequence[str],
    scorer: str,
    train_kwargs: dict[str, Any] | None = None,
) -> art.TrainResult:
    """One train step on `group_ids`: recorded, trained, logged, and its checkpoint pushed."""
    groups = await load_groups(store, group_ids, scorer)
    backend = unrecorded_backend(model)

    async def log(result: art.TrainResult) -> None:
        # ART's own history before the record: a crash in between logs the step again
        # on resume (the same parquet file, rewritten) rather than never.
        await _log_step(model, groups, result.step, result.metrics)

    failed: list[int] = []

    async def train() -> art.TrainResult:
        try:
            return await backend.train(model, groups, **(train_kwargs or {}))
        except Exception:
            failed.append(await model.get_step())
            raise

    try:
        result = await record_step(
            store,
            run=run,
            model=model,
            group_ids=group_ids,
            scorer=scorer,
            train=train,
            before_completed=log,
        )
    except Exception as exc:
        if not failed:
            raise
        raise TrainStepError(
            store.redact(
                f"backend.train failed at step {failed[0] + 1} of run {run!r}: "
                f"{type(exc).__name__}: {exc} (the groups stay unconsumed; resume to retry)"
            )
        ) from exc
    await push_checkpoint(store, run=run, model=model, step=result.step)
    return result


def can_push(model: Any) -> bool:
    backend = model.backend()
    return hasattr(backend, "_experimental_push_to_s3") and getattr(backend, "can_push", True)


async def push_checkpoint(store: Store, *, run: str, model: Any, step: int) -> bool:
    """Push the checkpoint as ART's loops do (`_experimental_push_to_s3`) when the backend can."""
    if not can_push(model):
        return False
    try:
        await model.backend()._experimental_push_to_s3(model)
    except Exception as exc:  # a failed upload is retried on resume, not fatal to training
        log.warning("checkpoint push failed at step %s: %s", step, exc)
        return False
    destination = getattr(model.backend(), "push_destination", None)
    await store.append(
        train_stream(run),
        [
            CheckpointPushed(
                run=run,
                model=model_key(model),
                step=step,
                destination=str(destination(model)) if callable(destination) else None,
            )
        ],
    )
    return True


async def push_if_missing(store: Store, run: str, model: Any) -> str | None:
    """After a crash during a push: push the latest completed step that was not pushed.

    Pushing copies the whole model directory, so the latest step covers earlier ones.
    """
    if not can_push(model):
        return None
    query = (
        select(t.train_steps.c.step, t.train_steps.c.pushed_to)
        .where(
            t.train_steps.c.run == run,
            t.train_steps.c.model == model_key(model),
            t.train_steps.c.status == "completed",
        )
        .order_by(t.train_steps.c.id.desc())
        .limit(1)
    )
    async with store.database.read() as connection:
        latest = (await connection.execute(query)).first()
    if latest is None or latest.pushed_to is not None:
        return None
    if await push_checkpoint(store, run=run, model=model, step=latest.step):
        return f"the checkpoint of step {latest.step} had not been pushed; pushed it"
    return None


def _finite_metrics(metrics: dict[str, Any]) -> dict[str, float]:
    return {
        k: float(v)
        for k, v in (metrics or {}).items()
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    }
