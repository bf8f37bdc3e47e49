"""Running a case: its child started again and again until the run finishes.

Each start is a child of a forkserver that imported ART once (tests/support/crash_runs.py); the
child may die by its crash point (SIGKILL), stop on a failure the case injects (an
exception out of the loop: exit 1), or finish (exit 0). Anything else, or a run that does
not finish within MAX_STARTS starts, fails the case with the child's log.
"""

from __future__ import annotations

import asyncio
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from crash_points import run_logged

from matrix import child
from matrix.cases import STOPPING_FAILURES, Case

START_TIMEOUT_S = 240.0  # a loaded 2-core machine is slow, never stuck this long


@dataclass(frozen=True)
class Start:
    pid: int
    exit_code: int | None


@dataclass(frozen=True)
class Outcome:
    """What the starts of a case did."""

    starts: list[Start]
    fired: list[str]  # the crash points that killed a child, `POINT:N`, in order

    @property
    def killed_pids(self) -> set[int]:
        return {s.pid for s in self.starts if s.exit_code == -9}


def free_port() -> int:
    """A port for the case's inference server: the same in every start, as a deployed
    server's is (a rollout worker keeps the URL the trainer registered)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def start_once(processes: Any, url: str, workdir: Path, plan: str, number: int) -> Start:
    log = workdir / f"log-{number}.txt"
    process = processes.Process(
        target=run_logged, args=(child.train, url, str(workdir), plan, str(log))
    )
    process.start()
    process.join(timeout=START_TIMEOUT_S)
    if process.is_alive():
        process.kill()
        process.join()
        raise AssertionError(f"start {number} hung; its log:\n{log.read_text()[-4000:]}")
    return Start(process.pid, process.exitcode)


async def run_case(processes: Any, case: Case, url: str, workdir: Path, api_key: str) -> Outcome:
    """Start the case's child until it finishes; every other end must be one it plans.
    Its inference server takes `api_key` in every start."""
    case.write(workdir)
    (workdir / child.API_KEY).write_text(api_key)
    (workdir / child.PORT).write_text(str(free_port()))
    starts: list[Start] = []
    most = len(case.kills) + 1 + (case.failure in STOPPING_FAILURES)
    for number in range(most):
        start = await asyncio.to_thread(start_once, processes, url, workdir, case.plan, number)
        starts.append(start)
        if start.exit_code == 0:
            break
        planned = start.exit_code == -9 or (
            start.exit_code == 1 and case.failure in STOPPING_FAILURES
        )
        log = (workdir / f"log-{number}.txt").read_text()
        assert planned, f"start {number} exited {start.exit_code}:\n{log[-6000:]}"
    else:
        log = (workdir / f"log-{most - 1}.txt").read_text()
        codes = [s.exit_code for s in starts]
        raise AssertionError(f"{case}: not finished after {most} starts {codes}:\n{log[-6000:]}")
    fired = [workdir / f"fired-{i}" for i in range(len(case.kills))]
    return Outcome(starts, [f.read_text() for f in fired if f.exists()])
