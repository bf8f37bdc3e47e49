"""Durable rollouts: a loop's rollout function, each trajectory recorded the moment it returns.

    rollout = artstore.durable_rollouts(store, rollout, run="my-run")   # one line

    for step in range(await model.get_step(), num_steps):
        groups = await art.gather_trajectory_groups(
            (art.TrajectoryGroup(rollout(model, s) for _ in range(8)) for s in batch(step)),
            after_each=artstore.group_recorder(store, run="my-run", model=model, batch=step),
        )
        await backend.train(model, groups)  # backend = artstore.recording_backend(store, ...)

Each call runs the rollout function inside `store.rollout(...)` (so LLM calls made
through `art.langgraph` or artstore's captured clients are recorded too) and records the
`art.Trajectory` it returns whole (`trajectory.recorded`), under a group that is named
by the run, the model's step and the scenario. Run the loop again after a crash and the
calls for that step and scenario get the trajectories that had finished, in any order,
before anything is rolled out again; a group that was sealed is recorded again as it was
(nothing new written), and the recording backend settles a train step the crash
interrupted. So nothing finished is paid for twice, and no group is trained twice.

The scenario is the first argument that is not a model (or `scenario=` says what it is);
it must be JSON (it is stored, and names the group with the step). A rollout function
whose calls for one step repeat a scenario in two different groups should pass `key=`:
what, besides the run and the step, tells the groups apart.
"""

from __future__ import annotations

import asyncio
import functools
import uuid
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, ParamSpec

from sqlalchemy import select

from artstore.arguments import check_callable, check_name, check_store
from artstore.capture.rollout import to_json_value
from artstore.errors import InvalidEventError
from artstore.eventstore.blobs import canonical_json
from artstore.schema import tables as t
from artstore.training.recording import Blobs, stamp, trajectory_event

if TYPE_CHECKING:
    import art

    from artstore.store import Store

P = ParamSpec("P")
_NAMESPACE = uuid.UUID("9b0f2c1e-5a4d-4f3b-8c6e-2d7a1b9e0f31")


def durable_group_id(run: str, step: int | None, key: Any) -> str:
    """The group of a durable rollout: the same run, step and scenario give the same id."""
    return str(uuid.uuid5(_NAMESPACE, canonical_json([run, step, key])))


def _model_of(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    for value in [*args, *kwargs.values()]:
        if hasattr(value, "inference_base_url") and hasattr(value, "project"):
            return value
    raise InvalidEventError(
        "a durable rollout needs the art.Model among the rollout function's arguments "
        "(ART's own signature: rollout(model, scenario))"
    )


def _scenario_of(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    if "scenario" in kwargs:
        return kwargs["scenario"]
    candidates = [*args, *kwargs.values()]
    return next((a for a in candidates if not hasattr(a, "inference_base_url")), None)


class _Finished:
    """Finished rollouts of a group that this process may hand out instead of rolling out."""

    def __init__(self) -> None:
        self.lock = asyncio.Lock()
        self.loaded = False
        self.waiting: list[str] = []


def durable_rollouts(
    store: Store,
    rollout: Callable[P, Awaitable[art.Trajectory]],
    *,
    run: str,
    scenario: Callable[P, Any] | None = None,
    key: Callable[P, Any] | None = None,
) -> Callable[P, Awaitable[art.Trajectory]]:
    """`rollout` made durable (see the module docstring); same signature, same result."""
    check_store(store)
    check_callable("rollout", rollout)
    check_name("run", run)
    for argument, given in (("scenario", scenario), ("key", key)):
        if given is not None:
            check_callable(argument, given)
    groups: dict[str, _Finished] = {}

    async def take_finished(group_id: str) -> str | None:
        found = groups.setdefault(group_id, _Finished())
        async with found.lock:
            if not found.loaded:
                found.waiting = await _reusable(store, group_id)
                found.loaded = True
            return found.waiting.pop(0) if found.waiting else None

    @functools.wraps(rollout)
    async def durable(*args: P.args, **kwargs: P.kwargs) -> art.Trajectory:
        from art.trajectories import Trajectory

        model = _model_of(args, kwargs)
        given = scenario(*args, **kwargs) if scenario else _scenario_of(args, kwargs)
        stored = to_json_value(given)
        try:
            canonical_json(stored)
        except (TypeError, ValueError) as exc:
            raise InvalidEventError(
                f"the scenario ({type(given).__name__}) is not JSON-serializable: {exc}; pass "
                "durable_rollouts(..., scenario=lambda *args, **kwargs: <JSON>)"
            ) from None
        step = await model.get_step() if getattr(model, "trainable", False) else None
        group_id = durable_group_id(
            run, step, to_json_value(key(*args, **kwargs)) if key else stored
        )
        finished = await take_finished(group_id)
        if finished is not None:  # finished before a crash: handed out, not paid for again
            trajectory = (await store.trajectories([finished]))[finished]
            stamp(trajectory, finished, group_id)
            return trajectory
        async with store.rollout(
            model, scenario=stored, run=run, group_id=group_id, policy_step=step
        ) as recorder:
            result = await rollout(*args, **kwargs)
            if not isinstance(result, Trajectory):
                raise InvalidEventError(
                    f"a durable rollout function returns an art.Trajectory, not "
                    f"{type(result).__name__}"
                )
            blobs = Blobs(store.redact)
            event = trajectory_event(result, recorder.id, blobs, f"rollout {recorder.id}")
            recorder.record_event(event, blobs)
        stamp(result, recorder.id, group_id)
        return result

    return durable


async def _reusable(store: Store, group_id: str) -> list[str]:
    """Finished rollouts of `group_id` with a recorded trajectory, unless it was trained."""
    async with store.database.read() as connection:
        consumed = (
            await connection.execute(
                select(t.group_consumptions.c.group_id)
                .where(t.group_consumptions.c.group_id == group_id)
                .limit(1)
            )
        ).first()
        if consumed is not None:
            return []
        ids = (
            (
                await connection.execute(
                    select(t.rollouts.c.rollout_id)
                    .where(t.rollouts.c.group_id == group_id, t.rollouts.c.status == "finished")
                    .order_by(t.rollouts.c.started_at, t.rollouts.c.rollout_id)
                )
            )
            .scalars()
            .all()
        )
        with_trajectory = set(
            (
                await connection.execute(
                    select(t.events.c.stream_id).where(
                        t.events.c.stream_id.in_([f"rollout-{i}" for i in ids]),
                        t.events.c.type == "trajectory.recorded",
                    )
                )
            )
            .scalars()
            .all()
        )
    return [i for i in ids if f"rollout-{i}" in with_trajectory]
