"""A durable loop of the user's own whose agent fails now and then, killed and resumed:
no trajectory is recorded twice, none is trained twice, none is lost.

tests/support/loop_crash_driver.py runs ART's canonical loop made durable (recording backend,
`durable_rollouts`, `group_recorder`) with `max_exceptions`, an agent that fails chosen
rollouts once, and a SIGKILL at chosen points; the loop is run again until it finishes.
Each trajectory the agent returned carries an attempt id of its own, so a copy of a
trajectory (a second rollout of the same attempt) is told from two trajectories alike.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import loop_crash_driver as driver
import pytest
from budget import LONG
from crash_runs import driver_checkpoints, forkserver, groups_in_checkpoints, run_until_finished
from training_helpers import projections, rows

import artstore
from artstore.schema import tables as t
from artstore.training.durable import durable_group_id


@pytest.fixture(scope="module")
def processes() -> Any:
    return forkserver(
        ["loop_crash_driver", "art", "openai", "artstore.store", "artstore.training.backend"]
    )


async def run_loop(
    database_url: str, tmp_path: Path, processes: Any, options: driver.Options, plan: list[str]
) -> Path:
    workdir = tmp_path / "loop"
    workdir.mkdir()
    options.write(workdir)
    async with await artstore.open_store(database_url) as store:
        await run_until_finished(
            store, processes, driver.train, database_url, workdir, plan, timeout_s=180
        )
        await check_each_trajectory_once(store, workdir, options)
    return workdir


@pytest.mark.slow
async def test_a_group_sealed_with_a_failed_rollout_before_a_crash_is_trained_as_it_was(
    database_url: str, tmp_path: Path, processes: Any
) -> None:
    """Issue 24, item 1, as worded: one rollout of a group of 4 fails, the process dies
    after gathering and before training, and the loop starts again."""
    options = driver.Options(steps=2, group_size=4, max_exceptions=2, fail=[[0, 0, 2]])
    workdir = await run_loop(database_url, tmp_path, processes, options, ["sealed:2"])
    async with await artstore.open_store(database_url) as store:
        first = durable_group_id(driver.RUN, 0, driver.batch_for(0)[0])
        (seal,) = [
            e.decode()
            for e in await store.read_stream(f"group-{first}")
            if e.type == "group.sealed"
        ]
        assert len(seal.rollout_ids) == 3 and len(seal.failed_rollout_ids) == 1
        failed = await rows(store, t.rollouts, t.rollouts.c.rollout_id.in_(seal.failed_rollout_ids))
        assert [(r.status, r.error_type) for r in failed] == [("failed", "AgentFailure")]
    assert (workdir / "failed-0-0-2").exists()


LAST_STEP_PLANS = [
    ["before-completed:2", "before-reconciled:1"],
    *(
        [["train-end:2"], ["train-end:2", "after-reconciled:1"], ["before-completed:2"]]
        if LONG
        else []
    ),
]


@pytest.mark.slow
@pytest.mark.parametrize("plan", LAST_STEP_PLANS, ids=lambda plan: ",".join(plan))
async def test_a_crash_inside_the_last_steps_training_is_settled_when_the_loop_starts_again(
    database_url: str, tmp_path: Path, processes: Any, plan: list[str]
) -> None:
    """The backend finished the last step, the trainer died before recording it: started
    again, the loop has nothing left to train, and registering the model settles the step
    (its groups consumed once) before the run is finished."""
    options = driver.Options(steps=2, group_size=2)
    await run_loop(database_url, tmp_path, processes, options, plan)
    async with await artstore.open_store(database_url) as store:
        steps = await rows(store, t.train_steps)
        assert [(s.step, s.reconciled) for s in steps] == [(1, False), (2, True)]


# The agent fails now and then; under @art.retry (2 attempts) a failure is retried, and
# two in a row reach ART's gather (counted by max_exceptions). Steps' scenarios: 0 and 1,
# 2 and 0, 1 and 2.
FAILING = {
    "max_exceptions": 2,
    "fail": [[0, 0, 2], [0, 0, 3], [1, 2, 1], [2, 1, 1], [2, 1, 2]],
}
# Per pattern: its loop, a few representative kills in CI (rollouts in flight beside a
# failed one, a kill after gathering and before training, kills inside training), and
# every point on its own under ARTSTORE_LONG=1.
PATTERNS = {
    "durable_rollouts": (
        driver.Options(steps=3, group_size=3, retry=True, **FAILING),
        ["rollout:3", "sealed:2", "before-completed:2"],
    ),
    "group_recorder+unconsumed_groups": (
        driver.Options(steps=3, group_size=3, durable=False, **FAILING),
        ["sealed:3", "train-start:1", "after-completed:1"],
    ),
}
EVERY_POINT = [
    "sealed:1",
    "sealed:2",
    "train-start:1",
    "train-end:1",
    "before-completed:1",
    "after-completed:1",
    "train-start:3",
    "train-end:3",
    "before-completed:3",
    "before-finished:1",
]
CASES = [(pattern, plan) for pattern, (_, plan) in PATTERNS.items()]
if LONG:
    CASES += [(pattern, [point]) for pattern in PATTERNS for point in EVERY_POINT]
    CASES += [("durable_rollouts", ["rollout:2"]), ("durable_rollouts", ["rollout:5"])]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("pattern", "plan"), CASES, ids=[f"{p}:{','.join(plan)}" for p, plan in CASES]
)
async def test_a_loop_with_failed_rollouts_killed_anywhere_records_and_trains_each_trajectory_once(
    database_url: str, tmp_path: Path, processes: Any, pattern: str, plan: list[str]
) -> None:
    options, _ = PATTERNS[pattern]
    workdir = await run_loop(database_url, tmp_path, processes, options, plan)
    # The failures planned happened (each once), and those retried did not reach ART.
    assert len(list(workdir.glob("failed-*-*-*"))) <= len(options.fail)


async def check_each_trajectory_once(
    store: artstore.Store, workdir: Path, options: driver.Options
) -> None:
    """The run finished with every group trained once, and every trajectory the agent
    returned is recorded at most once, in one group at most, and trained at most once."""
    (run,) = await rows(store, t.runs)
    assert run.status == "finished"
    steps = await rows(store, t.train_steps)
    assert not [s for s in steps if s.status == "started"], "a train step was left open"
    completed = sorted((s for s in steps if s.status == "completed"), key=lambda s: s.step)
    assert [s.step for s in completed] == list(range(1, options.steps + 1))

    sealed = {
        e.group_id: e
        for e in (r.decode() for r in await store.read_all(limit=100_000, types=["group.sealed"]))
    }
    if options.durable:  # the loop's durable groups, nothing else (no group of copies)
        assert set(sealed) == {
            durable_group_id(driver.RUN, step, scenario)
            for step in range(options.steps)
            for scenario in driver.batch_for(step)
        }

    # Each rollout of a sealed group is one of its members or one of its failures: none
    # joined a group after it was sealed; each finished rollout is a member of one group.
    rollouts = {r.rollout_id: r for r in await rows(store, t.rollouts)}
    members = Counter(rid for e in sealed.values() for rid in e.rollout_ids)
    assert set(members.values()) == {1}
    for rid, rollout in rollouts.items():
        seal = sealed.get(rollout.group_id)
        assert seal is not None, f"rollout {rid} ({rollout.status}) is in no sealed group"
        assert rid in seal.rollout_ids or rid in seal.failed_rollout_ids, (
            f"rollout {rid} ({rollout.status}, reward {rollout.reward}) joined group "
            f"{rollout.group_id} after it was sealed"
        )
        if rollout.status == "finished":
            assert rid in seal.rollout_ids
    # No trajectory recorded twice: each attempt the agent returned is one rollout at most.
    trajectories = await store.trajectories(list(members))
    attempts = Counter(trajectory.metadata["attempt"] for trajectory in trajectories.values())
    assert [a for a, n in attempts.items() if n > 1] == []
    assert set(attempts) <= set((workdir / "attempts.txt").read_text().split())

    # None trained twice: each group once, in the store and in the backend's checkpoints;
    # nothing is left for a replay or for unconsumed_groups.
    consumptions = await rows(store, t.group_consumptions)
    assert sorted(c.group_id for c in consumptions) == sorted(sealed)
    batches = {g.group_id: g.batch for g in await rows(store, t.groups)}
    for step in completed:  # a step trains its batch's groups (those sealed, leftovers)
        assert {batches[g] for g in step.group_ids} == {step.step - 1}
    assert groups_in_checkpoints(workdir, driver, completed) == Counter(list(sealed))
    _, model = driver_checkpoints(workdir, driver)
    assert await artstore.unconsumed_groups(store, driver.RUN, model) == []
    plan = await artstore.replay(store, driver.RUN, model, dry_run=True, model_step=options.steps)
    assert plan.groups == [] and plan.consumed == len(sealed)

    before = await projections(store)
    await store.rebuild_projections()
    assert await projections(store) == before
