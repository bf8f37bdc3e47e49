"""Training from groups that rollout workers make: `TrainingConfig(rollouts="workers")`.

The trainer rolls out nothing. It registers the run for workers (the model's inference
URL and serving name, its step, the off-policy bound, the reward function's import path,
its database's identity) and publishes every group of every epoch as claimable work
(artstore/workers/claims.py). Then, batch by batch as in-process training does, it tells
workers which batch it trains next and at which policy step, waits on the run's
notifications until the batch's groups are sealed, and trains them in one step (recorded
as every step is, so that a crash at any instant is resumed without training a group
twice). Workers meanwhile roll out up to `max_steps_off_policy` batches ahead.

Running the same training again after a crash resumes: registering and publishing are
idempotent, what workers finished meanwhile is kept, and sealed groups are trained.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

from artstore.errors import ArtstoreError, RewardFunctionError, RolloutsFailedError
from artstore.groups import GroupPlace
from artstore.redaction import redact_url
from artstore.training.lease import trainer_id
from artstore.training.recipe import Recipe, RunSummary
from artstore.training.steps import consumed_groups, model_key, train_groups
from artstore.workers import claims
from artstore.workers.claims import GroupPlan
from artstore.workers.notify import Wakeups

if TYPE_CHECKING:
    from artstore.store import Store
    from artstore.training.config import TrainingConfig

log = logging.getLogger("artstore.training")

SAFETY_NET_S = 5.0  # longest wait between two looks without a notification
REPORT_EVERY_S = 60.0  # how often a trainer waiting for workers says so


async def train_from_workers(
    store: Store,
    run: str,
    batches: Sequence[Sequence[GroupPlace]],
    config: TrainingConfig,
    recipe: Recipe,
    summary: RunSummary,
    on_step: Callable[[Sequence[GroupPlace], int, Any], Awaitable[None]] | None = None,
) -> None:
    """Train the run's batches in order from groups sealed by workers.

    `on_step(places, step_before, result)` is awaited after each train step (progress lines).
    """
    model = recipe.model
    database = store.database
    all_ids = [place.group_id for places in batches for place in places]
    consumed = await consumed_groups(store, model, all_ids)
    pending = [places for places in batches if any(p.group_id not in consumed for p in places)]
    next_batch = pending[0][0].batch if pending else (batches[-1][0].batch or 0) + 1
    await claims.register_run(
        database,
        run=run,
        model=model_key(model),
        trainer=trainer_id(),
        models=_inference_settings(recipe),
        reward_function=import_path(recipe.reward_function),
        max_steps_off_policy=config.max_steps_off_policy,
        policy_step=await model.get_step(),
        next_batch=next_batch,
        groups=[_group_plan(place, recipe) for places in batches for place in places],
    )
    try:
        async with Wakeups(database, run) as wakeups:
            for places in pending:
                todo = [p for p in places if p.group_id not in consumed]
                batch = places[0].batch or 0
                await claims.advance(
                    database,
                    run,
                    next_batch=batch,
                    policy_step=await model.get_step(),
                    models=_inference_settings(recipe),
                )
                await _wait_until_sealed(store, wakeups, run, batch, todo)
                before = await model.get_step()
                result = await train_groups(
                    store,
                    run=run,
                    model=model,
                    group_ids=[p.group_id for p in todo],
                    scorer=recipe.scorer,
                    train_kwargs=config.train_kwargs,
                )
                summary.steps_trained.append(result.step)
                if on_step is not None:
                    await on_step(todo, before, result)
            await claims.advance(
                database,
                run,
                next_batch=(batches[-1][0].batch or 0) + 1,
                policy_step=await model.get_step(),
                models=_inference_settings(recipe),
            )
    except Exception as exc:
        try:
            await claims.close_run(database, run, "failed", f"{type(exc).__name__}: {exc}")
        except Exception as close_error:  # never hide the error that stopped training
            log.warning("run %s: could not tell workers it failed: %s", run, close_error)
        raise
    await claims.close_run(database, run, "finished")


async def _wait_until_sealed(
    store: Store, wakeups: Wakeups, run: str, batch: int, places: Sequence[GroupPlace]
) -> None:
    """Return once every group of `places` is sealed; raise if a worker could not seal one."""
    loop = asyncio.get_running_loop()
    reported = loop.time()
    ids = [p.group_id for p in places]
    while True:
        states = await claims.group_states(store.database, ids)
        for place in places:
            state = states.get(place.group_id)
            if state is not None and state.status == "failed":
                raise _group_failure(place, state.error)
        waiting = [g for g in ids if states.get(g) is None or states[g].status != "sealed"]
        if not waiting:
            return
        if loop.time() - reported >= REPORT_EVERY_S:
            reported = loop.time()
            log.info(
                "run %s: waiting for workers to seal %d of the %d groups of batch %d",
                run,
                len(waiting),
                len(ids),
                batch,
            )
        await wakeups.wait(SAFETY_NET_S)


def _group_plan(place: GroupPlace, recipe: Recipe) -> GroupPlan:
    """The group as claimable work: where it belongs, how many rollouts of each role."""
    return GroupPlan(
        group_id=place.group_id,
        epoch=place.epoch or 0,
        batch=place.batch or 0,
        scenario_index=place.scenario_index or 0,
        policy=recipe.group_size,
        validation=recipe.validation_samples,
    )


def _group_failure(place: GroupPlace, error: str | None) -> ArtstoreError:
    kind, _, message = (error or "").partition(": ")
    kinds: dict[str, type[ArtstoreError]] = {
        "RolloutsFailedError": RolloutsFailedError,
        "RewardFunctionError": RewardFunctionError,
    }
    if kind in kinds:
        return kinds[kind](f"{message} (a worker could not seal {place}; resume to retry)")
    return ArtstoreError(f"a worker could not seal {place}: {error}")


def _inference_settings(recipe: Recipe) -> dict[str, Any]:
    """How workers reach each role's model: everything but the API key."""
    settings = {"policy": _model_settings(recipe.model, trainable=True)}
    if recipe.validation_model is not None:
        settings["validation"] = _model_settings(recipe.validation_model, trainable=False)
    return settings


def _model_settings(model: Any, *, trainable: bool) -> dict[str, Any]:
    url = getattr(model, "inference_base_url", None)
    shown = redact_url(url) if url else None
    if trainable and callable(getattr(model, "get_inference_name", None)):
        serving = model.get_inference_name()  # the latest step's name (`name@step` on vLLM)
    else:
        serving = getattr(model, "inference_model_name", None) or model.name
    return {
        "name": model.name,
        "project": getattr(model, "project", None),
        # A URL holding a password or a key is not stored: workers are given it.
        "inference_base_url": url if shown == url else None,
        "url_redacted": shown != url,
        "inference_model_name": serving,
        "needs_api_key": bool(getattr(model, "inference_api_key", None)),
    }


def import_path(function: Any) -> str | None:
    """`module:qualname` when `function` can be imported by that name elsewhere, else None."""
    module = getattr(function, "__module__", None)
    qualname = getattr(function, "__qualname__", None)
    if not module or not qualname or module == "__main__" or "<" in qualname:
        return None
    try:
        found: Any = importlib.import_module(module)
        for part in qualname.split("."):
            found = getattr(found, part)
    except (ImportError, AttributeError):
        return None
    return f"{module}:{qualname}" if found is function else None
