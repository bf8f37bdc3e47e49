"""What each train step trained (`train_steps.num_trajectories`, `reward_mean`) and each
rollout's reward (`rollouts.reward`), kept on their rows by artstore/projections/trained.py
and rollout_rewards.py: always what v_train_steps and v_rollouts joined at query time
before revision 0009, whatever the order the events come in.

The reference here is worked out from other views (v_rollouts for a rollout's group and
role, v_latest_rewards for its latest reward by the step's scorer), not from the columns
under test. Every test runs on SQLite and on PostgreSQL.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
from alembic import command
from recorded_run import record_run

from artstore.analysis import query
from artstore.events import (
    GroupSealed,
    RewardsRecorded,
    RolloutFinished,
    RolloutStarted,
    RunStarted,
    TrainStepCompleted,
    TrainStepStarted,
)
from artstore.schema import migrate

RUN = "trained/agent"
MODEL = "trained/agent"
AT = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


async def _rows(store, sql: str) -> list[dict]:
    result = await query(store, sql)
    return [dict(zip(result.columns, row, strict=True)) for row in result.rows]


async def trained_by_step(store) -> dict[int, tuple[int, float | None]]:
    """Each step's (num_trajectories, reward_mean) as v_train_steps shows them."""
    steps = await _rows(store, "SELECT id, num_trajectories, reward_mean FROM v_train_steps")
    return {s["id"]: (s["num_trajectories"], s["reward_mean"]) for s in steps}


async def expected_by_step(store) -> dict[int, tuple[int, float | None]]:
    """The same worked out from v_rollouts and v_latest_rewards."""
    steps = await _rows(store, "SELECT id, scorer, group_ids FROM v_train_steps")
    rollouts = await _rows(store, "SELECT rollout_id, group_id, role FROM v_rollouts")
    latest = {
        (r["rollout_id"], r["scorer"]): r["reward"]
        for r in await _rows(store, "SELECT rollout_id, scorer, reward FROM v_latest_rewards")
    }
    expected = {}
    for step in steps:
        groups = json.loads(step["group_ids"]) if step["group_ids"] else []
        rewards = [
            latest[r["rollout_id"], step["scorer"]]
            for group in groups
            for r in rollouts
            if r["group_id"] == group
            and r["role"] != "validation"
            and (r["rollout_id"], step["scorer"]) in latest
        ]
        expected[step["id"]] = (len(rewards), sum(rewards) / len(rewards) if rewards else None)
    return expected


async def assert_rollout_rewards(store) -> None:
    """v_rollouts.reward (kept on the rollout's row) is its latest by the run's scorer."""
    rollouts = await _rows(store, "SELECT rollout_id, scorer, reward FROM v_rollouts")
    latest = {
        (r["rollout_id"], r["scorer"]): r["reward"]
        for r in await _rows(store, "SELECT rollout_id, scorer, reward FROM v_latest_rewards")
    }
    for r in rollouts:
        assert r["reward"] == latest.get((r["rollout_id"], r["scorer"])), r


async def assert_as_joined(store) -> dict[int, tuple[int, float | None]]:
    await assert_rollout_rewards(store)
    found, expected = await trained_by_step(store), await expected_by_step(store)
    assert found.keys() == expected.keys()
    for step_id, (count, mean) in expected.items():
        assert found[step_id][0] == count
        assert found[step_id][1] == (None if mean is None else pytest.approx(mean, rel=1e-12))
    return found


def _started(rollout_id: str, group_id: str | None, role: str = "policy") -> RolloutStarted:
    return RolloutStarted(
        rollout_id=rollout_id,
        run=RUN,
        group_id=group_id,
        model=MODEL,
        role=role,  # type: ignore[arg-type]
        policy_step=0,
        started_at=AT,
    )


def _run_started(scorer: str) -> RunStarted:
    return RunStarted(
        run=RUN,
        project="trained",
        model="agent",
        config={},
        scenarios=[],
        scorer=scorer,
        trainer="host:1",
    )


async def _rollout(store, rollout_id: str, group_id: str | None, role: str = "policy") -> None:
    await store.append(
        f"rollout-{rollout_id}",
        [
            _started(rollout_id, group_id, role),
            RolloutFinished(rollout_id=rollout_id, duration_s=1.0),
        ],
    )


async def test_a_step_follows_rewards_members_and_rollouts_that_come_after_it(store):
    await store.append(f"run-{RUN}", [_run_started(scorer="correct")])
    # Rollouts recorded outside any group (`wrap_rollout`): the seal gives them one later.
    await _rollout(store, "a1", None)
    await _rollout(store, "a2", None)
    await _rollout(store, "av", None, role="validation")
    await store.append(
        "group-ga",
        [RewardsRecorded(group_id="ga", scorer="correct", rewards={"a1": 0.5, "a2": 0.25})],
    )
    started = TrainStepStarted(
        run=RUN, model=MODEL, step=0, group_ids=["ga", "gb"], scorer="correct", trainer="t"
    )
    await store.append(f"train-{RUN}", [started])
    [step_id] = (await trained_by_step(store)).keys()
    assert (await assert_as_joined(store))[step_id] == (0, None)  # no member has the group yet

    sealed = GroupSealed(group_id="ga", run=RUN, rollout_ids=["a1", "a2"])
    await store.append("group-ga", [sealed])
    found = await assert_as_joined(store)
    assert found[step_id] == (2, pytest.approx(0.375))

    # A rollout of "gb" recorded after the step, rewarded after it; then re-scored.
    await _rollout(store, "b1", "gb")
    assert (await assert_as_joined(store))[step_id][0] == 2
    await store.append(
        "group-gb", [RewardsRecorded(group_id="gb", scorer="correct", rewards={"b1": 1.0})]
    )
    assert (await assert_as_joined(store))[step_id] == (3, pytest.approx(1.75 / 3))
    await store.append(
        "group-gb",
        [
            RewardsRecorded(
                group_id="gb", scorer="correct", rewards={"b1": 0.0, "av": 1.0}, rescored=True
            ),
            RewardsRecorded(group_id="gb", scorer="judge", rewards={"b1": 0.75}),
        ],
    )
    assert (await assert_as_joined(store))[step_id] == (3, pytest.approx(0.75 / 3))

    completed = TrainStepCompleted(
        run=RUN, model=MODEL, step=1, group_ids=["ga", "gb"], scorer="correct"
    )
    await store.append(f"train-{RUN}", [completed])
    assert (await assert_as_joined(store))[step_id] == (3, pytest.approx(0.75 / 3))

    before = sorted((await trained_by_step(store)).values())
    await store.rebuild_projections()
    assert sorted((await assert_as_joined(store)).values()) == before


async def test_one_append_with_the_whole_run_in_it(store):
    """Rollouts, rewards, seal and step in one transaction (the bulk projection's case)."""
    step = TrainStepStarted(
        run=RUN, model=MODEL, step=0, group_ids=["gc"], scorer="reward", trainer="t"
    )
    appends = [
        ("rollout-c1", _started("c1", "gc")),
        ("rollout-c1", RolloutFinished(rollout_id="c1", duration_s=1.0)),
        ("rollout-c2", _started("c2", "gc")),
        ("group-gc", RewardsRecorded(group_id="gc", scorer="reward", rewards={"c1": 0.125})),
        ("group-gc", GroupSealed(group_id="gc", run=RUN, rollout_ids=["c1", "c2"])),
        (f"train-{RUN}", step),
        ("group-gc", RewardsRecorded(group_id="gc", scorer="reward", rewards={"c2": 0.5})),
        ("group-gc", RewardsRecorded(group_id="gc", scorer="reward", rewards={"c2": 1.0})),
    ]
    transactions = store.transactions
    futures = [store.append_nowait(stream, [event]) for stream, event in appends]
    for future in futures:
        await future
    found = await assert_as_joined(store)
    assert list(found.values()) == [(2, pytest.approx(1.125 / 2))]
    assert store.transactions == transactions + 1  # the whole run in one


async def test_revision_0009_fills_in_what_the_steps_of_a_stored_run_trained(store):
    """Downgraded to 0008 (the join at query time, no columns) and upgraded again: the
    same numbers, summed by the revision's own SQL."""
    await record_run(store)
    before = await trained_by_step(store)

    def migrate_to(connection, revision: str, up: bool) -> None:
        config = migrate.alembic_config()
        config.attributes["connection"] = connection
        (command.upgrade if up else command.downgrade)(config, revision)

    async with store.database.write() as connection:
        await connection.run_sync(migrate_to, "0008", False)
        await connection.run_sync(migrate_to, "head", True)
    assert await trained_by_step(store) == before
    await assert_as_joined(store)


async def test_a_rollout_reward_follows_its_run_scorer_set_later(store):
    """Rollouts recorded under a run nobody started (scorer `reward`), then the run starts
    with scorer `correct`: v_rollouts shows the rewards by `correct` from then on."""
    await _rollout(store, "d1", "gd")
    await store.append(
        "group-gd",
        [
            RewardsRecorded(group_id="gd", scorer="correct", rewards={"d1": 0.75}),
            RewardsRecorded(group_id="gd", scorer="reward", rewards={"d1": 0.5}),
        ],
    )
    await assert_rollout_rewards(store)
    assert [r["reward"] for r in await _rows(store, "SELECT reward FROM v_rollouts")] == [0.5]
    await store.append(f"run-{RUN}", [_run_started(scorer="correct")])
    await assert_rollout_rewards(store)
    assert [r["reward"] for r in await _rows(store, "SELECT reward FROM v_rollouts")] == [0.75]
    await store.rebuild_projections()
    assert [r["reward"] for r in await _rows(store, "SELECT reward FROM v_rollouts")] == [0.75]
