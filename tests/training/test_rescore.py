"""Re-scoring: new rewards from stored data, appended beside the old ones (both databases)."""

from __future__ import annotations

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import pytest
from sqlalchemy import func, select
from trained_run import latest_rewards, train_run

import artstore
from artstore.demo.task import make_scenarios, strict_reward
from artstore.errors import NotFoundError, RewardFunctionError
from artstore.groups import load_groups, sealed_groups
from artstore.schema import tables as t
from artstore.training.rescore import Rewards


@pytest.fixture(autouse=True)
def no_wandb(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WANDB_API_KEY", raising=False)


async def reward_rows(store, scorer: str) -> list[tuple[str, float, bool]]:
    r = t.rewards
    async with store.database.read() as connection:
        rows = await connection.execute(
            select(r.c.rollout_id, r.c.reward, r.c.rescored)
            .where(r.c.scorer == scorer)
            .order_by(r.c.id)
        )
        return [tuple(row) for row in rows]


async def test_rescoring_gets_the_stored_scenario_results_and_trajectories(store, tmp_path):
    trained = await train_run(store, tmp_path / ".art")
    seen = []

    def spy(scenario, results, trajectories):
        seen.append((scenario, results, trajectories))
        return [float(len(r["tools_used"])) for r in results]

    await artstore.rescore(store, trained.run, spy, "tools", concurrency=1)

    scenarios = make_scenarios(2)
    assert [s for s, _, _ in seen] == [scenarios[0], scenarios[1]] * 2
    for (_, results, trajectories), group_id in zip(seen, trained.group_ids, strict=True):
        (sealed,) = (await sealed_groups(store, [group_id])).values()
        assert len(results) == len(trajectories) == len(sealed.rollout_ids) == 3
        assert all(set(r) == {"answer", "tools_used"} for r in results)
        # Trajectories come with the rewards of the run's own scorer.
        assert [tr.reward for tr in trajectories] == await latest_rewards(store, group_id, "reward")
        assert all(tr.messages_and_choices for tr in trajectories)
    assert len(await reward_rows(store, "tools")) == 12


async def test_rescoring_appends_and_keeps_every_earlier_score(store, tmp_path):
    trained = await train_run(store, tmp_path / ".art")
    first = await reward_rows(store, "reward")

    await artstore.rescore(store, trained.run, strict_reward, "strict")
    await artstore.rescore(
        store, trained.run, lambda s, r, tr: [0.5] * len(tr), "strict", again=True
    )

    assert await reward_rows(store, "reward") == first  # untouched
    strict = await reward_rows(store, "strict")
    assert len(strict) == 24 and all(rescored for _, _, rescored in strict)
    # The latest score of a scorer is the one trained on; the earlier one is still there.
    for group_id in trained.group_ids:
        assert await latest_rewards(store, group_id, "strict") == [0.5, 0.5, 0.5]
    (group,) = await load_groups(store, [trained.group_ids[0]], "strict")
    assert [tr.reward for tr in group.trajectories] == [0.5, 0.5, 0.5]


async def test_reward_metrics_are_recorded_and_reach_the_trajectories(store, tmp_path):
    trained = await train_run(store, tmp_path / ".art")

    def judged(scenario, results, trajectories):
        return Rewards(
            [1.0, 0.0, 0.5], metrics=[{"confidence": 0.9, "judged": True}] * len(trajectories)
        )

    await artstore.rescore(store, trained.run, judged, "judge")

    (group,) = await load_groups(store, [trained.group_ids[0]], "judge")
    assert [tr.reward for tr in group.trajectories] == [1.0, 0.0, 0.5]
    assert all(
        tr.metrics["confidence"] == 0.9 and tr.metrics["judged"] is True
        for tr in group.trajectories
    )
    # The run's scorer knows nothing of them.
    (group,) = await load_groups(store, [trained.group_ids[0]], "reward")
    assert all("confidence" not in tr.metrics for tr in group.trajectories)


async def test_a_failing_reward_function_names_the_group_and_keeps_the_groups_before(
    store, tmp_path
):
    trained = await train_run(store, tmp_path / ".art")
    calls = []

    def flaky(scenario, results, trajectories):
        calls.append(scenario)
        if len(calls) == 3:
            raise ValueError("the judge is down")
        return [1.0] * len(trajectories)

    with pytest.raises(RewardFunctionError) as raised:
        await artstore.rescore(store, trained.run, flaky, "flaky", concurrency=1)

    message = str(raised.value)
    failed = trained.group_ids[2]
    assert f"group {failed}" in message and "ValueError: the judge is down" in message
    assert "2 of 4 groups" in message
    # The groups before keep their new scores; the failed one and those after have none,
    # and no half-written group exists: every group is scored whole or not at all.
    for group_id in trained.group_ids[:2]:
        assert await latest_rewards(store, group_id, "flaky") == [1.0, 1.0, 1.0]
    async with store.database.read() as connection:
        per_group = dict(
            (
                await connection.execute(
                    select(t.rewards.c.group_id, func.count())
                    .where(t.rewards.c.scorer == "flaky")
                    .group_by(t.rewards.c.group_id)
                )
            ).all()
        )
    assert per_group == {trained.group_ids[0]: 3, trained.group_ids[1]: 3}
    assert len(calls) == 3  # no group was started after the failure

    # Running it again finishes the job: it scores only what is missing.
    done = await artstore.rescore(store, trained.run, lambda s, r, tr: [0.0] * len(tr), "flaky")
    assert done == trained.group_ids[2:]
    assert await latest_rewards(store, trained.group_ids[0], "flaky") == [1.0, 1.0, 1.0]


async def test_unusable_rewards_are_refused_with_the_group_named(store, tmp_path):
    trained = await train_run(store, tmp_path / ".art", epochs=1, scenarios=1)
    (group_id,) = trained.group_ids

    with pytest.raises(RewardFunctionError, match=f"group {group_id}.*2 rewards for 3"):
        await artstore.rescore(store, trained.run, lambda s, r, tr: [1.0, 2.0], "short")
    with pytest.raises(RewardFunctionError, match="not a finite number"):
        await artstore.rescore(store, trained.run, lambda s, r, tr: [float("nan")] * 3, "nan")
    with pytest.raises(RewardFunctionError, match="metric 'why'"):
        await artstore.rescore(
            store, trained.run, lambda s, r, tr: Rewards([1.0] * 3, [{"why": "text"}] * 3), "why"
        )
    assert await reward_rows(store, "short") == []
    assert await reward_rows(store, "why") == []


async def test_unknown_run_group_or_scorer_is_a_clear_error(store, tmp_path):
    trained = await train_run(store, tmp_path / ".art", epochs=1, scenarios=1)
    with pytest.raises(NotFoundError, match="no run 'nope'"):
        await artstore.rescore(store, "nope", strict_reward, "strict")
    with pytest.raises(NotFoundError, match="not a sealed group"):
        await artstore.rescore(store, trained.run, strict_reward, "strict", group_ids=["g-unknown"])
    with pytest.raises(ValueError, match="scorer must not be empty"):
        await artstore.rescore(store, trained.run, strict_reward, " ")
