"""Invariant 5: a crash at any instant loses no finished rollout and trains no group twice.

tests/support/crash_driver.py trains a small run (3 scenarios, batches of 2 and 1, 3 epochs:
6 steps, 9 groups of 2 policy + 1 validation rollouts) and SIGKILLs itself at a chosen point;
the test runs it again and again until it completes, so that one run goes through every
crash point below, each followed by a resume:

    rollout:4          the 4th rollout, once a sibling finished (a group half done)
    sealed:2           right after the 2nd group.sealed committed
    train-start:1      inside backend.train, before it wrote anything
    train-end:1        inside backend.train, after the new checkpoint was written
    before-completed:1 backend.train returned, train_step.completed not yet appended
    after-completed:1  train_step.completed committed, before model.log and the push
    push:2             inside _experimental_push_to_s3 (the 2nd push of that process)
    rollout:2          the 2nd rollout of a later batch
    before-finished:1  everything trained, run.finished not yet appended

The runs are those of tests/support/crash_runs.py: each a process of its own, killed for real.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from pathlib import Path
from typing import Any

import crash_driver
import pytest
from crash_runs import (
    Snapshot,
    driver_checkpoints,
    forkserver,
    groups_in_checkpoints,
    points_in_budget,
    run_driver,
    run_until_finished,
)
from training_helpers import assert_consistent, rows

import artstore
from artstore.events import RolloutFailed
from artstore.groups import group_id_for
from artstore.schema import tables as t
from artstore.training.lease import trainer_lease

PLAN = [  # each point in CI on one of the databases, on both under ARTSTORE_LONG=1
    "rollout:4",
    "sealed:2",
    "train-start:1",
    "train-end:1",
    "before-completed:1",
    "after-completed:1",
    "push:2",
    "rollout:2",
    "before-finished:1",
]
RUN = f"{crash_driver.PROJECT}/{crash_driver.MODEL_NAME}"
NUM_SCENARIOS = len(crash_driver.SCENARIOS)
BATCHES_PER_EPOCH = -(-NUM_SCENARIOS // crash_driver.BATCH_SIZE)
NUM_STEPS = crash_driver.EPOCHS * BATCHES_PER_EPOCH


@pytest.fixture(scope="module")
def processes() -> Any:
    return forkserver(
        [
            "crash_driver",
            "art",
            "art.langgraph",
            "langchain_openai",
            "artstore.store",
            "artstore.training",
            "artstore.backends",
            "artstore.testing.inference_server",
        ]
    )


@pytest.mark.slow
async def test_killed_at_every_point_and_resumed_trains_each_group_once(
    database_url: str, tmp_path: Path, processes: Any
) -> None:
    workdir = tmp_path / "crash"
    workdir.mkdir()
    plan = points_in_budget(PLAN, database_url)
    async with await artstore.open_store(database_url) as store:
        seen = await run_until_finished(
            store, processes, crash_driver.train, database_url, workdir, plan, timeout_s=120
        )
        await check_run(store, seen, workdir, plan)


async def check_run(
    store: artstore.Store, seen: list[Snapshot], workdir: Path, plan: list[str]
) -> None:
    points = Counter(point.split(":")[0] for point in plan)
    group_size, validation_samples = crash_driver.GROUP_SIZE, crash_driver.VALIDATION_SAMPLES
    (run,) = await rows(store, t.runs)
    assert run.status == "finished"
    groups = {g.group_id: g for g in await rows(store, t.groups)}
    assert set(groups) == {
        group_id_for(RUN, epoch, index)
        for epoch in range(crash_driver.EPOCHS)
        for index in range(NUM_SCENARIOS)
    }

    # No finished rollout was lost or regenerated: each group holds exactly group_size
    # finished policy rollouts (and its validation rollouts), and every rollout that had
    # finished at any crash is one of them.
    rollouts = {r.rollout_id: r for r in await rows(store, t.rollouts)}
    sealed = {
        e.group_id: e
        for e in [
            recorded.decode()
            for recorded in await store.read_all(limit=100_000, types=["group.sealed"])
        ]
    }
    members = {rid for e in sealed.values() for rid in [*e.rollout_ids, *e.validation_rollout_ids]}
    for group_id, event in sealed.items():
        finished = [
            r for r in rollouts.values() if r.group_id == group_id and r.status == "finished"
        ]
        assert Counter(r.role for r in finished) == {
            "policy": group_size,
            "validation": validation_samples,
        }
        assert sorted(event.rollout_ids + event.validation_rollout_ids) == sorted(
            r.rollout_id for r in finished
        )
    ever_finished = set().union(*(s["finished"] for s in seen))
    assert ever_finished <= members
    assert all(rollouts[rid].status == "finished" for rid in ever_finished)
    # Rollouts in flight at a crash were recorded as abandoned and rolled out again.
    in_flight = set().union(*(s["running"] for s in seen))
    assert in_flight or not points["rollout"], "no crash caught a rollout in flight"
    unfinished = {r.rollout_id: r for r in rollouts.values() if r.status != "finished"}
    assert set(unfinished) == in_flight, [
        (r.status, r.error_type, r.error_message, r.group_id)
        for rid, r in unfinished.items()
        if rid not in in_flight
    ]
    for rid in in_flight:
        failed = (await store.read_stream(f"rollout-{rid}"))[-1].decode()
        assert isinstance(failed, RolloutFailed) and failed.error_type == "RolloutAbandoned"
    half_done = [
        s for s in seen for rid in s["finished"] if rollouts[rid].group_id not in s["sealed"]
    ]
    # (the kill at the second seal comes while the next group has finished rollouts)
    assert half_done or "sealed:2" not in plan, "no crash left a finished rollout unsealed"

    # Every group was trained exactly once, batch by batch.
    consumptions = await rows(store, t.group_consumptions)
    assert sorted(c.group_id for c in consumptions) == sorted(groups)
    steps = await rows(store, t.train_steps)
    completed = sorted((s for s in steps if s.status == "completed"), key=lambda s: s.step)
    assert [s.step for s in completed] == list(range(1, NUM_STEPS + 1))
    for step in completed:
        assert {groups[g].batch for g in step.group_ids} == {step.step - 1}
    assert Counter(g for s in completed for g in s.group_ids) == Counter(set(groups))
    # A step killed after the backend trained it is reconciled; one killed before, failed.
    assert sum(s.reconciled for s in completed) == points["train-end"] + points["before-completed"]
    failed_steps = [s for s in steps if s.status == "failed"]
    assert [s.error_type for s in failed_steps] == ["TrainerStopped"] * points["train-start"]
    assert not [s for s in steps if s.status == "started"]

    # The backend agrees: one checkpoint per step, each group in exactly one of them.
    backend, model = driver_checkpoints(workdir, crash_driver)
    assert backend._current_step(model) == NUM_STEPS
    in_checkpoints = groups_in_checkpoints(workdir, crash_driver, completed, key="group_id")
    assert in_checkpoints == Counter(set(groups))
    history = backend.model_dir(model) / "trajectories" / "train"
    assert sorted(p.name for p in history.glob("*.parquet")) == [
        f"{s:04d}.parquet" for s in range(1, NUM_STEPS + 1)
    ]  # model.log ran for every step, reconciled ones included
    assert completed[-1].pushed_to is not None
    bucket = workdir / "bucket" / crash_driver.PROJECT / "models" / crash_driver.MODEL_NAME
    assert (bucket / "checkpoints" / f"{NUM_STEPS:04d}").is_dir()

    # Sealed groups were trained before anything new was rolled out: a rollout of batch b
    # starts only after every group of the batches before b was consumed.
    consumed_at: dict[str, int] = {}
    async for recorded in store.iter_all(types=["rollout.started", "train_step.completed"]):
        if recorded.type == "train_step.completed":
            for group_id in recorded.data["group_ids"]:
                consumed_at[group_id] = recorded.position
            continue
        batch = groups[recorded.data["group_id"]].batch
        earlier = [g for g in groups if groups[g].batch < batch]
        assert all(consumed_at.get(g, recorded.position) < recorded.position for g in earlier)

    types = Counter(e.type for e in await store.read_all(limit=100_000))
    assert types["run.resumed"] == len(seen)  # one resume per kill
    assert types["run.finished"] == 1
    await assert_consistent(store)


@pytest.mark.slow
async def test_an_agent_that_fails_now_and_then_killed_and_resumed_keeps_each_rollout_once(
    database_url: str, tmp_path: Path, processes: Any
) -> None:
    """TrainingFramework with failed rollouts in groups (left out of them) and kills while
    such a group is half done, once it is sealed, and inside training: each rollout ends
    in one group at most, as a member or a failure, and each group is trained once."""
    workdir = tmp_path / "crash"
    workdir.mkdir()
    (workdir / "fail.json").write_text(json.dumps([[0, 0, 2], [0, 1, 3], [0, 2, 1]]))
    plan = ["rollout:4", "sealed:2", "train-start:1"]
    async with await artstore.open_store(database_url) as store:
        await run_until_finished(
            store, processes, crash_driver.train, database_url, workdir, plan, timeout_s=120
        )
        (run,) = await rows(store, t.runs)
        assert run.status == "finished"
        sealed = {
            e.group_id: e
            for e in (
                r.decode() for r in await store.read_all(limit=100_000, types=["group.sealed"])
            )
        }
        assert len(sealed) == crash_driver.EPOCHS * NUM_SCENARIOS
        members = Counter(
            rid for e in sealed.values() for rid in [*e.rollout_ids, *e.validation_rollout_ids]
        )
        assert set(members.values()) == {1}
        failed_on_purpose = 0
        for rid, rollout in {r.rollout_id: r for r in await rows(store, t.rollouts)}.items():
            seal = sealed[rollout.group_id]
            assert rid in members or rid in seal.failed_rollout_ids, rid
            assert (rollout.status == "finished") == (rid in members)
            failed_on_purpose += rollout.error_type == "AgentFailure"
        assert failed_on_purpose == len(list(workdir.glob("failed-0-*"))) > 0
        consumptions = await rows(store, t.group_consumptions)
        assert Counter(c.group_id for c in consumptions) == Counter(set(sealed))
        steps = await rows(store, t.train_steps)
        completed = sorted((s for s in steps if s.status == "completed"), key=lambda s: s.step)
        assert [s.step for s in completed] == list(range(1, NUM_STEPS + 1))
        assert not [s for s in steps if s.status == "started"]
        in_checkpoints = groups_in_checkpoints(workdir, crash_driver, completed, key="group_id")
        assert in_checkpoints == Counter(set(sealed))
        await assert_consistent(store)


async def test_a_crash_while_reconciling_a_step_leaves_arts_history_whole(
    database_url: str, tmp_path: Path, processes: Any
) -> None:
    """A step trained before a crash is logged to ART's history before it is recorded.

    The first crash, inside backend.train once the checkpoint is written, leaves step 1
    trained but neither logged nor recorded; the next start reconciles it and is killed
    just before the record, the one after that just after it. ART's history
    (`model.log`'s parquet files) must hold step 1 all the same.
    """
    plan = ["train-end:1", "before-reconciled:1", "after-reconciled:1"]
    workdir = tmp_path / "reconcile"
    workdir.mkdir()
    async with await artstore.open_store(database_url) as store:
        await run_until_finished(
            store, processes, crash_driver.train, database_url, workdir, plan, timeout_s=120
        )
        steps = await rows(store, t.train_steps)
        completed = sorted(s.step for s in steps if s.status == "completed")
        assert completed == list(range(1, NUM_STEPS + 1))
        assert [s.step for s in steps if s.reconciled] == [1]  # reconciled once, recorded once
    backend, model = driver_checkpoints(workdir, crash_driver)
    history = backend.model_dir(model) / "trajectories"
    assert sorted(p.name for p in (history / "train").glob("*.parquet")) == [
        f"{s:04d}.parquet" for s in range(1, NUM_STEPS + 1)
    ]


async def test_a_trainer_in_another_process_gets_a_clear_error(
    database_url: str, tmp_path: Path, processes: Any
) -> None:
    async with await artstore.open_store(database_url) as store:
        async with trainer_lease(store.database, RUN, RUN):  # as a running trainer holds it
            code = await asyncio.to_thread(
                run_driver,
                processes,
                crash_driver.train,
                database_url,
                tmp_path,
                0,
                [],
                timeout_s=120,
            )
        log = (tmp_path / "log-0.txt").read_text()
        assert (
            code == 1 and "TrainerConflictError: crashtest/crash is being trained by another" in log
        )
        assert await store.read_all() == []  # refused before writing anything
