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
before anything is rolled out again. A group that was sealed is final: its calls get its
members, then the failures ART counted in it, raised again (`RolloutFailedBeforeError`),
so it is recorded again as it was (nothing new written), never redone into or copied;
the recording backend settles a train step the crash interrupted. So nothing finished is
paid for twice, no trajectory is recorded twice, and no group is trained twice.
`@art.retry` belongs on the rollout function given here: a retried rollout is then one.
A rollout the crash interrupted is run again as a new rollout that resumes it: the calls
it had made are served back from the store while the agent's requests match them
(`artstore.capture.replay`; `replay_calls=False` to run it again from its first call).

The scenario is the first argument that is not a model (or `scenario=` says what it is);
it must be JSON (it is stored, and names the group with the step). A rollout function
whose calls for one step repeat a scenario in two different groups should pass `key=`:
what, besides the run and the step, tells the groups apart.
"""

from __future__ import annotations

import asyncio
import functools
import uuid
import weakref
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ParamSpec

from sqlalchemy import select

from artstore.arguments import check_callable, check_name, check_store
from artstore.art_api import trajectory_class
from artstore.capture.replay import resumable_attempts
from artstore.capture.rollout import to_json_value
from artstore.errors import InvalidEventError, RolloutFailedBeforeError
from artstore.events import GroupSealed
from artstore.eventstore.blobs import canonical_json
from artstore.groups import sealed_groups
from artstore.projections.imported import load_bodies
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


@dataclass
class _Outcome:
    """What a call is given instead of a rollout: a finished one, or a failure again."""

    rollout_id: str | None = None
    failure: str | None = None


class _DurableGroup:
    """The outcomes of one durable group that this process hands out instead of rolling out.

    Unsealed, the group hands out each rollout that finished before (a crash) once, and
    the calls after that roll out. Sealed, the group is final: each round of calls gets
    its members, then, for each rollout ART counted as failed, that failure again (a
    redo would join a sealed group, and its copy a second group). A call that got a
    failure and comes again from the same task (a retry around the durable function)
    gets the failure again; a call past the round starts the next round.
    """

    def __init__(self, group_id: str) -> None:
        self.group_id = group_id
        self.lock = asyncio.Lock()
        self.waiting: list[_Outcome] = []
        self.known: set[str] = set()  # handed out or rolled out by this process
        # Attempts of an earlier process that did not finish: each is resumed once.
        self.resumable: list[str] | None = None
        self.failed_tasks: weakref.WeakKeyDictionary[asyncio.Task, str] = (
            weakref.WeakKeyDictionary()
        )

    async def take(self, store: Store) -> _Outcome | None:
        """The next outcome to hand out, or None: roll out (see the class docstring)."""
        task = asyncio.current_task()
        async with self.lock:
            if task is not None and task in self.failed_tasks:
                return _Outcome(failure=self.failed_tasks[task])
            if not self.waiting:  # the first call, or past a round: what is stored now
                await self._load(store)
            if not self.waiting:
                return None
            outcome = self.waiting.pop(0)
            if outcome.rollout_id is not None:
                self.known.add(outcome.rollout_id)
            elif task is not None and outcome.failure is not None:
                self.failed_tasks[task] = outcome.failure
            return outcome

    async def resume(self, store: Store) -> str | None:
        """An earlier process's attempt that did not finish, for one new rollout to resume."""
        async with self.lock:
            if self.resumable is None:
                self.resumable = await resumable_attempts(store, self.group_id, self.known)
            return self.resumable.pop(0) if self.resumable else None

    async def _load(self, store: Store) -> None:
        seal = (await sealed_groups(store, [self.group_id])).get(self.group_id)
        if seal is None:
            finished = await _finished_with_trajectory(store, self.group_id)
            self.waiting = [_Outcome(rollout_id=r) for r in finished if r not in self.known]
            return
        failures = await _failures(store, seal)
        self.waiting = [_Outcome(rollout_id=r) for r in seal.rollout_ids]
        self.waiting += [_Outcome(failure=f) for f in failures]


def durable_rollouts(
    store: Store,
    rollout: Callable[P, Awaitable[art.Trajectory]],
    *,
    run: str,
    scenario: Callable[P, Any] | None = None,
    key: Callable[P, Any] | None = None,
    replay_calls: bool = True,
) -> Callable[P, Awaitable[art.Trajectory]]:
    """`rollout` made durable (see the module docstring); same signature, same result.

    A rollout that an earlier process started and left running (it died) is run again as
    a new rollout that resumes it, its recorded calls served back to the agent
    (`artstore.capture.replay`); `replay_calls=False` runs it again from its first call.
    """
    check_store(store)
    check_callable("rollout", rollout)
    check_name("run", run)
    for argument, given in (("scenario", scenario), ("key", key)):
        if given is not None:
            check_callable(argument, given)
    groups: dict[str, _DurableGroup] = {}

    @functools.wraps(rollout)
    async def durable(*args: P.args, **kwargs: P.kwargs) -> art.Trajectory:
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
        group = groups.setdefault(group_id, _DurableGroup(group_id))
        outcome = await group.take(store)
        if outcome is not None and outcome.failure is not None:
            raise RolloutFailedBeforeError(outcome.failure)
        if outcome is not None and outcome.rollout_id is not None:  # not paid for again
            finished = outcome.rollout_id
            trajectory = (await store.trajectories([finished]))[finished]
            stamp(trajectory, finished, group_id)
            return trajectory
        resumes = await group.resume(store) if replay_calls else None
        async with store.rollout(
            model, scenario=stored, run=run, group_id=group_id, policy_step=step, resumes=resumes
        ) as recorder:
            group.known.add(recorder.id)
            result = await rollout(*args, **kwargs)
            if not isinstance(result, trajectory_class()):
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


async def _finished_with_trajectory(store: Store, group_id: str) -> list[str]:
    """Finished rollouts of `group_id` with a recorded trajectory, in start order."""
    async with store.database.read() as connection:
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


async def _failures(store: Store, seal: GroupSealed) -> list[str]:
    """A line for each rollout ART counted as failed in the sealed group (its exceptions)."""
    if seal.art_group is None:
        return []
    async with store.database.read() as connection:
        bodies = await connection.run_sync(load_bodies, [seal.art_group])
    return [
        f"a rollout of group {seal.group_id} failed before the group was sealed "
        f"({exception['type']}: {exception['message']}); the group is final, so it is "
        "not rolled out again"
        for exception in bodies[seal.art_group]["exceptions"]
    ]
