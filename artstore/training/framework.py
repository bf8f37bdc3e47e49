"""The seed's training loop, on events: every rollout, reward and step is recorded.

Groups of `group_size` rollouts per scenario, batches of `batch_size` scenarios, `epochs`
passes, an optional validation model whose rollouts give each trajectory `wins` and
`win_rate`: as in the seed's `TrainingFramework`. What changes is that nothing lives only
in memory or in files. Running the same run again (by name) continues where it stopped:
finished rollouts are not regenerated, rollouts that were in flight are redone, sealed
groups are trained before anything new is rolled out, finished steps are not repeated,
and a step the backend finished but the store never heard of is reconciled.

Bugs of the seed fixed here: the division by zero in the win rate without a validation
model; the start step that was read and never used (it is now what resume checks); the
reward function's result that was never checked (count, numbers, NaN); `model.train`
that ART 0.5 no longer has (now `backend.train` then `model.log`); rollouts of failed
agents that took the whole batch down with them; trajectories rebuilt from pickled files.
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import inspect
import itertools
import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from artstore.errors import ArtstoreError, ConfigurationError, InvalidEventError
from artstore.events import RunFinished, RunResumed, RunStarted
from artstore.eventstore.blobs import canonical_json
from artstore.eventstore.store import NO_STREAM
from artstore.training.config import TrainingConfig
from artstore.training.groups import (
    call_reward_function,
    group_id_for,
    group_rollouts,
    group_stream,
    load_groups,
    rewards_event,
    sealed_event,
    sealed_groups,
)
from artstore.training.lease import trainer_lease
from artstore.training.steps import (
    consumed_groups,
    model_key,
    push_if_missing,
    reconcile,
    train_groups,
    trainer_id,
)

if TYPE_CHECKING:
    import art

    from artstore.store import Store

log = logging.getLogger("artstore.training")

AgentFunction = Callable[[Any, str], Any]  # (scenario, thread_id) -> result
RewardFunction = Callable[[Any, list[Any], list[Any]], Any]  # -> list of rewards


class RolloutsFailedError(ArtstoreError):
    """Every policy rollout of a group failed; the run stops (resume retries them)."""


def batched(iterable: Iterable[Any], n: int) -> Iterable[tuple[Any, ...]]:
    """Batch data into tuples of length n. The last batch may be shorter.

    >>> list(batched([1, 2, 3, 4, 5], 2))
    [(1, 2), (3, 4), (5,)]
    """
    if n < 1:
        raise ValueError("n must be at least one")
    iterator = iter(iterable)
    while batch := tuple(itertools.islice(iterator, n)):
        yield batch


def to_json_value(value: Any) -> Any:
    """An agent's result or a scenario as JSON: pydantic models and dataclasses are dumped."""
    if hasattr(value, "model_dump"):
        return value.model_dump(mode="json")
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    return value


@dataclass(frozen=True)
class _RunContext:
    """Where the current group belongs: set by run_training, absent for standalone calls."""

    run: str | None = None
    epoch: int | None = None
    batch: int | None = None
    scenario_index: int | None = None
    scorer: str = "reward"


# Which run, epoch and scenario the current task works for. A context variable, not an
# attribute: the groups of a batch are rolled out concurrently, each in its own task.
_CONTEXT: contextvars.ContextVar[_RunContext] = contextvars.ContextVar(
    "artstore_run_context",
    default=_RunContext(),  # noqa: B039 (frozen: never mutated, only replaced)
)


@dataclass
class RunSummary:
    run: str
    steps_trained: list[int] = field(default_factory=list)
    groups_sealed: int = 0
    rollouts: int = 0
    reconciled: list[str] = field(default_factory=list)


class TrainingFramework:
    """Runs reinforcement-learning experiments with ART, recording everything in a store.

    `TrainingFramework(store)` uses an open store; `TrainingFramework()` opens the default
    one (`$ARTSTORE_URL`, then `.artstore/artstore.db`) when first needed.
    """

    def __init__(self, store: Store | None = None, *, url: str | None = None) -> None:
        self._store = store
        self._url = url
        self._owns_store = store is None
        self._train_kwargs: dict[str, Any] = {}

    async def store(self) -> Store:
        if self._store is None:
            from artstore.store import open_store

            self._store = await open_store(self._url)
        return self._store

    async def close(self) -> None:
        """Close the store if this framework opened it."""
        if self._owns_store and self._store is not None:
            await self._store.close()
            self._store = None

    # --- the seed's methods ---------------------------------------------------------------

    async def execute_rollout(
        self,
        *,
        model: Any,
        scenario: Any,
        agent_function: AgentFunction,
        role: str = "policy",
        group_id: str | None = None,
        policy_step: int | None = None,
    ) -> tuple[Any, str]:
        """Run the agent once on `scenario`, recorded; returns (result, rollout id).

        The seed returned the path of a pickled log; the rollout id names the events
        that replace it. The agent is called as `agent_function(scenario, thread_id)`.
        """
        store = await self.store()
        context = _CONTEXT.get()
        async with store.rollout(
            model,
            scenario=to_json_value(scenario),
            run=context.run,
            group_id=group_id,
            scenario_index=context.scenario_index,
            role=role,  # type: ignore[arg-type]
            policy_step=policy_step,
        ) as rollout:
            result = agent_function(scenario, rollout.id)
            if inspect.isawaitable(result):
                result = await result
            rollout.result = to_json_value(result)
        return rollout.result, rollout.id

    async def create_trajectory_from_logs(self, log_path: str, reward: float) -> art.Trajectory:
        """The trajectory of a rollout, projected from its events (`log_path` is its id)."""
        trajectory = await (await self.store()).trajectory(log_path)
        trajectory.reward = reward
        return trajectory

    async def process_scenario(
        self,
        *,
        model: Any,
        scenario: Any,
        group_size: int,
        agent_function: AgentFunction,
        reward_function: RewardFunction,
        validation_model: Any = None,
        validation_samples: int = 2,
    ) -> art.TrajectoryGroup:
        """Roll out a group for one scenario, score it, seal it; returns the ART group.

        Inside `run_training` the group belongs to the run and is resumable; called on its
        own it is a group of no run.
        """
        import uuid

        TrainingConfig(
            epochs=1, batch_size=1, group_size=group_size, validation_samples=validation_samples
        )  # same validation as a run
        context = _CONTEXT.get()
        if context.run is not None:
            assert context.epoch is not None and context.scenario_index is not None
            group_id = group_id_for(context.run, context.epoch, context.scenario_index)
        else:
            group_id = str(uuid.uuid4())
        await self._seal_group(
            group_id,
            model=model,
            scenario=scenario,
            group_size=group_size,
            agent_function=agent_function,
            reward_function=reward_function,
            validation_model=validation_model,
            validation_samples=validation_samples if validation_model is not None else 0,
        )
        (group,) = await load_groups(await self.store(), [group_id], context.scorer)
        return group

    async def execute_training_step(
        self,
        *,
        model: art.TrainableModel,
        scenarios: Sequence[Any],
        group_size: int,
        agent_function: AgentFunction,
        reward_function: RewardFunction,
        validation_model: Any = None,
        validation_samples: int = 2,
    ) -> None:
        """Roll out and seal a group per scenario, then train them in one step."""
        context = _CONTEXT.get()
        run = context.run or model_key(model)
        batch_start = (context.scenario_index or 0) if context.run else 0
        group_ids = await asyncio.gather(
            *(
                self._group_in_batch(
                    run_context=dataclasses.replace(context, scenario_index=batch_start + n),
                    model=model,
                    scenario=scenario,
                    group_size=group_size,
                    agent_function=agent_function,
                    reward_function=reward_function,
                    validation_model=validation_model,
                    validation_samples=validation_samples,
                )
                for n, scenario in enumerate(scenarios)
            )
        )
        store = await self.store()
        fresh = [g for g in group_ids if g not in await consumed_groups(store, model, group_ids)]
        if fresh:
            await train_groups(
                store,
                run=run,
                model=model,
                group_ids=fresh,
                scorer=context.scorer,
                train_kwargs=self._train_kwargs,
            )

    async def run_training_epoch(
        self,
        *,
        model: art.TrainableModel,
        scenarios: Sequence[Any],
        batch_size: int,
        group_size: int,
        agent_function: AgentFunction,
        reward_function: RewardFunction,
        validation_model: Any = None,
        validation_samples: int = 2,
    ) -> None:
        """One pass over the scenarios, a train step per batch; finished batches are skipped."""
        context = _CONTEXT.get()
        epoch = context.epoch or 0
        batches_per_epoch = -(-len(scenarios) // batch_size)
        for number, batch in enumerate(batched(scenarios, batch_size)):
            token = _CONTEXT.set(
                dataclasses.replace(
                    context,
                    epoch=epoch,
                    batch=epoch * batches_per_epoch + number,
                    scenario_index=number * batch_size,
                )
            )
            try:
                await self.execute_training_step(
                    model=model,
                    scenarios=batch,
                    group_size=group_size,
                    agent_function=agent_function,
                    reward_function=reward_function,
                    validation_model=validation_model,
                    validation_samples=validation_samples,
                )
            finally:
                _CONTEXT.reset(token)

    async def run_training(
        self,
        *,
        model: art.TrainableModel,
        scenarios: Sequence[Any],
        agent_function: AgentFunction,
        reward_function: RewardFunction,
        config: TrainingConfig,
        validation_model: Any = None,
        run: str | None = None,
    ) -> RunSummary:
        """Train for `config.epochs` epochs, resuming run `run` if it was started before.

        `run` defaults to the model's "project/name": running the same script again after
        a crash resumes it. A second trainer on the same run gets TrainerConflictError.
        """
        if not isinstance(config, TrainingConfig):
            raise ConfigurationError("config must be an artstore.TrainingConfig")
        scenarios = list(scenarios)
        if not scenarios:
            raise ConfigurationError("there are no scenarios to train on")
        stored_scenarios = [_scenario_json(s, i) for i, s in enumerate(scenarios)]
        run = run or model_key(model)
        store = await self.store()
        try:
            async with trainer_lease(store.database, run, model_key(model)):
                summary = RunSummary(run=run)
                await self._start_or_resume(run, model, stored_scenarios, config, validation_model)
                note = await reconcile(store, run, model)
                if note:
                    summary.reconciled.append(note)
                    log.warning("run %s: %s", run, note)
                await push_if_missing(store, run, model)
                self._train_kwargs = config.train_kwargs
                try:
                    for epoch in range(config.epochs):
                        _CONTEXT.set(_RunContext(run=run, epoch=epoch, scorer=config.scorer))
                        await self.run_training_epoch(
                            model=model,
                            scenarios=scenarios,
                            batch_size=config.batch_size,
                            group_size=config.group_size,
                            agent_function=agent_function,
                            reward_function=reward_function,
                            validation_model=validation_model,
                            validation_samples=config.validation_samples,
                        )
                finally:
                    _CONTEXT.set(_RunContext())
                await store.append(f"run-{run}", [RunFinished(run=run)])
                summary.steps_trained.append(await model.get_step())
                return summary
        finally:
            await self.close()

    # --- internals ------------------------------------------------------------------------

    async def _start_or_resume(
        self,
        run: str,
        model: Any,
        scenarios: list[Any],
        config: TrainingConfig,
        validation_model: Any,
    ) -> None:
        store = await self.store()
        recorded = await store.read_stream(f"run-{run}", limit=1)
        if not recorded:
            await store.append(
                f"run-{run}",
                [
                    RunStarted(
                        run=run,
                        project=model.project,
                        model=model.name,
                        base_model=getattr(model, "base_model", None),
                        config=config.to_json(),
                        scenarios=scenarios,
                        validation_model=getattr(validation_model, "name", None),
                        scorer=config.scorer,
                        trainer=trainer_id(),
                    )
                ],
                expected_version=NO_STREAM,
            )
            return
        started = recorded[0].decode()
        assert isinstance(started, RunStarted)
        changed = [
            name
            for name, before, now in [
                ("model", f"{started.project}/{started.model}", model_key(model)),
                ("scenarios", started.scenarios, scenarios),
                ("batch_size", started.config.get("batch_size"), config.batch_size),
                ("group_size", started.config.get("group_size"), config.group_size),
                (
                    "validation_samples",
                    started.config.get("validation_samples"),
                    config.validation_samples,
                ),
                ("scorer", started.scorer, config.scorer),
            ]
            if before != now
        ]
        if changed:
            raise ConfigurationError(
                f"run {run!r} was started with other {', '.join(changed)}; pass the original "
                "settings to resume it, or a new run name to start another run"
            )
        await store.append(
            f"run-{run}",
            [
                RunResumed(
                    run=run,
                    trainer=trainer_id(),
                    at_step=await model.get_step(),
                    config=config.to_json() if config.to_json() != started.config else None,
                )
            ],
        )

    async def _group_in_batch(self, *, run_context: _RunContext, **kwargs: Any) -> str:
        """Seal one group of a batch (or find it sealed); returns its id."""
        token = _CONTEXT.set(run_context)
        try:
            if run_context.run is None:
                group = await self.process_scenario(**kwargs)
                return str(group.metadata["group_id"])
            assert run_context.epoch is not None and run_context.scenario_index is not None
            group_id = group_id_for(run_context.run, run_context.epoch, run_context.scenario_index)
            await self._seal_group(
                group_id,
                **{
                    **kwargs,
                    "validation_samples": kwargs["validation_samples"]
                    if kwargs.get("validation_model") is not None
                    else 0,
                },
            )
            return group_id
        finally:
            _CONTEXT.reset(token)

    async def _seal_group(
        self,
        group_id: str,
        *,
        model: Any,
        scenario: Any,
        group_size: int,
        agent_function: AgentFunction,
        reward_function: RewardFunction,
        validation_model: Any,
        validation_samples: int,
    ) -> None:
        """Finish what a group lacks (rollouts, rewards), then seal it, unless it is sealed."""
        store = await self.store()
        context = _CONTEXT.get()
        if await sealed_groups(store, [group_id]):
            return
        done = await group_rollouts(store, group_id)
        step = await model.get_step() if getattr(model, "trainable", False) else None
        wanted = [(model, "policy")] * max(0, group_size - len(done.policy))
        if validation_model is not None:
            wanted += [(validation_model, "validation")] * max(
                0, validation_samples - len(done.validation)
            )
        outcomes = await asyncio.gather(
            *(
                self.execute_rollout(
                    model=who,
                    scenario=scenario,
                    agent_function=agent_function,
                    role=role,
                    group_id=group_id,
                    policy_step=step if role == "policy" else None,
                )
                for who, role in wanted
            ),
            return_exceptions=True,
        )
        failures = [o for o in outcomes if isinstance(o, BaseException)]
        for failure in failures:
            if not isinstance(failure, Exception):  # cancellation, KeyboardInterrupt
                raise failure
        done = await group_rollouts(store, group_id)
        where = _where(context, group_id)
        if not done.policy:
            first = failures[0] if failures else None
            raise RolloutsFailedError(
                f"{where}: all {group_size} rollouts failed; the last error: "
                f"{type(first).__name__}: {first}"
            ) from first
        if failures:
            log.warning(
                "%s: %d rollouts failed and are left out of the group (first: %s: %s)",
                where,
                len(failures),
                type(failures[0]).__name__,
                failures[0],
            )
        ids = [*done.policy, *done.validation]
        trajectories = await store.trajectories(ids)
        rewards = await call_reward_function(
            reward_function,
            scenario,
            [done.results[i] for i in ids],
            [trajectories[i] for i in ids],
            where,
        )
        if done.validation:
            wins = sum(1 for m in _wins(rewards, done) if m)
            log.info("%s: win rate %.3f", where, wins / (len(done.policy) * len(done.validation)))
        await store.append(
            group_stream(group_id),
            [
                rewards_event(
                    group_id, context.scorer, done.policy, done.validation, rewards, rescored=False
                ),
                sealed_event(
                    group_id,
                    run=context.run,
                    epoch=context.epoch,
                    batch=context.batch,
                    scenario_index=context.scenario_index,
                    rollouts=done,
                ),
            ],
            expected_version=NO_STREAM,
        )


def _wins(rewards: list[float], done: Any) -> list[bool]:
    policy, validation = rewards[: len(done.policy)], rewards[len(done.policy) :]
    return [p >= v for p in policy for v in validation]


def _where(context: _RunContext, group_id: str) -> str:
    if context.run is None:
        return f"group {group_id}"
    return (
        f"run {context.run!r}, epoch {context.epoch}, scenario {context.scenario_index} "
        f"(group {group_id})"
    )


def _scenario_json(scenario: Any, index: int) -> Any:
    value = to_json_value(scenario)
    try:
        canonical_json(value)
    except (TypeError, ValueError) as exc:
        raise InvalidEventError(
            f"scenario {index} is not JSON-serializable ({exc}); scenarios are stored as JSON "
            "so that a run can be resumed and re-scored: use dicts, lists, strings, numbers, "
            "or pydantic models"
        ) from None
    return value


async def train(
    model: art.TrainableModel,
    epochs: int,
    scenarios: Sequence[Any],
    batch_size: int,
    group_size: int,
    do_ai: AgentFunction,
    do_reward: RewardFunction,
    val_model: Any,
    *,
    store: Store | None = None,
    run: str | None = None,
) -> RunSummary:
    """Legacy training function for backward compatibility (the seed's `train`)."""
    framework = TrainingFramework(store)
    config = TrainingConfig(epochs=epochs, batch_size=batch_size, group_size=group_size)
    return await framework.run_training(
        model=model,
        scenarios=scenarios,
        agent_function=do_ai,
        reward_function=do_reward,
        config=config,
        validation_model=val_model,
        run=run,
    )
