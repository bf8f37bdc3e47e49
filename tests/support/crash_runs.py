"""Running a crash driver (tests/support/crash_points.py) again and again until it finishes.

Each run is a child of a forkserver that imported ART once (a fresh interpreter costs
seconds of imports each time); each is still a process of its own, killed for real.
"""

from __future__ import annotations

import asyncio
import multiprocessing
from collections import Counter
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any

import pytest
from budget import LONG
from crash_points import run_logged
from sqlalchemy import text
from training_helpers import rows

import artstore
from artstore.backends import CheckOnlyBackend
from artstore.schema import tables as t

DriverTrain = Callable[[str, Path, str], Coroutine[Any, Any, None]]
Snapshot = dict[str, set[str]]


def points_in_budget(plan: list[str], url: str) -> list[str]:
    """The kill points a test runs on the database at `url`: all of them under
    ARTSTORE_LONG=1; by default every other one (SQLite the first, third, ...; PostgreSQL
    the second, fourth, ...), so that the two databases still share out every point."""
    if LONG:
        return plan
    return plan[0 if url.startswith("sqlite") else 1 :: 2]


def forkserver(preload: list[str]) -> Any:
    """A forkserver context that imports `preload` (the driver module first) once."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(preload)
    return context


def run_driver(
    processes: Any,
    train: DriverTrain,
    url: str,
    workdir: Path,
    number: int,
    plan: list[str],
    *,
    timeout_s: float,
) -> int | None:
    """Run a driver's `train` once in a child; its exit code (-9 when it killed itself)."""
    log = workdir / f"log-{number}.txt"
    child = processes.Process(
        target=run_logged, args=(train, url, str(workdir), ",".join(plan), str(log))
    )
    child.start()
    child.join(timeout=timeout_s)
    if child.is_alive():
        child.kill()
        child.join()
        pytest.fail(f"{train.__module__} run {number} hung; its log:\n{log.read_text()}")
    return child.exitcode


async def run_until_finished(
    store: artstore.Store,
    processes: Any,
    train: DriverTrain,
    url: str,
    workdir: Path,
    plan: list[str],
    *,
    timeout_s: float,
    check_exit_codes: bool = True,
) -> list[Snapshot]:
    """Run the driver until it exits 0, at most once per point of `plan` and once more.

    Every run that did not finish must have died by SIGKILL, and every point must have
    fired exactly once, in order. With `check_exit_codes`, the runs must also be exactly
    one killed per point and then one that finished. Returns what each kill left.
    """
    seen: list[Snapshot] = []
    exit_codes = []
    for number in range(len(plan) + 1):
        code = await asyncio.to_thread(
            run_driver, processes, train, url, workdir, number, plan, timeout_s=timeout_s
        )
        exit_codes.append(code)
        if code == 0:
            break
        log = (workdir / f"log-{number}.txt").read_text()
        assert code == -9, f"run {number} exited {code}, not by SIGKILL:\n{log}"
        seen.append(await snapshot(store, workdir))
    fired = [(workdir / f"fired-{i}").read_text() for i in range(len(plan))]
    assert fired == plan, exit_codes  # every point fired, each exactly once, in order
    if check_exit_codes:
        assert exit_codes == [-9] * len(plan) + [0]
    return seen


async def snapshot(store: artstore.Store, workdir: Path) -> Snapshot:
    """What the killed trainer left, once the database finished what it had sent.

    Besides rollouts and groups: the train steps it left open (ids of `train_steps` rows),
    split by whether the backend's checkpoints (under WORKDIR/art) show the step trained
    ("trained_unrecorded": the next start must reconcile it) or not ("stopped_in_training":
    the next start must record it failed and train its groups again)."""
    if store.dialect == "postgresql":
        # A COMMIT sent just before the kill still completes on the server, a moment later.
        busy = text(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND pid <> pg_backend_pid() AND state <> 'idle'"
        )
        for _ in range(500):
            async with store.database.read() as connection:
                if not (await connection.execute(busy)).scalar():
                    break
            await asyncio.sleep(0.01)
    found: Snapshot = {"finished": set(), "running": set(), "sealed": set()}
    for rollout in await rows(store, t.rollouts):
        if rollout.status in ("finished", "running"):
            found[rollout.status].add(rollout.rollout_id)
    found["sealed"] = {g.group_id for g in await rows(store, t.groups)}
    found["trained_unrecorded"], found["stopped_in_training"] = set(), set()
    backend_step = max(
        (int(d.name) for d in workdir.glob("art/*/models/*/checkpoints/*") if d.name.isdigit()),
        default=0,
    )
    for step in await rows(store, t.train_steps):
        if step.status == "started":
            trained = backend_step > step.step_before
            found["trained_unrecorded" if trained else "stopped_in_training"].add(str(step.id))
    return found


def driver_checkpoints(workdir: Path, driver: Any) -> tuple[CheckOnlyBackend, Any]:
    """The backend the driver trained on (read back from WORKDIR/art) and its model."""
    import art

    model = art.TrainableModel(
        name=driver.MODEL_NAME,
        run_name=driver.MODEL_NAME,
        project=driver.PROJECT,
        base_model="test-base",
    )
    return CheckOnlyBackend(path=workdir / "art"), model


def groups_in_checkpoints(
    workdir: Path, driver: Any, completed: Sequence[Any], key: str = "artstore_group_id"
) -> Counter[str]:
    """The groups the backend's own checkpoints hold, counted over the completed steps;
    each step's checkpoint must hold exactly the groups its train step recorded."""
    backend, model = driver_checkpoints(workdir, driver)
    in_checkpoints: Counter[str] = Counter()
    for step in completed:
        record = backend.read_checkpoint(model, step.step)
        trained = [m[key] for m in record["group_metadata"]]
        assert sorted(trained) == sorted(step.group_ids)
        in_checkpoints.update(trained)
    return in_checkpoints
