"""The examples under examples/ run as their docstrings say."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from training_helpers import rows

import artstore
from artstore.schema import tables as t

EXAMPLES = Path(__file__).parents[1] / "examples"


@pytest.mark.slow
async def test_the_ray_example_trains_from_workers_started_as_ray_tasks(postgres_url: str):
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
