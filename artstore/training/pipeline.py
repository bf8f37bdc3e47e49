"""ART's `PipelineTrainer` (ART >= 0.5.20) on the store: no finished or queued group lost.

    trainer = artstore.pipeline_trainer(
        store,
        run="pipe-1", model=model, backend=backend, rollout_fn=rollout_fn,
        scenarios=scenarios, config=config, max_steps_off_policy=4,   # PipelineTrainer's
    )
    await trainer.train()

ART's pipeline rolls out groups in workers, queues them, and trains batches of them while
new rollouts go on. Its own resume (`model.read_state()`) keeps counters: the number of
scenarios pulled, so after a crash the groups that were queued or being rolled out are
skipped, never trained. Here the store is the memory, through three public seams of
`PipelineTrainer` and no change to ART's loop:

- its backend is the recording backend (`artstore.recording_backend`): every train call is a train
  step that consumes its groups exactly once per model, settled after a crash;
- its rollout function is wrapped: each group is recorded (sealed, rewards under the
  run's scorer) the moment the rollout function returns it, before it is queued, with
  the LLM calls it made, each in the rollout of its trajectory (`artstore.capture.group`;
  those of no trajectory, a rollout that raised, in a rollout of the group that failed);
- its scenarios come from the store: first the scenarios whose groups were recorded
  and not trained (their stored groups are handed to the queue again, not rolled out),
  then the scenarios never finished, by their position in the iterable. ART's own
  scenario counter is not used (`resume=False`).

A stored group that ART would discard on arrival is not fed again: one that is too old
for `max_steps_off_policy` at the step the run resumes at, or one without reward spread
(it stays in the store, unconsumed, for `artstore replay`). The trainer is ART's own
class; the subclass only makes ART's LocalBackend check optional where LocalBackend
cannot be imported (it needs torch), and records the run's end.
"""

from __future__ import annotations

import uuid
from collections import deque
from collections.abc import AsyncIterator, Iterable
from typing import TYPE_CHECKING, Any

from sqlalchemy import select

from artstore.arguments import check_name, check_store
from artstore.art_api import art_module, local_backend_importable, trajectory_group_class
from artstore.art_versions import has_pipeline_trainer, rewards_have_zero_variance
from artstore.capture.group import GroupCalls, GroupCapture, capture_group
from artstore.capture.rollout import to_json_value
from artstore.errors import ConfigurationError
from artstore.groups import load_groups
from artstore.schema import tables as t
from artstore.training.backend import RecordingBackend, recording_backend
from artstore.training.recording import record_group_with_calls, record_unattributed_calls
from artstore.training.runs import finish_run, run_scorer, start_run
from artstore.training.steps import consumed_groups

if TYPE_CHECKING:
    import art

    from artstore.store import Store

_NAMESPACE = uuid.UUID("1c7e3f55-0b8a-4d2e-9f61-5a3c8e7d2b04")


def pipeline_group_id(run: str, scenario_index: int) -> str:
    """The group of the scenario at `scenario_index` of a pipeline run."""
    return str(uuid.uuid5(_NAMESPACE, f"{run}\x00{scenario_index}"))


class _Feed:
    """The scenarios the pipeline pulls: unconsumed stored groups first, then the rest."""

    def __init__(
        self,
        store: Store,
        run: str,
        model: Any,
        backend: RecordingBackend,
        scenarios: Iterable[Any] | AsyncIterator[Any],
        scorer: str | None,
        config: dict[str, Any],
    ) -> None:
        self.store, self.run, self.model, self.backend = store, run, model, backend
        self.scenarios, self.scorer, self.config = scenarios, scorer, config
        self.trainer: Any = None
        self.stored: dict[str, art.TrajectoryGroup] = {}  # handed to the queue as they are
        self._indexes: dict[int, tuple[Any, deque[int]]] = {}  # id(scenario) -> indexes
        self._scenarios = self._generate()

    def __aiter__(self) -> _Feed:
        return self

    async def __anext__(self) -> Any:
        return await self._scenarios.__anext__()

    def index_of(self, scenario: Any) -> int:
        """The position of `scenario` in the run (what names its group)."""
        _, indexes = self._indexes[id(scenario)]
        index = indexes.popleft()
        if not indexes:
            del self._indexes[id(scenario)]
        return index

    def _hand_out(self, scenario: Any, index: int) -> Any:
        self._indexes.setdefault(id(scenario), (scenario, deque()))[1].append(index)
        return scenario

    async def _generate(self) -> AsyncIterator[Any]:
        await self.backend.settle(self.model)  # the model, and a step a crash left open
        await start_run(
            self.store,
            self.run,
            model=self.model,
            scorer=self.scorer or await run_scorer(self.store, self.run),
            config=self.config,
        )
        self.scorer = self.scorer or await run_scorer(self.store, self.run)
        recorded = await self._recorded()
        step = await self.model.get_step()
        for index, group in await self._to_train_again(recorded, step):
            self.stored[pipeline_group_id(self.run, index)] = group
            yield self._hand_out(await self._scenario(group), index)
        index = -1
        async for scenario in _iterate(self.scenarios):
            index += 1
            if index not in recorded:
                yield self._hand_out(scenario, index)

    async def _recorded(self) -> dict[int, str]:
        """Scenario index -> group id of the groups this pipeline run recorded."""
        async with self.store.database.read() as connection:
            rows = await connection.execute(
                select(t.groups.c.group_id, t.groups.c.scenario_index).where(
                    t.groups.c.run == self.run, t.groups.c.scenario_index.is_not(None)
                )
            )
            return {
                row.scenario_index: row.group_id
                for row in rows
                if row.group_id == pipeline_group_id(self.run, row.scenario_index)
            }

    async def _to_train_again(
        self, recorded: dict[int, str], step: int
    ) -> list[tuple[int, art.TrajectoryGroup]]:
        consumed = await consumed_groups(self.store, self.model, list(recorded.values()))
        waiting = sorted((i, g) for i, g in recorded.items() if g not in consumed)
        groups = await load_groups(self.store, [g for _, g in waiting], self.scorer)
        bound = getattr(self.trainer, "max_steps_off_policy", None)
        again = []
        for (index, _), group in zip(waiting, groups, strict=True):
            versions = [
                t.initial_policy_version
                for t in group.trajectories
                if t.initial_policy_version is not None
            ]
            if bound is not None and versions and min(versions) < step - bound:
                continue  # ART would discard it as stale
            if rewards_have_zero_variance([t.reward for t in group.trajectories]):
                continue  # ART would discard it: nothing to learn
            again.append((index, group))
        return again

    async def _scenario(self, group: art.TrajectoryGroup) -> Any:
        rollout_id = group.trajectories[0].metadata["artstore_rollout_id"]
        async with self.store.database.read() as connection:
            return (
                await connection.execute(
                    select(t.rollouts.c.scenario).where(t.rollouts.c.rollout_id == rollout_id)
                )
            ).scalar()


async def _iterate(scenarios: Iterable[Any] | AsyncIterator[Any]) -> AsyncIterator[Any]:
    if hasattr(scenarios, "__aiter__"):
        async for scenario in scenarios:  # type: ignore[union-attr]
            yield scenario
        return
    for scenario in scenarios:  # type: ignore[union-attr]
        yield scenario


def _recording_rollout_fn(feed: _Feed, rollout_fn: Any) -> Any:
    async def rollout(model: Any, scenario: Any, config: Any) -> Any:
        index = feed.index_of(scenario)
        group_id = pipeline_group_id(feed.run, index)
        stored = feed.stored.pop(group_id, None)
        if stored is not None:  # recorded before a crash and never trained
            return stored
        initial = feed.trainer.state.policy_version
        where = {
            "run": feed.run,
            "group_id": group_id,
            "scenario": to_json_value(scenario),
            "scenario_index": index,
        }
        group, calls = await _rolled_out(feed, rollout_fn, (model, scenario, config), where)
        if calls.unattributed:
            await record_unattributed_calls(
                feed.store, calls.unattributed, model=model, policy_step=initial, **where
            )
        if not isinstance(group, trajectory_group_class()) or not group.trajectories:
            return group  # nothing to keep: ART discards it, a restart rolls it out again
        _as_art_would(group, initial, feed.trainer.state.policy_version)
        await record_group_with_calls(
            feed.store, group, calls, model=model, scorer=feed.scorer, **where
        )
        return group

    return rollout


async def _rolled_out(
    feed: _Feed, rollout_fn: Any, args: tuple[Any, Any, Any], where: dict[str, Any]
) -> tuple[Any, GroupCalls]:
    """The group `rollout_fn` returns, and its LLM calls, each given to its trajectory.

    When `rollout_fn` raises, the calls it made are recorded (as rollouts of the group
    that failed, with its exception) before the exception goes on to ART.
    """
    model = args[0]
    captured: GroupCapture | None = None
    try:
        async with capture_group(model) as captured:
            group = await rollout_fn(*args)
    except Exception as exc:
        if captured is not None and captured.calls:
            await record_unattributed_calls(
                feed.store,
                captured.attribute([]).unattributed,
                model=model,
                policy_step=feed.trainer.state.policy_version,
                error=exc,
                **where,
            )
        raise
    trajectories = getattr(group, "trajectories", None) or []
    return group, captured.attribute(trajectories)


def _as_art_would(group: art.TrajectoryGroup, initial: int, final: int) -> None:
    """What PipelineTrainer does to a group once the rollout function returned it."""
    record_completion_tokens = art_module("gather").record_trajectory_completion_tokens
    for trajectory in group.trajectories:
        record_completion_tokens(trajectory)
        if trajectory.initial_policy_version is None:
            trajectory.initial_policy_version = initial
        if trajectory.final_policy_version is None:
            trajectory.final_policy_version = final


def pipeline_trainer(
    store: Store,
    *,
    run: str,
    model: art.TrainableModel,
    backend: Any,
    rollout_fn: Any,
    scenarios: Iterable[Any] | AsyncIterator[Any],
    config: Any = None,
    scorer: str | None = None,
    **options: Any,
) -> Any:
    """ART's `PipelineTrainer`, durable on `store` (see the module docstring).

    `model` must be registered with `backend` (wrapped here, or already the recording
    backend); `options` are PipelineTrainer's own (pipeline, learning_rate, max_steps,
    max_steps_off_policy, eval_fn...), except `resume`: the store resumes the run.
    """
    check_store(store)
    check_name("run", run)
    check_name("scorer", scorer, optional=True)
    if not has_pipeline_trainer():
        raise ConfigurationError(
            "ART's PipelineTrainer needs openpipe-art 0.5.20 or newer (Python 3.12+)"
        )
    if options.pop("resume", False):
        raise ConfigurationError(
            "resume=True would skip the scenarios ART counted as pulled, queued and "
            "in-flight groups included: the store resumes the run (leave resume out)"
        )
    recording = (
        backend
        if issubclass(type(backend), RecordingBackend)
        else recording_backend(store, backend, run=run, scorer=scorer)
    )
    if model._backend is not recording:
        model._backend = recording  # registered already: only the wrapper is new
    settings = {
        k: to_json_value(v)
        for k, v in options.items()
        if isinstance(v, (int, float, str, bool)) or hasattr(v, "model_dump")
    }
    train_kwargs = {"learning_rate": options.get("learning_rate", 1e-5)}
    feed = _Feed(
        store,
        run,
        model,
        recording,
        scenarios,
        scorer,
        {"trainer": "PipelineTrainer", "pipeline": settings, "train_kwargs": train_kwargs},
    )
    trainer = _durable_trainer_class()(
        model,
        recording,
        _recording_rollout_fn(feed, rollout_fn),
        feed,
        config,
        resume=False,
        **options,
    )
    # A wrapper made here is the trainer's own: its leases end with `train()` (the user
    # closes the backend they passed in, not this wrapper).
    trainer._artstore = (store, run, recording if recording is not backend else None)
    feed.trainer = trainer
    return trainer


def _durable_trainer_class() -> type:
    class DurablePipelineTrainer(art_module("pipeline_trainer").PipelineTrainer):
        """ART's PipelineTrainer; the run's end is recorded in the store."""

        async def train(self, *, handle_signals: bool = True) -> None:
            store, run, own_wrapper = self._artstore
            try:
                try:
                    await super().train(handle_signals=handle_signals)
                except BaseException as exc:
                    await finish_run(store, run, error=exc)
                    raise
                await finish_run(store, run)
            finally:
                if own_wrapper is not None:
                    await own_wrapper.release()

        def _validate_backend_support(self) -> None:
            if not local_backend_importable():
                # No LocalBackend can exist here, so ART's checks of one have nothing to
                # check; the check every backend gets still applies.
                if self.eval_fn is not None and not callable(
                    getattr(self.backend, "exact_adapter_lease", None)
                ):
                    raise ValueError(
                        "PipelineTrainer eval requires a backend with exact checkpoint "
                        "inference leases."
                    )
                return
            super()._validate_backend_support()

    return DurablePipelineTrainer
