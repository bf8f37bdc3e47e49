"""Replay: a run's stored groups train a model that has not consumed them (both databases)."""

from __future__ import annotations

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import pytest
from sqlalchemy import select
from trained_run import (
    checkpoint_record,
    event_count,
    latest_rewards,
    new_model,
    train_run,
)

import artstore
from artstore.backends import group_advantages
from artstore.demo.task import strict_reward
from artstore.errors import NotFoundError
from artstore.schema import tables as t


@pytest.fixture(autouse=True)
def no_wandb(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WANDB_API_KEY", raising=False)


async def consumption(store, run: str) -> dict[str, set[str]]:
    """model -> ids of the run's groups it consumed."""
    gc = t.group_consumptions
    found: dict[str, set[str]] = {}
    async with store.database.read() as connection:
        for row in await connection.execute(
            select(gc.c.model, gc.c.group_id).where(gc.c.run == run)
        ):
            found.setdefault(row.model, set()).add(row.group_id)
    return found


async def test_rescored_run_replays_into_a_second_model_on_the_new_scores(store, tmp_path):
    trained = await train_run(store, tmp_path / ".art")
    old = {g: await latest_rewards(store, g, "reward") for g in trained.group_ids}

    scored = await artstore.rescore(store, trained.run, strict_reward, "strict")
    second = await new_model(tmp_path / ".art", "second")
    plan = await artstore.replay(store, trained.run, second, scorer="strict")

    assert scored == trained.group_ids
    # Earlier scores stay: the run's own scorer still gives the rewards it trained on.
    assert {g: await latest_rewards(store, g, "reward") for g in trained.group_ids} == old
    # Consumption is per model: the run's model and the second one each consumed every group.
    assert await consumption(store, trained.run) == {
        trained.model: set(trained.group_ids),
        "tests/second": set(trained.group_ids),
    }
    assert plan.trained_steps == [1, 2, 3, 4] and await second.get_step() == 4
    # The second model trained on the new scorer: CheckOnlyBackend's record of each step
    # holds the advantages of the strict rewards, not of the run's.
    for step, planned in zip(plan.trained_steps, plan.steps, strict=True):
        record = checkpoint_record(tmp_path / ".art", "second", step)
        expected = [
            group_advantages(await latest_rewards(store, g.group_id, "strict")) for g in planned
        ]
        assert len(record["advantages"]) == len(expected)
        for recorded, wanted in zip(record["advantages"], expected, strict=True):
            assert recorded == pytest.approx(wanted)
        assert [m["group_id"] for m in record["group_metadata"]] == [g.group_id for g in planned]
        assert record["metrics"]["reward_mean"] == pytest.approx(
            sum(r for g in planned for r in g.rewards) / sum(len(g.rewards) for g in planned)
        )
    async with store.database.read() as connection:
        scorers = (
            (
                await connection.execute(
                    select(t.train_steps.c.scorer).where(t.train_steps.c.model == "tests/second")
                )
            )
            .scalars()
            .all()
        )
    assert scorers == ["strict"] * 4

    # Replaying again trains nothing: every group is consumed by the second model.
    again = await artstore.replay(store, trained.run, second, scorer="strict")
    assert again.steps == [] and again.consumed == 4 and await second.get_step() == 4


async def test_dry_run_plans_rewards_advantages_and_staleness_and_writes_nothing(store, tmp_path):
    trained = await train_run(store, tmp_path / ".art")
    second = await new_model(tmp_path / ".art", "second")
    before = await event_count(store)

    plan = await artstore.replay(store, trained.run, second, dry_run=True)

    assert await event_count(store) == before
    assert await second.get_step() == 0
    assert plan.model == "tests/second" and plan.scorer == "reward" and plan.model_step == 0
    # batch_size 1: one group per step, generated at policy steps 0..3, trained at 0..3.
    assert [[g.group_id for g in step] for step in plan.steps] == [[g] for g in trained.group_ids]
    for index, group in enumerate(plan.groups):
        assert group.step == index
        assert group.policy_step == index
        assert group.staleness == 0
        assert group.rewards == await latest_rewards(store, group.group_id, "reward")
        assert group.advantages == pytest.approx(group_advantages(group.rewards))


async def test_max_staleness_skips_groups_generated_too_long_ago(store, tmp_path):
    trained = await train_run(store, tmp_path / ".art")
    second = await new_model(tmp_path / ".art", "second")
    for _ in range(4):  # the second model has trained 4 steps elsewhere
        await second.backend().train(second, [])

    # One step with every group, at step 4: staleness 4 - policy step = 4, 3, 2, 1.
    plan = await artstore.replay(
        store, trained.run, second, groups_per_step=4, max_staleness=2, dry_run=True
    )
    assert [g.staleness for g in plan.groups] == [2, 1]
    assert [g.staleness for g in plan.skipped_stale] == [4, 3]

    plan = await artstore.replay(store, trained.run, second, groups_per_step=4, max_staleness=2)
    assert plan.trained_steps == [5]
    consumed = (await consumption(store, trained.run))["tests/second"]
    assert consumed == set(trained.group_ids[2:])  # the stale ones stay unconsumed


async def test_staleness_counts_the_steps_trained_before_the_group(store, tmp_path):
    trained = await train_run(store, tmp_path / ".art")
    second = await new_model(tmp_path / ".art", "second")
    for _ in range(3):
        await second.backend().train(second, [])

    # Steps 3, 4, 5, 6 train groups of policy steps 0, 1, 2, 3: each 3 steps old.
    plan = await artstore.replay(store, trained.run, second, dry_run=True)
    assert [g.staleness for g in plan.groups] == [3, 3, 3, 3]
    # Skipping the first group makes the others train one step earlier: 2 steps old.
    plan = await artstore.replay(store, trained.run, second, max_staleness=2, dry_run=True)
    assert [g.staleness for g in plan.skipped_stale] == [3]
    assert [(g.step, g.policy_step, g.staleness) for g in plan.groups] == [
        (0, 1, 2),
        (1, 2, 2),
        (2, 3, 2),
    ]


async def test_unknown_run_is_a_clear_error(store, tmp_path):
    second = await new_model(tmp_path / ".art", "second")
    with pytest.raises(NotFoundError, match="no run 'nope'"):
        await artstore.replay(store, "nope", second)
    with pytest.raises(NotFoundError, match="no run 'nope'"):
        await artstore.replay(store, "nope", second, dry_run=True)
