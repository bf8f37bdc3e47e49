"""ART's PipelineTrainer on the store, killed at every point and resumed (ART >= 0.5.20).

tests/support/pipeline_crash_driver.py runs `artstore.pipeline_trainer(store, ...)` over 12
scenarios (groups of 2, batches of 2 groups, 2 rollout workers) and SIGKILLs itself at a chosen
point; the test runs it again and again until it completes:

    rollout:3          a group half rolled out (nothing of it is recorded yet)
    sealed:2           a group recorded and queued, not trained
    train-start:1      inside backend.train, before it wrote anything
    sealed:1           another group recorded and queued
    train-end:1        inside backend.train, after the new checkpoint was written
    before-completed:1 backend.train returned, train_step.completed not yet appended
    after-completed:1  train_step.completed committed
    before-finished:1  everything trained, run.finished not yet appended

ART's own resume would skip the scenarios counted as pulled (queued and in-flight groups
lost). Here: every scenario has exactly one group, a scenario whose group was recorded is
never rolled out again, every group with reward spread is trained exactly once (the
store and the backend's checkpoints agree), and a group recorded before a crash is
trained before any group rolled out after it. The module also runs
examples/pipeline_trainer.py. On an older ART the whole module is skipped (once).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from crash_runs import Snapshot, forkserver, groups_in_checkpoints, run_until_finished
from training_helpers import projections, rows

import artstore
from artstore.art_versions import has_pipeline_trainer, rewards_have_zero_variance
from artstore.schema import tables as t

if not has_pipeline_trainer():  # one module-level skip: no PostgreSQL test is skipped
    pytest.skip("ART's PipelineTrainer needs openpipe-art >= 0.5.20", allow_module_level=True)

PLAN = [
    "rollout:3",
    "sealed:2",
    "train-start:1",
    "sealed:1",
    "train-end:1",
    "before-completed:1",
    "after-completed:1",
    "before-finished:1",
]


@pytest.fixture(scope="module")
def processes() -> Any:
    return forkserver(["pipeline_crash_driver", "art", "art.pipeline_trainer"])


@pytest.mark.slow
async def test_pipeline_trainer_killed_at_every_point_loses_no_group(
    database_url: str, tmp_path: Path, processes: Any
) -> None:
    import pipeline_crash_driver as driver

    workdir = tmp_path / "pipeline"
    workdir.mkdir()
    async with await artstore.open_store(database_url) as store:
        seen = await run_until_finished(
            store,
            processes,
            driver.train,
            database_url,
            workdir,
            PLAN,
            timeout_s=180,
            check_exit_codes=False,
        )
        await check_run(store, seen, workdir)


async def check_run(store: artstore.Store, seen: list[Snapshot], workdir: Path) -> None:
    import pipeline_crash_driver as driver

    from artstore.training.pipeline import pipeline_group_id

    (run,) = await rows(store, t.runs)
    assert (run.run, run.status) == (driver.RUN, "finished")
    assert run.config["trainer"] == "PipelineTrainer"
    index_of = {pipeline_group_id(driver.RUN, i): i for i in range(driver.NUM_SCENARIOS)}
    # One group per scenario, each of GROUP_SIZE finished rollouts, nothing else finished.
    groups = {g.group_id: g for g in await rows(store, t.groups)}
    assert set(groups) == set(index_of)
    assert all(groups[g].scenario_index == i for g, i in index_of.items())
    rollouts = await rows(store, t.rollouts)
    assert Counter(r.group_id for r in rollouts if r.status == "finished") == dict.fromkeys(
        index_of, driver.GROUP_SIZE
    )
    # A scenario whose group was recorded before a crash was never rolled out again.
    completions = Counter(
        tuple(map(int, line.split()))
        for line in (workdir / "completions.txt").read_text().splitlines()
    )
    for crash, snap in enumerate(seen):
        for group_id in snap["sealed"]:
            index = index_of[group_id]
            later = [n for (number, i), n in completions.items() if i == index and number > crash]
            assert not later, (crash, index_of[group_id])
    totals: Counter[int] = Counter()
    for (_, index), n in completions.items():
        totals[index] += n
    assert max(totals.values()) > driver.GROUP_SIZE  # a half-done group was rolled out again

    # Every group with reward spread trained exactly once; the backend agrees.
    loaded = await artstore.run_groups(store, driver.RUN)
    spread = {
        g.metadata["artstore_group_id"]
        for g in loaded
        if not rewards_have_zero_variance([t.reward for t in g.trajectories])
    }
    consumptions = await rows(store, t.group_consumptions)
    assert sorted(c.group_id for c in consumptions) == sorted(spread)
    steps = await rows(store, t.train_steps)
    completed = sorted((s for s in steps if s.status == "completed"), key=lambda s: s.step)
    assert [s.step for s in completed] == list(range(1, len(completed) + 1))
    # PipelineTrainer trains while it rolls out, so a kill meant for a rollout or a seal
    # may also land inside a train step: each step a kill left open is settled once, by
    # what the backend's checkpoints held when the process died.
    trained_unrecorded = set().union(*(snap["trained_unrecorded"] for snap in seen))
    stopped_in_training = set().union(*(snap["stopped_in_training"] for snap in seen))
    for point, snap in zip(PLAN, seen, strict=True):
        if point in ("train-end:1", "before-completed:1"):
            assert len(snap["trained_unrecorded"]) == 1, point
        if point == "train-start:1":
            assert len(snap["stopped_in_training"]) == 1, point
        if point in ("after-completed:1", "before-finished:1"):
            assert not snap["trained_unrecorded"] | snap["stopped_in_training"], point
    assert {str(s.id) for s in completed if s.reconciled} == trained_unrecorded
    failed = [s for s in steps if s.status == "failed"]
    assert {str(s.id) for s in failed} == stopped_in_training
    assert {s.error_type for s in failed} == {"TrainerStopped"}
    assert groups_in_checkpoints(workdir, driver, completed) == Counter(spread)

    # After each restart, the groups recorded before it and not trained are trained first.
    consumed: set[str] = set()
    sealed_so_far: set[str] = set()
    waiting: set[str] = set()
    restarts_with_leftovers = 0
    async for recorded in store.iter_all(
        types=["run.resumed", "group.sealed", "train_step.completed"]
    ):
        if recorded.type == "group.sealed":
            sealed_so_far.add(recorded.data["group_id"])
        elif recorded.type == "run.resumed":
            waiting = (sealed_so_far - consumed) & spread
            restarts_with_leftovers += bool(waiting)
        else:
            trained = set(recorded.data["group_ids"])
            assert trained <= waiting or waiting <= trained, (trained, waiting)
            waiting -= trained
            consumed |= trained
    assert restarts_with_leftovers >= 2  # sealed:2 and sealed:1 left a queued group
    before = await projections(store)
    await store.rebuild_projections()
    assert await projections(store) == before


async def test_the_pipeline_trainer_example_runs(database_url, tmp_path):
    from running_examples import finish, start

    output = await asyncio.to_thread(finish, start("pipeline_trainer.py", database_url, tmp_path))
    assert "trained to step" in output
    async with await artstore.open_store(database_url) as store:
        (run,) = await rows(store, t.runs)
        groups = await rows(store, t.groups)
        consumed = await rows(store, t.group_consumptions)
        steps = [s for s in await rows(store, t.train_steps) if s.status == "completed"]
        before = await projections(store)
        await store.rebuild_projections()
        assert await projections(store) == before
    assert (run.run, run.status, len(groups)) == ("examples/pipeline", "finished", 8)
    assert steps and len(consumed) <= len(groups)


async def test_a_pipeline_lets_go_of_its_model_when_training_ends(database_url):
    """The recording backend pipeline_trainer wraps around the user's backend is the
    trainer's own: its lease on the model ends with `train()` (the user closes only the
    backend they passed in), so the same process may train the model again at once."""
    import art
    from art.pipeline_trainer import PipelineRuntimeConfig, make_group_rollout_fn

    from artstore.backends import CheckOnlyBackend
    from artstore.testing.inference_server import LocalInferenceServer
    from artstore.training.lease import lock_name, trainer_lease

    with LocalInferenceServer() as server:
        backend = CheckOnlyBackend(
            inference_base_url=server.base_url, inference_api_key=server.api_key
        )
        model = art.TrainableModel(
            name="pipe-lease", run_name="pipe-lease", project="pipeline", base_model="Qwen/Qwen3-8B"
        )
        await model.register(backend)
        client = model.openai_client()

        async def rollout(model, scenario, config) -> art.Trajectory:
            messages = [{"role": "user", "content": scenario["question"]}]
            completion = await client.chat.completions.create(
                model=model.get_inference_name(), messages=messages, logprobs=True
            )
            answer = completion.choices[0].message.content or ""
            return art.Trajectory(
                messages_and_choices=[*messages, completion.choices[0]],
                reward=float("believe" in answer),
            )

        async with await artstore.open_store(database_url) as store:
            trainer = artstore.pipeline_trainer(
                store,
                run="pipe-lease",
                model=model,
                backend=backend,
                rollout_fn=make_group_rollout_fn(rollout, n=4),
                scenarios=[{"question": f"What is fact number {i}?"} for i in range(4)],
                pipeline=PipelineRuntimeConfig(num_rollout_workers=2, min_batch_size=2),
                max_steps_off_policy=4,
            )
            await trainer.train()
            trained = [s for s in await rows(store, t.train_steps) if s.status == "completed"]
            assert trained, "the pipeline trained no step"
            assert await store.database.lock_held(lock_name("pipeline/pipe-lease")) is False
            # TrainerConflictError here if the pipeline still held the model.
            async with trainer_lease(store.database, "again", "pipeline/pipe-lease"):
                assert await store.database.lock_held(lock_name("pipeline/pipe-lease"))
        await backend.close()
