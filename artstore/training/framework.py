"""The training loop, on events: every rollout, reward and step is recorded.

Groups of `group_size` rollouts per scenario, batches of `batch_size` scenarios, `epochs`
passes, an optional validation model whose rollouts give each trajectory `wins` and
`win_rate`: the shape of the file-based `TrainingFramework` ART users started from
(pickled LangGraph logs under `.art/langgraph/`). What changes is that nothing lives only
in memory or in files, so running the same run again (by name) continues where it stopped:

- a batch whose groups were all trained is skipped (finished steps are not repeated);
- a sealed group is not rolled out again: a batch whose groups are sealed is trained
  before anything new is rolled out;
- a finished rollout is kept; a rollout that was in flight is recorded as abandoned and
  another one is rolled out in its place;
- a step the backend finished but the store never heard of is reconciled with the
  backend's step (`artstore.training.steps.reconcile`).

Bugs of that file-based loop fixed here: the division by zero in the win rate without a validation
model; the start step that was read and never used (it is now checked against the steps
the store recorded, and reported in `RunSummary`); the reward function's result that was
never checked (count, numbers, NaN); `model.train`, which ART 0.5 no longer has (now
`backend.train` then `model.log`); a failed agent that took the whole batch down (its
rollout is now recorded as failed and left out of the group); a failure in one group that
left the batch's other groups running unattended; trajectories rebuilt from pickled files.

The reward function gets `(scenario, results, trajectories)` as it always did, where the
scenario and the results are as stored (JSON: pydantic models and dataclasses dumped),
whether the rollouts were made now or before a crash, so that a resumed run and
`artstore rescore` score exactly what a fresh run does.
"""

from __future__ import annotations

import asyncio
import inspect
import itertools
import json
import sys
import uuid
from collections.abc import Awaitable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from sqlalchemy import select

from artstore.arguments import check_name
from artstore.art_versions import lineage_name
from artstore.capture.rollout import to_json_value
from artstore.errors import ConfigurationError, RolloutsFailedError
from artstore.events import RunFinished, RunResumed, RunStarted
from artstore.eventstore.blobs import canonical_json
from artstore.eventstore.records import NO_STREAM
from artstore.groups import (
    GroupPlace,
    abandon_rollouts,
    group_id_for,
    group_rollouts,
    load_groups,
    seal_group,
    sealed_groups,
    win_metrics,
)
from artstore.redaction import redacting_logger
from artstore.schema import tables as t
from artstore.store import open_store
from artstore.training.config import TrainingConfig, check_count
from artstore.training.from_workers import train_from_workers
from artstore.training.lease import trainer_lease
from artstore.training.recipe import (
    AgentFunction,
    Recipe,
    RewardFunction,
    RunSummary,
    make_recipe,
)
from artstore.training.replay import policy_rewards
from artstore.training.steps import (
    consumed_groups,
    model_key,
    push_if_missing,
    reconcile,
    train_groups,
    trainer_id,
)
from artstore.workers.claims import require_postgres

if TYPE_CHECKING:
    import art

    from artstore.store import Store

log = redacting_logger("artstore.training")


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


class TrainingFramework:
    """Runs reinforcement-learning experiments with ART, recording everything in a store.

    `TrainingFramework(store)` uses an open store; `TrainingFramework()` opens the default
    one (`$ARTSTORE_URL`, then `.artstore/artstore.db`) when first needed, or the one at
    `url`, and closes it when `run_training` returns (or on `close()`).

    `run_training` is resumable, and says what it does on stderr, a line per train step
    (`progress=False` keeps it quiet). The file-based loop's other methods (`process_scenario`,
    `execute_training_step`, `run_training_epoch`) still work on their own, recorded, but
    their groups belong to no run and are not resumed.
    """

    def __init__(
        self, store: Store | None = None, *, url: str | None = None, progress: bool = True
    ) -> None:
        self._store = store
        self._url = url
        self._owns_store = store is None
        self._active_runs = 0  # the owned store is closed when the last run_training ends
        # `run_training` says what it does on stderr: a line when the run starts or
        # resumes, one per train step, one at the end (or that there is nothing to do).
        self.progress = progress

    def _say(self, message: str) -> None:
        if self.progress:
            print(message, file=sys.stderr, flush=True)

    async def store(self) -> Store:
        if self._store is None:
            self._store = await open_store(self._url)
        return self._store

    async def close(self) -> None:
        """Close the store if this framework opened it."""
        if self._owns_store and self._store is not None:
            store, self._store = self._store, None
            await store.close()

    async def __aenter__(self) -> TrainingFramework:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    # --- the file-based loop's methods ----------------------------------------------------

    async def execute_rollout(
        self,
        *,
        model: Any,
        scenario: Any,
        agent_function: AgentFunction,
        run: str | None = None,
        group_id: str | None = None,
        scenario_index: int | None = None,
        role: str = "policy",
        policy_step: int | None = None,
        resumes: str | None = None,
    ) -> tuple[Any, str]:
        """Run the agent once on `scenario`, recorded; returns (result as stored, rollout id).

        `resumes`: an attempt a crash interrupted, whose recorded calls are served back to the
        agent while its requests match them (`artstore.capture.replay`).

        The file-based loop returned the path of a pickled log; the rollout id names the events that
        replace it. The agent is called as `agent_function(scenario, rollout_id)` (where it
        took a thread id), inside the rollout: its LLM calls through `art.langgraph` or
        `artstore.langgraph` are recorded.
        """
        store = await self.store()
        async with store.rollout(
            model,
            scenario=to_json_value(scenario),
            run=run,
            group_id=group_id,
            scenario_index=scenario_index,
            role=role,  # type: ignore[arg-type]
            policy_step=policy_step,
            resumes=resumes,
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
        scorer: str = "reward",
    ) -> art.TrajectoryGroup:
        """Roll out a group for one scenario, score it and seal it; returns the ART group.

        The group belongs to no run (`run_training` makes groups of its own, resumable).
        """
        recipe = make_recipe(
            model,
            agent_function,
            reward_function,
            group_size,
            validation_model,
            validation_samples,
            scorer,
        )
        store = await self.store()
        place = GroupPlace(group_id=str(uuid.uuid4()))
        await self._seal_group(store, place, scenario, recipe, RunSummary(run=""))
        (group,) = await load_groups(store, [place.group_id], scorer)
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
        scorer: str = "reward",
        train_kwargs: dict[str, Any] | None = None,
    ) -> art.TrainResult:
        """Roll out and seal a group per scenario, then train them in one step.

        The step is recorded under the model's "project/name"; nothing here is resumable.
        """
        groups = await _settle(
            self.process_scenario(
                model=model,
                scenario=scenario,
                group_size=group_size,
                agent_function=agent_function,
                reward_function=reward_function,
                validation_model=validation_model,
                validation_samples=validation_samples,
                scorer=scorer,
            )
            for scenario in scenarios
        )
        return await train_groups(
            await self.store(),
            run=model_key(model),
            model=model,
            group_ids=[str(group.metadata["group_id"]) for group in groups],
            scorer=scorer,
            train_kwargs=train_kwargs,
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
        """One pass over the scenarios, a train step per batch (not resumable)."""
        check_count("batch_size", batch_size)
        for batch in batched(scenarios, batch_size):
            await self.execute_training_step(
                model=model,
                scenarios=batch,
                group_size=group_size,
                agent_function=agent_function,
                reward_function=reward_function,
                validation_model=validation_model,
                validation_samples=validation_samples,
            )

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
        a crash resumes it. The settings that shape the groups (scenarios, batch and group
        sizes, validation model, scorer, who rolls out) must be those the run started
        with; `epochs` may grow. A second trainer on the same run and model gets
        TrainerConflictError.

        With `config.rollouts == "workers"` (PostgreSQL only) this process rolls out
        nothing: it publishes the run's groups for rollout workers (`artstore worker`,
        `artstore.workers.run_worker`) and trains each batch as soon as workers sealed it
        (`artstore.training.from_workers`).
        """
        if not isinstance(config, TrainingConfig):
            raise ConfigurationError("config must be an artstore.TrainingConfig")
        check_name("run", run, optional=True)
        scenarios, stored_scenarios = _checked_scenarios(scenarios, config, validation_model)
        recipe = make_recipe(
            model,
            agent_function,
            reward_function,
            config.group_size,
            validation_model,
            config.validation_samples,
            config.scorer,
        )
        run = run or model_key(model)
        self._active_runs += 1
        try:
            store = await self.store()
            if config.rollouts == "workers":
                require_postgres(store.database, "TrainingConfig(rollouts='workers')")
            # Keys of the models in use never reach an event (agent errors quote them).
            store.redact.add(
                [getattr(m, "inference_api_key", None) for m in (model, validation_model)],
                urls=[getattr(m, "inference_base_url", None) for m in (model, validation_model)],
            )
            async with trainer_lease(store.database, run, model_key(model)):
                state = await self._start_or_resume(
                    store, run, model, stored_scenarios, config, validation_model
                )
                return await self._run_started(store, run, state, scenarios, config, recipe)
        finally:
            self._active_runs -= 1
            if self._active_runs == 0:
                await self.close()

    async def _run_started(
        self,
        store: Store,
        run: str,
        state: str,
        scenarios: list[Any],
        config: TrainingConfig,
        recipe: Recipe,
    ) -> RunSummary:
        """The run trained to its end (or found finished), under its trainer's lease."""
        model = recipe.model
        summary = RunSummary(run=run, resumed=state != "started")
        total = config.epochs * -(-len(scenarios) // config.batch_size)
        if state == "finished":
            summary.start_step = summary.final_step = await model.get_step()
            self._say(
                f"run {run} is already finished: its {total} train steps were trained "
                f"(model {model_key(model)} at step {summary.final_step}); nothing to do"
            )
            return summary
        try:
            await self._train_run(store, run, scenarios, config, recipe, summary)
        except Exception as exc:
            await _record_failure(store, run, exc)
            self._say(f"run {run} failed: {type(exc).__name__}: {exc}")
            raise
        await store.append(f"run-{run}", [RunFinished(run=run)])
        summary.final_step = await model.get_step()
        self._say(
            f"run {run} finished: model {model_key(model)} at step {summary.final_step}; "
            f"this call trained {_count(len(summary.steps_trained), 'step')} and ran "
            f"{_count(summary.rollouts, 'rollout')} ({summary.rollouts_failed} failed)"
        )
        return summary

    # --- internals ------------------------------------------------------------------------

    async def _train_run(
        self,
        store: Store,
        run: str,
        scenarios: list[Any],
        config: TrainingConfig,
        recipe: Recipe,
        summary: RunSummary,
    ) -> None:
        model = recipe.model
        for note in (await reconcile(store, model), await push_if_missing(store, run, model)):
            if note:
                summary.reconciled.append(note)
                log.warning("run %s: %s", run, note)
        summary.start_step = await model.get_step()
        indexed = list(enumerate(scenarios))
        batches_per_epoch = -(-len(scenarios) // config.batch_size)
        total = config.epochs * batches_per_epoch
        if summary.resumed:
            self._say(f"run {run}: resumed, model {model_key(model)} at step {summary.start_step}")
        else:
            self._say(
                f"run {run}: started; {_count(config.epochs, 'epoch')} of "
                f"{_count(batches_per_epoch, 'batch', 'batches')} ({_count(total, 'train step')}), "
                f"{_count(config.group_size, 'rollout')} per scenario"
            )
        batches: list[tuple[list[GroupPlace], list[Any]]] = []
        for epoch in range(config.epochs):
            for number, batch in enumerate(batched(indexed, config.batch_size)):
                places = [
                    GroupPlace(
                        group_id=group_id_for(run, epoch, index),
                        run=run,
                        epoch=epoch,
                        batch=epoch * batches_per_epoch + number,
                        scenario_index=index,
                    )
                    for index, _ in batch
                ]
                batches.append((places, [s for _, s in batch]))
        if config.rollouts == "workers":
            places_only = [places for places, _ in batches]
            await train_from_workers(
                store,
                run,
                places_only,
                config,
                recipe,
                summary,
                on_step=lambda places, before, result: self._report_step(
                    store,
                    summary,
                    recipe,
                    f"batch {places[0].batch + 1}/{total}",
                    before,
                    result,
                    [p.group_id for p in places],
                ),
            )
            return
        for places, batch_scenarios in batches:
            await self._train_batch(store, places, batch_scenarios, recipe, config, summary, total)

    async def _train_batch(
        self,
        store: Store,
        places: list[GroupPlace],
        scenarios: list[Any],
        recipe: Recipe,
        config: TrainingConfig,
        summary: RunSummary,
        total: int,
    ) -> None:
        """Seal the batch's groups (those not sealed yet), then train what is not consumed."""
        consumed = await consumed_groups(store, recipe.model, [p.group_id for p in places])
        todo = [
            (p, s) for p, s in zip(places, scenarios, strict=True) if p.group_id not in consumed
        ]
        where = f"batch {places[0].batch + 1}/{total} (epoch {places[0].epoch})"
        if not todo:
            self._say(f"run {summary.run}: {where} was trained before")
            return
        await _settle(self._seal_group(store, p, s, recipe, summary) for p, s in todo)
        before = await recipe.model.get_step()
        group_ids = [p.group_id for p, _ in todo]
        result = await train_groups(
            store,
            run=summary.run,
            model=recipe.model,
            group_ids=group_ids,
            scorer=recipe.scorer,
            train_kwargs=config.train_kwargs,
        )
        summary.steps_trained.append(result.step)
        await self._report_step(store, summary, recipe, where, before, result, group_ids)

    async def _report_step(
        self,
        store: Store,
        summary: RunSummary,
        recipe: Recipe,
        where: str,
        before: int,
        result: Any,
        group_ids: list[str],
    ) -> None:
        """One line per train step: where it was, the step it made, its mean reward."""
        if not self.progress:
            return

        rewards = [
            r
            for found in (await policy_rewards(store, group_ids, recipe.scorer)).values()
            for r in found
        ]
        mean = f", reward mean {sum(rewards) / len(rewards):.3g}" if rewards else ""
        self._say(
            f"run {summary.run}: {where}: step {before} → {result.step}, "
            f"{len(group_ids)} group{'s' if len(group_ids) != 1 else ''}{mean}"
        )

    async def _seal_group(
        self, store: Store, place: GroupPlace, scenario: Any, recipe: Recipe, summary: RunSummary
    ) -> None:
        """Finish what a group lacks (rollouts, rewards), then seal it, unless it is sealed."""
        if await sealed_groups(store, [place.group_id]):
            return
        done = await group_rollouts(store, place.group_id)
        if done.running:  # left by a crashed trainer (we hold the run's lease)
            await abandon_rollouts(store, done.running)
            note = (
                f"{place}: {len(done.running)} rollouts in flight at a crash were recorded "
                "as abandoned and rolled out again, resuming them from their recorded calls"
            )
            summary.reconciled.append(note)
            log.warning(note)
        model = recipe.model
        step = await model.get_step() if getattr(model, "trainable", False) else None
        wanted = [(model, "policy")] * max(0, recipe.group_size - len(done.policy))
        if recipe.validation_model is not None:
            missing = max(0, recipe.validation_samples - len(done.validation))
            wanted += [(recipe.validation_model, "validation")] * missing
        # Each policy rollout run again resumes one the crash interrupted, if any is left.
        policy_wanted = sum(1 for _, role in wanted if role == "policy")
        resumed = done.running_policy[:policy_wanted]
        resumes = resumed + [None] * (len(wanted) - len(resumed))
        outcomes = await asyncio.gather(
            *(
                self.execute_rollout(
                    model=who,
                    scenario=scenario,
                    agent_function=recipe.agent_function,
                    run=place.run,
                    group_id=place.group_id,
                    scenario_index=place.scenario_index,
                    role=role,
                    policy_step=step if role == "policy" else None,
                    resumes=resuming if role == "policy" else None,
                )
                for (who, role), resuming in zip(wanted, resumes, strict=True)
            ),
            return_exceptions=True,
        )
        failures = [o for o in outcomes if isinstance(o, BaseException)]
        summary.rollouts += len(outcomes) - len(failures)
        summary.rollouts_failed += len(failures)
        for failure in failures:
            if not isinstance(failure, Exception):  # cancellation, KeyboardInterrupt
                raise failure
        done = await group_rollouts(store, place.group_id)
        if not done.policy:
            first = failures[0] if failures else None
            # Redacted as events are; the error is not chained, since its message may hold
            # a key (its traceback is in the rollout's rollout.failed event, redacted).
            raise RolloutsFailedError(
                store.redact(
                    f"{place}: all {recipe.group_size} rollouts failed (recorded, with their "
                    f"tracebacks); the first error: {type(first).__name__}: {first}"
                )
            ) from None
        if failures:
            log.warning(
                "%s",
                store.redact(
                    f"{place}: {len(failures)} rollouts failed and are left out of the group "
                    f"(first: {type(failures[0]).__name__}: {failures[0]})"
                ),
            )
        rewards = await seal_group(
            store,
            place,
            done,
            scenario=scenario,
            reward_function=recipe.reward_function,
            scorer=recipe.scorer,
        )
        if done.validation:
            policy, validation = rewards[: len(done.policy)], rewards[len(done.policy) :]
            rates = [m["win_rate"] for m in win_metrics(policy, validation)]
            log.info("%s: win rate %.3f", place, sum(rates) / len(rates))
        summary.groups_sealed += 1

    async def _start_or_resume(
        self,
        store: Store,
        run: str,
        model: Any,
        scenarios: list[Any],
        config: TrainingConfig,
        validation_model: Any,
    ) -> str:
        """Record the run's start, or check the settings of a resume. Returns "started",
        "resumed", or "finished" for a finished run whose every batch was trained (then
        nothing is recorded: there is nothing to do)."""
        recorded = await store.read_stream(f"run-{run}", limit=1)
        validation_name = getattr(validation_model, "name", None)
        if not recorded:
            await store.append(
                f"run-{run}",
                [
                    RunStarted(
                        run=run,
                        project=model.project,
                        model=lineage_name(model),
                        base_model=getattr(model, "base_model", None),
                        config=config.to_json(),
                        scenarios=scenarios,
                        validation_model=validation_name,
                        scorer=config.scorer,
                        trainer=trainer_id(),
                    )
                ],
                expected_version=NO_STREAM,
            )
            return "started"
        started = recorded[0].decode()
        assert isinstance(started, RunStarted)
        samples_then = started.config.get("validation_samples") if started.validation_model else 0
        samples_now = config.validation_samples if validation_model is not None else 0
        changed = [
            name
            for name, then, now in [
                ("model", f"{started.project}/{started.model}", model_key(model)),
                ("scenarios", started.scenarios, scenarios),
                ("batch_size", started.config.get("batch_size"), config.batch_size),
                ("group_size", started.config.get("group_size"), config.group_size),
                ("validation model", started.validation_model, validation_name),
                ("validation_samples", samples_then, samples_now),
                ("scorer", started.scorer, config.scorer),
                ("rollouts", started.config.get("rollouts", "in_process"), config.rollouts),
            ]
            if then != now
        ]
        if changed:
            raise ConfigurationError(
                f"run {run!r} was started with other {', '.join(changed)}; pass the original "
                "settings to resume it, or a new run name to start another run"
            )
        if await run_is_finished(store, run, model, len(scenarios), config.epochs):
            return "finished"
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
        return "resumed"


async def run_is_finished(store: Store, run: str, model: Any, scenarios: int, epochs: int) -> bool:
    """The run is recorded as finished and `model` trained every group of its `epochs`
    (`run_training` of it again has nothing to do)."""

    async with store.database.read() as connection:
        status = (
            await connection.execute(select(t.runs.c.status).where(t.runs.c.run == run))
        ).scalar()
    if status != "finished":
        return False
    wanted = [
        group_id_for(run, epoch, index) for epoch in range(epochs) for index in range(scenarios)
    ]
    return len(await consumed_groups(store, model, wanted)) == len(wanted)


def _checked_scenarios(
    scenarios: Any, config: Any, validation_model: Any
) -> tuple[list[Any], list[Any]]:
    """The scenarios as a list, and as stored; or a ConfigurationError that says why not."""
    if not isinstance(config, TrainingConfig):
        raise ConfigurationError("config must be an artstore.TrainingConfig")
    if isinstance(scenarios, str | bytes | Mapping) or not isinstance(scenarios, Iterable):
        raise ConfigurationError(
            f"scenarios is a list of scenarios, not a {type(scenarios).__name__}"
        )
    scenarios = list(scenarios)
    if not scenarios:
        raise ConfigurationError("there are no scenarios to train on")
    stored_scenarios = [_scenario_json(s, i) for i, s in enumerate(scenarios)]
    if validation_model is not None and config.validation_samples == 0:
        raise ConfigurationError(
            "a validation model was given with validation_samples=0: it would never run"
        )
    return scenarios, stored_scenarios


async def _settle(awaitables: Iterable[Awaitable[Any]]) -> list[Any]:
    """Await all, then raise the first failure: a failed group leaves no sibling running."""
    outcomes = await asyncio.gather(*awaitables, return_exceptions=True)
    failures = [o for o in outcomes if isinstance(o, BaseException)]
    for failure in failures:
        if not isinstance(failure, Exception):
            raise failure
    if failures:
        if len(failures) > 1:
            failures[0].add_note(f"{len(failures) - 1} other groups of this batch failed too")
        raise failures[0]
    return outcomes


async def _record_failure(store: Store, run: str, exc: Exception) -> None:
    """Mark the run failed (a resume marks it running again); never hide `exc`."""
    try:
        await store.append(
            f"run-{run}",
            [RunFinished(run=run, status="failed", error=f"{type(exc).__name__}: {exc}")],
        )
    except Exception as append_error:
        log.warning("run %s: could not record its failure: %s", run, append_error)


def _scenario_json(scenario: Any, index: int) -> Any:
    """The scenario as stored (and compared on resume), or a clear error if it is not JSON."""
    try:
        return json.loads(canonical_json(to_json_value(scenario)))
    except (TypeError, ValueError) as exc:
        raise ConfigurationError(
            f"scenario {index} is not JSON-serializable ({exc}); scenarios are stored as JSON "
            "so that a run can be resumed and re-scored: use dicts, lists, strings, numbers, "
            "or pydantic models"
        ) from None


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
    """Legacy training function for backward compatibility (the file-based loop's `train`)."""
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


def _count(number: int, noun: str, nouns: str | None = None) -> str:
    """ "1 step", "2 steps"; `nouns` where adding an s is wrong ("batches")."""
    return f"{number} {noun if number == 1 else nouns or noun + 's'}"
