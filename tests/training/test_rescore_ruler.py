"""ART's RULER as a scorer, for real: LiteLLM calls a local judge that answers RULER's JSON.

The judge is `LocalInferenceServer` with a policy that reads the trajectories out of
RULER's prompt and scores each by the tools it called. Nothing of what RULER drops from
a group (group metadata, the trajectories' metrics, metadata and logs recorded by the
agent) is lost: it lives in the rollouts' events, not in the scorer's output.
"""

from __future__ import annotations

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import pytest
from trained_run import (
    checkpoint_record,
    judge_policy,
    judge_score,
    latest_rewards,
    new_model,
    train_run,
)

import artstore
from artstore.backends import group_advantages
from artstore.capture.rollout import current_rollout
from artstore.demo.task import agent as demo_agent
from artstore.demo.task import make_scenarios
from artstore.errors import RewardFunctionError
from artstore.groups import group_rollouts, load_groups
from artstore.testing.inference_server import LocalInferenceServer
from artstore.training.ruler import ruler_reward


async def annotated_agent(scenario, thread_id):
    """The demo agent, recording trajectory metrics, metadata and a log line."""
    result = await demo_agent(scenario, thread_id)
    rollout = current_rollout()
    rollout.metrics["num_tool_calls"] = len(result["tools_used"])
    rollout.metadata["animal"] = scenario["animal"]
    rollout.log(f"answered: {result['answer']}")
    return result


# LiteLLM's own response objects warn when it serialises them; nothing of ours.
pytestmark = pytest.mark.filterwarnings("ignore:Pydantic serializer warnings")


@pytest.fixture(autouse=True)
def no_wandb(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WANDB_API_KEY", raising=False)


@pytest.fixture
def judge():
    with LocalInferenceServer(policy=judge_policy) as server:
        yield server


def ruler_for(server, **litellm: object) -> object:
    return ruler_reward(
        judge_model="openai/test-model",
        extra_litellm_params={"api_base": server.base_url, "api_key": server.api_key, **litellm},
    )


async def test_ruler_scores_are_recorded_and_nothing_ruler_drops_is_lost(store, tmp_path, judge):
    trained = await train_run(store, tmp_path / ".art", agent=annotated_agent)

    scored = await artstore.rescore(store, trained.run, ruler_for(judge), "ruler", concurrency=2)

    assert scored == trained.group_ids
    assert len(judge.requests) == len(trained.group_ids)  # one judge call per group
    assert all(r["model"] == "test-model" for r in judge.requests)
    assert all(r["response_format"]["type"] == "json_schema" for r in judge.requests)
    groups = await load_groups(store, trained.group_ids, "ruler")
    for group_id, group in zip(trained.group_ids, groups, strict=True):
        done = await group_rollouts(store, group_id)
        expected = [judge_score(done.results[rid]["tools_used"]) for rid in done.policy]
        run_rewards = await latest_rewards(store, group_id, "reward")  # still there
        assert await latest_rewards(store, group_id, "ruler") == expected
        # The group as training sees it: RULER's rewards, with everything RULER drops.
        assert group.metadata["group_id"] == group_id and group.metadata["run"] == trained.run
        animal = make_scenarios(2)[group.metadata["scenario_index"]]["animal"]
        for trajectory, reward, run_reward, rollout_id in zip(
            group.trajectories, expected, run_rewards, done.policy, strict=True
        ):
            result = done.results[rollout_id]
            assert trajectory.reward == reward
            assert trajectory.metrics["ruler_score"] == reward
            assert trajectory.metrics["independent_reward"] == run_reward
            assert trajectory.metrics["num_tool_calls"] == len(result["tools_used"])
            assert trajectory.metadata == {
                "animal": animal,
                "artstore_rollout_id": rollout_id,  # where it is in the store
                "artstore_group_id": group_id,
            }
            assert trajectory.logs == [f"answered: {result['answer']}"]
            assert trajectory.tools and trajectory.messages_and_choices
    # A second model trains on RULER's scores.
    second = await new_model(tmp_path / ".art", "judged")
    plan = await artstore.replay(store, trained.run, second, scorer="ruler")
    for step, planned in zip(plan.trained_steps, plan.steps, strict=True):
        record = checkpoint_record(tmp_path / ".art", "judged", step)
        for recorded, group in zip(record["advantages"], planned, strict=True):
            wanted = group_advantages(await latest_rewards(store, group.group_id, "ruler"))
            assert recorded == pytest.approx(wanted)


async def test_a_failing_judge_names_the_group_and_records_nothing_for_it(store, tmp_path):
    trained = await train_run(store, tmp_path / ".art", epochs=1, scenarios=1)
    with LocalInferenceServer(policy=judge_policy, fail_when=lambda request: True) as server:
        with pytest.raises(RewardFunctionError) as raised:
            await artstore.rescore(store, trained.run, ruler_for(server, max_retries=0), "ruler")
    assert f"group {trained.group_ids[0]}" in str(raised.value)
    with pytest.raises(Exception, match="no reward by scorer 'ruler'"):
        await load_groups(store, trained.group_ids, "ruler")


def tool_call(name: str) -> dict:
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": f"call_{name}",
                "type": "function",
                "function": {"name": name, "arguments": "{}"},
            }
        ],
    }


async def test_ruler_judges_the_main_history_of_trajectories_with_additional_ones(store, judge):
    """ART's RULER refuses additional histories; the scorer judges the main one instead."""
    import art

    from artstore.art_versions import history_class

    def trajectory(main_tool: str | None, other_tool: str) -> art.Trajectory:
        main = [{"role": "user", "content": "How many legs?"}]
        if main_tool:
            main.append(tool_call(main_tool))
        other = history_class()(messages_and_choices=[tool_call(other_tool)])
        return art.Trajectory(messages_and_choices=main, additional_histories=[other], reward=0)

    group = art.TrajectoryGroup(
        [trajectory("multiply", "legs_per_animal"), trajectory(None, "multiply")]
    )
    model = art.Model(name="judged", project="tests")
    await artstore.record_group(store, group, run="tests/histories", model=model)

    await artstore.rescore(store, "tests/histories", ruler_for(judge), "ruler")

    (scored,) = await artstore.run_groups(store, "tests/histories", scorer="ruler")
    assert [t.reward for t in scored.trajectories] == [0.9, 0.1]  # the other history unseen
    assert [len(t.additional_histories) for t in scored.trajectories] == [1, 1]  # kept
