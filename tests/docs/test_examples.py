"""The examples run as they are, as subprocesses, on SQLite and PostgreSQL.

Each is a real script of one of ART's patterns made durable (examples/): it starts the
local inference server and trains on CheckOnlyBackend. The resumable loop is killed for
real (SIGKILL) while groups are recorded and not trained yet, then run again. The
PipelineTrainer example needs ART >= 0.5.20: tests/training/test_pipeline_crash_resume.py runs it.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections import Counter

import pytest
from budget import LONG
from running_examples import EXAMPLES, finish, start
from sqlalchemy import func, select
from training_helpers import assert_consistent, rows

import artstore
from artstore.schema import tables as t


async def run_summary(url: str, run: str) -> tuple[str, int, int, int]:
    async with await artstore.open_store(url) as store:
        (found,) = [r for r in await rows(store, t.runs) if r.run == run]
        steps = [s for s in await rows(store, t.train_steps) if s.status == "completed"]
        groups = await rows(store, t.groups)
        consumed = await rows(store, t.group_consumptions)
        await assert_consistent(store)
    return found.status, len(steps), len(groups), len(consumed)


# Each example runs on the default store (SQLite) in CI, on PostgreSQL too in the long
# budget (ARTSTORE_LONG=1), and the Ray example (PostgreSQL; Ray's start alone costs a
# minute of CPU) only there: what the examples call is tested on both databases elsewhere
# (tests/training, tests/workers).
EXAMPLE_DATABASES = ["sqlite", "postgresql"] if LONG else ["sqlite"]


@pytest.mark.parametrize("database_url", EXAMPLE_DATABASES, indirect=True)
@pytest.mark.parametrize(
    ("example", "run", "steps"),
    [
        ("openai_agent.py", "examples/openai-agent", 3),
        ("langgraph_agent.py", "examples/langgraph", 2),
    ],
)
async def test_an_example_runs_and_records_its_run(database_url, tmp_path, example, run, steps):
    output = await asyncio.to_thread(finish, start(example, database_url, tmp_path))
    assert f"step {steps}:" in output
    assert await run_summary(database_url, run) == ("finished", steps, 2 * steps, 2 * steps)


@pytest.mark.parametrize("database_url", EXAMPLE_DATABASES, indirect=True)
async def test_the_resumable_loop_killed_while_groups_wait_resumes_them_first(
    database_url, tmp_path
):
    process = start("resumable_loop.py", database_url, tmp_path, "--steps", "6", "--delay", "0.4")
    async with await artstore.open_store(database_url) as store:
        waiting: set[str] = set()
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and process.poll() is None:
            async with store.database.read() as connection:
                trained = (
                    await connection.execute(select(func.count()).select_from(t.train_steps))
                ).scalar()
            sealed = {g.group_id for g in await rows(store, t.groups)}
            consumed = {c.group_id for c in await rows(store, t.group_consumptions)}
            if trained and sealed - consumed:
                process.send_signal(signal.SIGKILL)
                waiting = sealed - consumed
                break
            await asyncio.sleep(0.02)
        output, _ = await asyncio.to_thread(process.communicate, timeout=60)
        assert process.returncode == -signal.SIGKILL, output
        # What the kill left: every group it recorded, whether trained or not, stays.
        assert waiting
        left = {g.group_id for g in await rows(store, t.groups)}

    output = await asyncio.to_thread(
        finish, start("resumable_loop.py", database_url, tmp_path, "--steps", "6")
    )
    async with await artstore.open_store(database_url) as store:
        consumptions = await rows(store, t.group_consumptions)
        steps = sorted(
            (s for s in await rows(store, t.train_steps) if s.status == "completed"),
            key=lambda s: s.step,
        )
        batches = {g.group_id: g.batch for g in await rows(store, t.groups)}
        groups = set(batches)
        finished = [r for r in await rows(store, t.rollouts) if r.status == "finished"]
    # Every group recorded was trained once; each step trained the groups of its batch,
    # so the groups the kill left waiting were trained first, by the restarted loop.
    assert Counter(c.group_id for c in consumptions) == Counter(groups)
    assert left <= groups and waiting <= {c.group_id for c in consumptions}
    assert [s.step for s in steps] == list(range(1, len(steps) + 1)) and steps[-1].step >= 6
    for step in steps:
        assert {batches[g] for g in step.group_ids} == {step.step - 1}
    # Every finished rollout belongs to a group: none was rolled out and thrown away.
    assert {r.group_id for r in finished} <= groups and len(finished) == 3 * len(groups)


async def ray_example_trains_from_workers_started_as_ray_tasks(postgres_url: str):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(EXAMPLES.parent), *sys.path])}
    env["RAY_ENABLE_UV_RUN_RUNTIME_ENV"] = "0"  # Ray must start workers with this interpreter
    finished = subprocess.run(
        [sys.executable, str(EXAMPLES / "ray_workers.py"), "--url", postgres_url, "--workers", "2"],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        check=False,
    )
    assert finished.returncode == 0, finished.stdout + finished.stderr
    assert "trained steps [1, 2, 3, 4] from 2 Ray workers" in finished.stdout
    async with await artstore.open_store(postgres_url) as store:
        (run,) = await rows(store, t.runs)
        assert run.status == "finished"
        groups = await rows(store, t.groups)
        assert len(groups) == 8 and {g.size for g in groups} == {3}
        # The rollouts were made by the Ray workers (their processes), not by the trainer.
        slots = await rows(store, t.rollout_claims)
        assert Counter(s.status for s in slots) == {"finished": 24}
        workers = {s.worker.split(":")[1] for s in slots}
        assert str(os.getpid()) not in workers and 1 <= len(workers) <= 2


if LONG:  # a test in the long budget only: not collected at all otherwise (never "skipped")
    test_the_ray_example_trains_from_workers_started_as_ray_tasks = pytest.mark.slow(
        ray_example_trains_from_workers_started_as_ray_tasks
    )
