"""A loop of ART's own kind, made durable by artstore, killed at every point and resumed.

tests/support/loop_crash_driver.py runs ART's canonical loop (an OpenAI-client agent with tools,
`gather_trajectory_groups`, `backend.train`, `model.log`) for 4 steps of 2 groups of 2
rollouts, with the recording backend, durable rollouts and the group recorder, and
SIGKILLs itself at a chosen point. The test runs it again and again until it completes:

    rollout:3          a group half done (one rollout finished, its sibling in flight)
    sealed:1           right after the first group.sealed committed
    train-start:1      inside backend.train, before it wrote anything
    train-end:1        inside backend.train, after the new checkpoint was written
    before-completed:1 backend.train returned, train_step.completed not yet appended
    after-completed:1  train_step.completed committed, before model.log
    rollout:2          the 2nd rollout of a later step
    sealed:2           a batch half sealed
    before-finished:1  everything trained, run.finished not yet appended

Then: no group was trained twice (the store's consumptions and the backend's own
checkpoints agree), no finished rollout was rolled out again, every step trained its
step's groups, and the projections equal a rebuild from the events.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import loop_crash_driver as driver
import pytest
from crash_runs import (
    Snapshot,
    driver_checkpoints,
    forkserver,
    groups_in_checkpoints,
    points_in_budget,
    run_until_finished,
)
from training_helpers import rows

import artstore
from artstore.events import RolloutFailed
from artstore.schema import tables as t
from artstore.training.durable import durable_group_id

PLAN = [  # each point in CI on one of the databases, on both under ARTSTORE_LONG=1
    "rollout:3",
    "sealed:1",
    "train-start:1",
    "train-end:1",
    "before-completed:1",
    "after-completed:1",
    "rollout:2",
    "sealed:2",
    "before-finished:1",
]


@pytest.fixture(scope="module")
def processes() -> Any:
    return forkserver(
        ["loop_crash_driver", "art", "openai", "artstore.store", "artstore.training.backend"]
    )


@pytest.mark.slow
async def test_a_durable_user_loop_killed_at_every_point_trains_each_group_once(
    database_url: str, tmp_path: Path, processes: Any
) -> None:
    workdir = tmp_path / "loop"
    workdir.mkdir()
    plan = points_in_budget(PLAN, database_url)
    async with await artstore.open_store(database_url) as store:
        seen = await run_until_finished(
            store, processes, driver.train, database_url, workdir, plan, timeout_s=180
        )
        await check_run(store, seen, workdir, plan)


async def check_run(
    store: artstore.Store, seen: list[Snapshot], workdir: Path, plan: list[str]
) -> None:
    points = Counter(point.split(":")[0] for point in plan)
    (run,) = await rows(store, t.runs)
    assert (run.run, run.status, run.model, run.scorer) == (
        driver.RUN,
        "finished",
        "agent",
        "reward",
    )
    # Each step's groups are the durable groups of its scenarios, each of GROUP_SIZE
    # finished rollouts: what finished before a crash was handed out again, not redone.
    groups = {g.group_id: g for g in await rows(store, t.groups)}
    expected = {
        durable_group_id(driver.RUN, step, scenario): step
        for step in range(driver.STEPS)
        for scenario in driver.batch_for(step)
    }
    assert {g: groups[g].batch for g in groups} == expected
    rollouts = {r.rollout_id: r for r in await rows(store, t.rollouts)}
    finished = [r for r in rollouts.values() if r.status == "finished"]
    assert Counter(r.group_id for r in finished) == dict.fromkeys(expected, driver.GROUP_SIZE)
    sealed = {
        e.group_id: e
        for e in (r.decode() for r in await store.read_all(limit=100_000, types=["group.sealed"]))
    }
    members = {rid for e in sealed.values() for rid in e.rollout_ids}
    assert members == {r.rollout_id for r in finished}
    ever_finished = set().union(*(s["finished"] for s in seen))
    assert ever_finished <= members
    # Rollouts in flight at a crash were recorded as abandoned when their group was sealed.
    in_flight = set().union(*(s["running"] for s in seen))
    assert in_flight or not points["rollout"], "no crash caught a rollout in flight"
    unfinished = {rid for rid, r in rollouts.items() if r.status != "finished"}
    assert unfinished == in_flight
    for rid in in_flight:
        failed = (await store.read_stream(f"rollout-{rid}"))[-1].decode()
        assert isinstance(failed, RolloutFailed) and failed.error_type == "RolloutAbandoned"

    # Every group was trained exactly once, step by step, and the backend agrees.
    consumptions = await rows(store, t.group_consumptions)
    assert sorted(c.group_id for c in consumptions) == sorted(expected)
    steps = await rows(store, t.train_steps)
    completed = sorted((s for s in steps if s.status == "completed"), key=lambda s: s.step)
    assert [s.step for s in completed] == list(range(1, driver.STEPS + 1))
    for step in completed:
        assert {expected[g] for g in step.group_ids} == {step.step - 1}
    # A step killed after the backend trained it is reconciled; one killed before, failed.
    assert sum(s.reconciled for s in completed) == points["train-end"] + points["before-completed"]
    failed_steps = [s.error_type for s in steps if s.status == "failed"]
    assert failed_steps == ["TrainerStopped"] * points["train-start"]
    assert not [s for s in steps if s.status == "started"]
    backend, model = driver_checkpoints(workdir, driver)
    assert backend._current_step(model) == driver.STEPS
    assert groups_in_checkpoints(workdir, driver, completed) == Counter(list(expected))
    from training_helpers import projections

    before = await projections(store)
    await store.rebuild_projections()
    assert await projections(store) == before
