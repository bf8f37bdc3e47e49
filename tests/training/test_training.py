"""The training loop on events: full runs, resume, one trainer per run, bad input.

Every test runs on SQLite and on PostgreSQL, with real parts: a LangGraph agent (or a one-call
scripted agent) calling the LocalInferenceServer over HTTP through `art.langgraph`, and a real
`art.TrainableModel` registered with CheckOnlyBackend. The crash tests are in
test_crash_resume.py.
"""

from __future__ import annotations

import math
import shutil
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select
from training_helpers import (
    PROJECT,
    assert_consistent,
    langgraph_agent,
    length_reward,
    rows,
    scenarios,
    scripted_agent,
    trainable_model,
    validation_model,
)

import artstore
from artstore.backends import CheckOnlyBackend
from artstore.errors import (
    ConfigurationError,
    GroupAlreadyConsumedError,
    RewardFunctionError,
    TrainerConflictError,
)
from artstore.events import RolloutFailed, TrainStepCompleted
from artstore.groups import group_id_for
from artstore.schema import tables as t
from artstore.testing.inference_server import LocalInferenceServer
from artstore.training import (
    BackendStepError,
    RolloutsFailedError,
    TrainingConfig,
    TrainingFramework,
    TrainStepError,
    train,
)

RUN = f"{PROJECT}/agent"  # a run is named after its model unless told otherwise


@pytest.fixture(autouse=True)
def no_wandb(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WANDB_API_KEY", raising=False)  # model.log stays offline


@pytest.fixture
def server() -> Iterator[LocalInferenceServer]:
    with LocalInferenceServer() as running:
        yield running


async def event_types(store: artstore.Store) -> Counter[str]:
    async with store.database.read() as connection:
        found = await connection.execute(
            select(t.events.c.type, func.count()).group_by(t.events.c.type)
        )
        return Counter(dict(found.all()))


async def event_count(store: artstore.Store) -> int:
    return sum((await event_types(store)).values())


def config(**changes: Any) -> TrainingConfig:
    return TrainingConfig(**{"epochs": 1, "batch_size": 2, "group_size": 2, **changes})


# --- full runs ------------------------------------------------------------------------------


async def test_full_run_records_everything_and_resumes_with_more_epochs(
    store: artstore.Store, server: LocalInferenceServer, tmp_path: Path
) -> None:
    model, backend = await trainable_model(tmp_path, server, push_dir=tmp_path / "bucket")
    framework = TrainingFramework(store)
    summary = await framework.run_training(
        model=model,
        scenarios=scenarios(3),  # batches of 2 and 1, as `batched` splits them
        agent_function=langgraph_agent,
        reward_function=length_reward,
        config=config(epochs=2),
    )
    assert summary.run == RUN and not summary.resumed
    assert (summary.start_step, summary.final_step) == (0, 4)
    assert summary.steps_trained == [1, 2, 3, 4]
    assert (summary.groups_sealed, summary.rollouts, summary.rollouts_failed) == (6, 12, 0)
    assert summary.reconciled == []
    assert await model.get_step() == 4

    types = await event_types(store)
    assert types["run.started"] == types["run.finished"] == 1
    assert types["rollout.started"] == types["rollout.finished"] == 12
    assert types["llm.call"] >= 24  # the ReAct agent calls the tool, then answers
    assert types["rewards.recorded"] == types["group.sealed"] == 6
    assert types["train_step.started"] == types["train_step.completed"] == 4
    assert types["checkpoint.pushed"] == 4

    (run,) = await rows(store, t.runs)
    assert (run.status, run.num_scenarios, run.scorer) == ("finished", 3, "reward")
    groups = await rows(store, t.groups)
    assert sorted((g.epoch, g.batch, g.scenario_index, g.size) for g in groups) == [
        (0, 0, 0, 2),
        (0, 0, 1, 2),
        (0, 1, 2, 2),
        (1, 2, 0, 2),
        (1, 2, 1, 2),
        (1, 3, 2, 2),
    ]
    assert {g.group_id for g in groups} == {
        group_id_for(RUN, epoch, index) for epoch in range(2) for index in range(3)
    }
    batch_of = {g.group_id: g.batch for g in groups}
    rollouts = await rows(store, t.rollouts)
    assert {r.status for r in rollouts} == {"finished"}
    # Each group is rolled out by the model as it is at its batch's step.
    assert all(r.policy_step == batch_of[r.group_id] for r in rollouts)
    rewards = await rows(store, t.rewards)
    assert len(rewards) == 12 and {r.scorer for r in rewards} == {"reward"}
    assert all(r.metrics is None for r in rewards)  # no validation model: no wins (seed: 1/0)

    steps = sorted(await rows(store, t.train_steps), key=lambda s: s.step)
    assert [(s.step_before, s.step, s.status, s.num_groups) for s in steps] == [
        (0, 1, "completed", 2),
        (1, 2, "completed", 1),
        (2, 3, "completed", 2),
        (3, 4, "completed", 1),
    ]
    assert all(s.pushed_to and s.checkpoint for s in steps)
    assert all(Path(s.pushed_to).is_dir() and "/models/" in s.pushed_to for s in steps)
    assert all(s.metrics["num_groups"] == s.num_groups for s in steps)
    consumed = await rows(store, t.group_consumptions)
    assert sorted((c.step, batch_of[c.group_id]) for c in consumed) == [
        (1, 0),
        (1, 0),
        (2, 1),
        (3, 2),
        (3, 2),
        (4, 3),
    ]
    # What the backend trained on: each step's groups, by id, from the store.
    for step in steps:
        record = backend.read_checkpoint(model, step.step)
        assert [m["group_id"] for m in record["group_metadata"]] == step.group_ids
    # ART's own history (model.log) and the pushed checkpoints.
    history = backend.model_dir(model) / "trajectories" / "train"
    assert sorted(p.name for p in history.glob("*.parquet")) == [
        f"{s:04d}.parquet" for s in (1, 2, 3, 4)
    ]
    pushed = tmp_path / "bucket" / PROJECT / "models" / model.name / "checkpoints" / "0004"
    assert pushed.is_dir()
    await assert_consistent(store)

    # The same run again, with a third epoch: only the new epoch is rolled out and trained.
    again = await framework.run_training(
        model=model,
        scenarios=scenarios(3),
        agent_function=langgraph_agent,
        reward_function=length_reward,
        config=config(epochs=3),
    )
    assert again.resumed and again.start_step == 4
    assert (again.steps_trained, again.groups_sealed, again.rollouts) == ([5, 6], 3, 6)
    types = await event_types(store)
    assert types["run.resumed"] == 1 and types["run.finished"] == 2
    await assert_consistent(store)


async def test_validation_model_gives_wins_and_win_rate_through_legacy_train(
    store: artstore.Store, server: LocalInferenceServer, tmp_path: Path
) -> None:
    model, backend = await trainable_model(tmp_path, server)
    summary = await train(
        model,
        1,
        scenarios(2),
        2,
        2,
        langgraph_agent,
        length_reward,
        validation_model(server),
        store=store,
    )  # the positional signature; validation_samples defaults to 2
    assert summary.steps_trained == [1]
    assert (summary.groups_sealed, summary.rollouts) == (2, 8)
    groups = await rows(store, t.groups)
    assert [(g.size, g.num_validation) for g in groups] == [(2, 2), (2, 2)]
    rollouts = {r.rollout_id: r for r in await rows(store, t.rollouts)}
    assert Counter(r.role for r in rollouts.values()) == {"policy": 4, "validation": 4}
    assert {r.model for r in rollouts.values() if r.role == "validation"} == {"validator"}
    assert all(r.policy_step is None for r in rollouts.values() if r.role == "validation")

    rewards = await rows(store, t.rewards)
    by_group: dict[str, dict[str, list[Any]]] = {}
    for reward in rewards:
        role = rollouts[reward.rollout_id].role
        by_group.setdefault(reward.group_id, {}).setdefault(role, []).append(reward)
    for found in by_group.values():
        validation = [r.reward for r in found["validation"]]
        assert all(r.metrics is None for r in found["validation"])
        for policy in found["policy"]:
            wins = sum(1 for v in validation if policy.reward >= v)  # ties count
            assert policy.metrics == {"wins": wins, "win_rate": wins / len(validation)}
    # Validation rollouts are scored but never trained on; wins reach the trajectories.
    record = backend.read_checkpoint(model, 1)
    assert [len(a) for a in record["advantages"]] == [2, 2]
    step_groups = await artstore.groups.load_groups(store, [g.group_id for g in groups], "reward")
    assert all("win_rate" in tr.metrics for g in step_groups for tr in g.trajectories)
    await assert_consistent(store)


# --- one trainer per model ------------------------------------------------------------------


async def test_a_replay_that_crashed_is_settled_by_the_models_next_trainer(
    store: Any, server: LocalInferenceServer, tmp_path: Path
) -> None:
    """A step left open in another run (a replay into this model died in backend.train)
    is settled when the model's own run starts, before its step moves on."""
    from artstore.events import TrainStepStarted
    from artstore.training.steps import model_key, train_stream

    model, _ = await trainable_model(tmp_path, server)
    crashed = TrainStepStarted(
        run="other-run", model=model_key(model), step=0, group_ids=["g"], scorer="s", trainer="x"
    )
    await store.append(train_stream("other-run"), [crashed])
    summary = await TrainingFramework(store).run_training(
        model=model,
        scenarios=scenarios(2),
        agent_function=scripted_agent,
        reward_function=length_reward,
        config=config(),
    )
    assert any("run 'other-run'" in note for note in summary.reconciled)
    other = await rows(store, t.train_steps, t.train_steps.c.run == "other-run")
    assert [(s.status, s.error_type) for s in other] == [("failed", "TrainerStopped")]
    assert await rows(store, t.group_consumptions, t.group_consumptions.c.group_id == "g") == []


async def test_a_replay_into_a_model_being_trained_gets_a_clear_error(
    store: Any, server: LocalInferenceServer, tmp_path: Path
) -> None:
    from artstore.training.lease import trainer_lease
    from artstore.training.steps import model_key

    model, _ = await trainable_model(tmp_path, server)
    async with trainer_lease(store.database, "its-own-run", model_key(model)):
        with pytest.raises(TrainerConflictError, match="one trainer per model"):
            async with trainer_lease(store.database, "another-run", model_key(model)):
                pass


async def test_a_second_trainer_on_the_same_run_gets_a_clear_error(
    database_url: str, server: LocalInferenceServer, tmp_path: Path
) -> None:
    model, _ = await trainable_model(tmp_path, server)
    conflicts: list[BaseException] = []
    tried: list[bool] = []

    async def second_trainer() -> None:
        # Another store (a second instance, as another process would open) on the same run.
        async with await artstore.open_store(database_url) as other:
            with pytest.raises(TrainerConflictError, match="another process") as caught:
                await TrainingFramework(other).run_training(
                    model=model,
                    scenarios=scenarios(2),
                    agent_function=scripted_agent,
                    reward_function=length_reward,
                    config=config(),
                )
            conflicts.append(caught.value)

    async def agent(scenario: dict[str, Any], thread_id: str) -> str:
        if not tried:  # once, from the first rollout (the others run concurrently)
            tried.append(True)
            await second_trainer()  # while the first trainer holds the run
        return await scripted_agent(scenario, thread_id)

    async with await artstore.open_store(database_url) as store:
        await TrainingFramework(store).run_training(
            model=model,
            scenarios=scenarios(2),
            agent_function=agent,
            reward_function=length_reward,
            config=config(),
        )
        assert len(conflicts) == 1
        types = await event_types(store)
        assert types["run.started"] == 1 and "run.resumed" not in types
        # Released when the first trainer is done: the run can be resumed (nothing to do).
        summary = await TrainingFramework(store).run_training(
            model=model,
            scenarios=scenarios(2),
            agent_function=scripted_agent,
            reward_function=length_reward,
            config=config(),
        )
        assert summary.resumed and summary.steps_trained == []


# --- bad input ------------------------------------------------------------------------------


def _raises(scenario: Any, results: list[Any], trajectories: list[Any]) -> list[float]:
    raise KeyError("score")


BAD_REWARDS = {
    "raises": (_raises, r"raised KeyError: 'score'"),
    "wrong count": (lambda s, r, t: [1.0], r"returned 1 rewards for 2 trajectories"),
    "nan": (lambda s, r, t: [1.0, math.nan], r"reward 1 is nan, not a finite number"),
    "not numbers": (lambda s, r, t: ["high", "low"], r"reward 0 is 'high', not a number"),
}


@pytest.mark.parametrize("kind", list(BAD_REWARDS))
async def test_a_bad_reward_function_keeps_the_rollouts_for_a_resume(
    store: artstore.Store, server: LocalInferenceServer, tmp_path: Path, kind: str
) -> None:
    model, _ = await trainable_model(tmp_path, server)
    bad_reward, message = BAD_REWARDS[kind]
    run_args = dict(model=model, scenarios=scenarios(2), agent_function=scripted_agent)
    with pytest.raises(RewardFunctionError, match=message) as caught:
        await TrainingFramework(store).run_training(
            **run_args, reward_function=bad_reward, config=config()
        )
    assert f"run {RUN!r}, epoch 0, scenario " in str(caught.value)
    assert "(group " in str(caught.value)
    finished = {r.rollout_id for r in await rows(store, t.rollouts) if r.status == "finished"}
    assert len(finished) == 4  # both groups of the batch were rolled out before failing
    assert await rows(store, t.groups) == []  # nothing sealed, nothing trained
    assert await rows(store, t.train_steps) == []
    (run,) = await rows(store, t.runs)
    assert run.status == "failed" and "RewardFunctionError" in run.error
    await assert_consistent(store)

    summary = await TrainingFramework(store).run_training(
        **run_args, reward_function=length_reward, config=config()
    )
    assert (summary.rollouts, summary.groups_sealed, summary.steps_trained) == (0, 2, [1])
    assert {r.rollout_id for r in await rows(store, t.rollouts)} == finished  # none regenerated
    assert (await rows(store, t.runs))[0].status == "finished"
    await assert_consistent(store)


async def test_failed_rollouts_are_recorded_and_left_out_of_their_group(
    store: artstore.Store, server: LocalInferenceServer, tmp_path: Path
) -> None:
    model, _ = await trainable_model(tmp_path, server)
    calls = Counter[int]()

    async def flaky(scenario: dict[str, Any], thread_id: str) -> str:
        calls[scenario["id"]] += 1
        if calls[scenario["id"]] == 2:  # the second rollout of each scenario
            raise ValueError(f"tool broke on {scenario['id']}")
        return await scripted_agent(scenario, thread_id)

    summary = await TrainingFramework(store).run_training(
        model=model,
        scenarios=scenarios(2),
        agent_function=flaky,
        reward_function=length_reward,
        config=config(group_size=3),
    )
    assert (summary.rollouts, summary.rollouts_failed, summary.steps_trained) == (4, 2, [1])
    groups = await rows(store, t.groups)
    assert [(g.size, g.num_failed) for g in groups] == [(2, 1), (2, 1)]
    failed = [r for r in await rows(store, t.rollouts) if r.status == "failed"]
    assert len(failed) == 2 and {r.error_type for r in failed} == {"ValueError"}
    stream = await store.read_stream(f"rollout-{failed[0].rollout_id}")
    event = stream[-1].decode()
    assert isinstance(event, RolloutFailed)
    assert "tool broke on" in event.traceback and "in flaky" in event.traceback
    await assert_consistent(store)


async def test_when_every_rollout_of_a_group_fails_the_run_stops_clearly(
    store: artstore.Store, server: LocalInferenceServer, tmp_path: Path
) -> None:
    model, _ = await trainable_model(tmp_path, server)

    async def broken(scenario: dict[str, Any], thread_id: str) -> str:
        if scenario["id"] == 1:
            raise RuntimeError("agent down")
        return await scripted_agent(scenario, thread_id)

    run_args = dict(model=model, scenarios=scenarios(2), reward_function=length_reward)
    with pytest.raises(
        RolloutsFailedError, match=r"scenario 1 .*all 2 rollouts failed.*agent down"
    ):
        await TrainingFramework(store).run_training(
            **run_args, agent_function=broken, config=config()
        )
    # The other group of the batch was finished and sealed; nothing was trained.
    assert [g.scenario_index for g in await rows(store, t.groups)] == [0]
    assert await rows(store, t.train_steps) == []
    await assert_consistent(store)

    summary = await TrainingFramework(store).run_training(
        **run_args, agent_function=scripted_agent, config=config()
    )
    assert (summary.rollouts, summary.groups_sealed, summary.steps_trained) == (2, 1, [1])
    await assert_consistent(store)


async def test_a_scenario_that_is_not_json_is_refused_before_anything_is_written(
    store: artstore.Store, server: LocalInferenceServer, tmp_path: Path
) -> None:
    model, _ = await trainable_model(tmp_path, server)
    with pytest.raises(ConfigurationError, match=r"scenario 1 is not JSON-serializable"):
        await TrainingFramework(store).run_training(
            model=model,
            scenarios=[{"question": "fine"}, {"question": object()}],
            agent_function=scripted_agent,
            reward_function=length_reward,
            config=config(),
        )
    assert await event_count(store) == 0


@pytest.mark.parametrize(
    "changes",
    [
        {"epochs": 0},
        {"batch_size": -1},
        {"group_size": 0},
        {"group_size": True},
        {"batch_size": "2"},
        {"epochs": 1.0},
        {"validation_samples": -1},
        {"scorer": ""},
        {"train_kwargs": {"learning_rate": object()}},
    ],
)
def test_bad_sizes_are_refused(changes: dict[str, Any]) -> None:
    name = next(iter(changes))
    with pytest.raises(ConfigurationError, match=name):
        config(**changes)


async def test_legacy_train_refuses_bad_sizes_before_anything_is_written(
    store: artstore.Store, server: LocalInferenceServer, tmp_path: Path
) -> None:
    model, _ = await trainable_model(tmp_path, server)
    with pytest.raises(ConfigurationError, match="batch_size must be positive, got 0"):
        await train(model, 1, scenarios(2), 0, 2, scripted_agent, length_reward, None, store=store)
    with pytest.raises(ConfigurationError, match="validation_samples=0"):
        await TrainingFramework(store).run_training(
            model=model,
            scenarios=scenarios(2),
            agent_function=scripted_agent,
            reward_function=length_reward,
            config=config(validation_samples=0),
            validation_model=validation_model(server),
        )
    assert await event_count(store) == 0


async def test_changed_settings_on_resume_are_refused(
    store: artstore.Store, server: LocalInferenceServer, tmp_path: Path
) -> None:
    model, _ = await trainable_model(tmp_path, server)
    run_args = dict(model=model, agent_function=scripted_agent, reward_function=length_reward)
    await TrainingFramework(store).run_training(**run_args, scenarios=scenarios(2), config=config())
    written = await event_count(store)
    attempts = [
        ({"scenarios": scenarios(3), "config": config()}, "scenarios"),
        ({"scenarios": scenarios(2), "config": config(group_size=3)}, "group_size"),
        ({"scenarios": scenarios(2), "config": config(batch_size=1)}, "batch_size"),
        ({"scenarios": scenarios(2), "config": config(scorer="judge")}, "scorer"),
        (
            {
                "scenarios": scenarios(2),
                "config": config(),
                "validation_model": validation_model(server),
            },
            "validation model, validation_samples",
        ),
    ]
    for changes, named in attempts:
        with pytest.raises(ConfigurationError, match=f"started with other {named};"):
            await TrainingFramework(store).run_training(**run_args, **changes)
    assert await event_count(store) == written
    await assert_consistent(store)


class FlakyBackend(CheckOnlyBackend):
    """Its first `train` fails, as a trainer out of GPU memory would."""

    failures = 1

    async def train(self, model: Any, groups: Any, **kwargs: Any) -> Any:
        if self.failures:
            self.failures -= 1
            raise MemoryError("CUDA out of memory")
        return await super().train(model, groups, **kwargs)


async def test_a_failed_train_step_leaves_its_groups_for_the_resume(
    store: artstore.Store, server: LocalInferenceServer, tmp_path: Path
) -> None:
    model, backend = await trainable_model(tmp_path, server, backend_class=FlakyBackend)
    run_args = dict(
        model=model,
        scenarios=scenarios(2),
        agent_function=scripted_agent,
        reward_function=length_reward,
    )
    with pytest.raises(TrainStepError, match=r"backend.train failed at step 1 .*CUDA out of"):
        await TrainingFramework(store).run_training(**run_args, config=config())
    (step,) = await rows(store, t.train_steps)
    assert (step.status, step.error_type) == ("failed", "MemoryError")
    assert await rows(store, t.group_consumptions) == []
    # Resumed with other train_kwargs (allowed: they do not shape the groups).
    summary = await TrainingFramework(store).run_training(
        **run_args, config=config(train_kwargs={"learning_rate": 1e-5})
    )
    assert (summary.rollouts, summary.groups_sealed, summary.steps_trained) == (0, 0, [1])
    assert backend.read_checkpoint(model, 1)["train_kwargs"]["learning_rate"] == 1e-5
    resumed = [e.decode() for e in await store.read_stream(f"run-{RUN}")][-2]
    assert resumed.config["train_kwargs"] == {"learning_rate": 1e-5}  # recorded
    await assert_consistent(store)


async def test_a_backend_behind_the_store_is_refused(
    store: artstore.Store, server: LocalInferenceServer, tmp_path: Path
) -> None:
    model, backend = await trainable_model(tmp_path, server)
    run_args = dict(
        model=model,
        scenarios=scenarios(2),
        agent_function=scripted_agent,
        reward_function=length_reward,
    )
    await TrainingFramework(store).run_training(**run_args, config=config())
    shutil.rmtree(backend.model_dir(model) / "checkpoints" / "0001")  # the step is lost
    with pytest.raises(BackendStepError, match=r"at step 0 on its backend.*recorded step 1"):
        await TrainingFramework(store).run_training(**run_args, config=config(epochs=2))
    await assert_consistent(store)


# --- invariant 4 ----------------------------------------------------------------------------


async def test_a_group_is_consumed_by_a_model_at_most_once(store: artstore.Store) -> None:
    def completed(model: str, step: int, groups: list[str]) -> TrainStepCompleted:
        return TrainStepCompleted(run="r", model=model, step=step, group_ids=groups, scorer="s")

    await store.append("train-r", [completed("p/a", 1, ["g1", "g2"])])
    before = (await event_count(store), await store.stream_version("train-r"))
    with pytest.raises(GroupAlreadyConsumedError, match="g2"):
        await store.append("train-r", [completed("p/a", 2, ["g2", "g3"])])
    assert (await event_count(store), await store.stream_version("train-r")) == before
    consumed = await rows(store, t.group_consumptions)
    assert sorted((c.group_id, c.model, c.step) for c in consumed) == [
        ("g1", "p/a", 1),
        ("g2", "p/a", 1),
    ]
    # Another trained model may consume the same group (replay into model B).
    await store.append("train-r", [completed("p/b", 1, ["g2"])])
    assert len(await rows(store, t.group_consumptions)) == 3
    await assert_consistent(store)


async def test_standalone_seed_methods_still_work(
    store: artstore.Store, server: LocalInferenceServer, tmp_path: Path
) -> None:
    model, _ = await trainable_model(tmp_path, server)
    framework = TrainingFramework(store)
    result, rollout_id = await framework.execute_rollout(
        model=model, scenario=scenarios(1)[0], agent_function=scripted_agent
    )
    trajectory = await framework.create_trajectory_from_logs(rollout_id, 0.5)
    assert trajectory.reward == 0.5 and result
    group = await framework.process_scenario(
        model=model,
        scenario=scenarios(1)[0],
        group_size=2,
        agent_function=scripted_agent,
        reward_function=length_reward,
    )
    assert len(group.trajectories) == 2
    await framework.run_training_epoch(
        model=model,
        scenarios=scenarios(3),
        batch_size=2,
        group_size=2,
        agent_function=scripted_agent,
        reward_function=length_reward,
    )
    assert await model.get_step() == 2
    await assert_consistent(store)
