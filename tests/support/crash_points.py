"""Named crash points for the crash drivers: a process that SIGKILLs itself at one of them.

A driver (crash_driver.py, loop_crash_driver.py, pipeline_crash_driver.py, in tests/support)
is run again and again with the same plan `POINT:N[,POINT:N...]` until it exits 0. Each
invocation arms the first POINT:N whose marker file (WORKDIR/fired-<i>) does not exist yet
and kills itself the Nth time this process reaches POINT, writing the marker first, so that
every point fires exactly once, in order. Nothing in artstore knows about these points; they
are injected from outside, by a backend and a wrapper around `store.append_nowait`:

- train-start / train-end: inside `backend.train`, before it starts / after it wrote the
  new checkpoint (the step advanced, the call has not returned);
- push: inside `_experimental_push_to_s3`, after the copy, before it returns;
- before-completed / after-completed: the append of a (not reconciled)
  `train_step.completed`, just before it / just after it committed;
- before-reconciled / after-reconciled: the same for a reconciled `train_step.completed`
  (a step found trained after a crash);
- before-finished: the append of `run.finished`, just before it;
- sealed: right after a `group.sealed` append committed;
- rollout: where a driver's agent calls `CrashPlan.reach_rollout`;
- append: right after an append the store acknowledged (tests/matrix/child.py reaches it).
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections import Counter
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from artstore.backends import CheckOnlyBackend

POINTS = (
    "rollout",
    "sealed",
    "train-start",
    "train-end",
    "before-completed",
    "after-completed",
    "push",
    "before-finished",
    "before-reconciled",
    "after-reconciled",
    "append",
    "stream",  # the matrix's served agents: a streamed answer's chunk arrived (mid-stream)
)


class CrashPlan:
    """The one armed point of this process, and how often each point was reached."""

    def __init__(self, workdir: Path, plan: str) -> None:
        self.workdir = workdir
        self.seen: Counter[str] = Counter()
        self.armed: tuple[int, str, int] | None = None
        for index, item in enumerate(p for p in plan.split(",") if p):
            point, _, nth = item.partition(":")
            if point not in POINTS:
                raise SystemExit(f"unknown crash point {point!r}; known: {', '.join(POINTS)}")
            if not (workdir / f"fired-{index}").exists():
                self.armed = (index, point, int(nth or 1))
                break

    def reached(self, point: str) -> None:
        """Count an arrival at `point`; SIGKILL this process if it is the armed one."""
        self.seen[point] += 1
        if self.armed is not None and self.armed[1:] == (point, self.seen[point]):
            (self.workdir / f"fired-{self.armed[0]}").write_text(f"{point}:{self.seen[point]}")
            os.kill(os.getpid(), signal.SIGKILL)

    def fires_next(self, point: str) -> bool:
        """Whether reaching `point` once more kills this process."""
        return self.armed is not None and self.armed[1:] == (point, self.seen[point] + 1)

    async def reach_rollout(
        self,
        finished: Counter[int],
        scenario_id: int,
        committed: Callable[[], Coroutine[Any, Any, bool]] | None = None,
    ) -> None:
        """Reach "rollout"; when that kills, first let a sibling of the scenario finish
        (if it runs in this process) and, with `committed`, wait until it says the finish
        is stored, so that the crash leaves a group with a finished and an in-flight
        rollout. Both waits end after ~10 s (a loaded machine is slow, never stuck)."""
        if self.fires_next("rollout"):
            for _ in range(1000):
                if finished[scenario_id]:
                    break
                await asyncio.sleep(0.01)
            for _ in range(200 if committed is not None else 0):
                if await committed():
                    break
                await asyncio.sleep(0.05)
        self.reached("rollout")


async def finished_in_unsealed_group(store: Any, scenario_id: int) -> bool:
    """Whether a finished rollout of the scenario is stored in a group not sealed yet."""
    from sqlalchemy import exists, func, select

    from artstore.schema import tables as t

    ro, groups = t.rollouts, t.groups
    query = select(func.count()).where(
        ro.c.scenario_index == scenario_id,
        ro.c.status == "finished",
        ~exists().where(groups.c.group_id == ro.c.group_id),
    )
    async with store.database.read() as connection:
        return bool((await connection.execute(query)).scalar())


class AgentFailure(RuntimeError):
    """What the agent raises when it fails a rollout on purpose."""


class Failures:
    """The agent's planned failures (`Options.fail`), each raised once over all runs."""

    def __init__(self, workdir: Path, planned: list[list[int]]) -> None:
        self.workdir, self.planned = workdir, {tuple(p) for p in planned}
        self.calls: Counter[tuple[int, int]] = Counter()

    def check(self, step: int, scenario_id: int) -> None:
        self.calls[step, scenario_id] += 1
        planned = (step, scenario_id, self.calls[step, scenario_id])
        marker = self.workdir / "failed-{}-{}-{}".format(*planned)
        if planned in self.planned and not marker.exists():
            marker.write_text("failed")
            raise AgentFailure(f"the agent failed on purpose at {planned}")


class CrashingBackend(CheckOnlyBackend):
    """A CheckOnlyBackend that reaches train-start, train-end and push."""

    def __init__(self, crash_plan: CrashPlan, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.crash_plan = crash_plan

    async def train(self, model: Any, groups: Any, **kwargs: Any) -> Any:
        self.crash_plan.reached("train-start")
        result = await super().train(model, groups, **kwargs)
        self.crash_plan.reached("train-end")
        return result

    async def _experimental_push_to_s3(self, model: Any, **kwargs: Any) -> None:
        await super()._experimental_push_to_s3(model, **kwargs)
        self.crash_plan.reached("push")


def crash_around_appends(store: Any, crash_plan: CrashPlan) -> None:
    """Reach the append points of `store`: every event written goes through `append`,
    `append_nowait` (group commits) or `append_together_nowait` (groups recorded whole),
    none of which calls another, so wrapping the three sees each event once."""
    from artstore.events import GroupSealed, RunFinished, TrainStepCompleted

    append_nowait, append_together_nowait = store.append_nowait, store.append_together_nowait

    def before(events: Any) -> tuple[bool, bool, bool]:
        """The points before `events` are queued; which points follow their commit."""
        completes = any(isinstance(e, TrainStepCompleted) and not e.reconciled for e in events)
        reconciles = any(isinstance(e, TrainStepCompleted) and e.reconciled for e in events)
        seals = any(isinstance(e, GroupSealed) for e in events)
        if completes:
            crash_plan.reached("before-completed")
        if reconciles:
            crash_plan.reached("before-reconciled")
        if any(isinstance(e, RunFinished) for e in events):
            crash_plan.reached("before-finished")
        return completes, reconciles, seals

    def reached_after(points: tuple[bool, bool, bool]) -> None:
        completes, reconciles, seals = points
        if completes:
            crash_plan.reached("after-completed")
        if reconciles:
            crash_plan.reached("after-reconciled")
        if seals:
            crash_plan.reached("sealed")

    def after(future: Any, points: tuple[bool, bool, bool]) -> Any:
        if not any(points):
            return future

        async def committed() -> Any:
            result = await future
            reached_after(points)
            return result

        return asyncio.ensure_future(committed())

    append = store.append

    async def append_with_crashes(stream_id: str, events: Any, *args: Any, **kwargs: Any) -> Any:
        points = before(events)
        result = await append(stream_id, events, *args, **kwargs)
        reached_after(points)
        return result

    def nowait_with_crashes(stream_id: str, events: Any, *args: Any, **kwargs: Any) -> Any:
        points = before(events)
        return after(append_nowait(stream_id, events, *args, **kwargs), points)

    def together_with_crashes(appends: Any) -> list[Any]:
        points = [before(append.events) for append in appends]  # nothing is queued yet
        futures = append_together_nowait(appends)
        return [after(f, p) for f, p in zip(futures, points, strict=True)]

    store.append = append_with_crashes
    store.append_nowait = nowait_with_crashes
    store.append_together_nowait = together_with_crashes


def run_logged(
    train: Callable[[str, Path, str], Coroutine[Any, Any, None]],
    url: str,
    workdir: str,
    plan: str,
    log_path: str | None = None,
) -> None:
    """Run a driver's `train` (in a child process); its output goes to `log_path` when given."""
    if log_path is not None:
        log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(log, 1)
        os.dup2(log, 2)
    asyncio.run(train(url, Path(workdir), plan))


def run_from_command_line(train: Callable[[str, Path, str], Coroutine[Any, Any, None]]) -> None:
    """`python tests/<driver>.py DATABASE_URL WORKDIR POINT:N[,POINT:N...]`."""
    if len(sys.argv) != 4:
        raise SystemExit(f"usage: {sys.argv[0]} DATABASE_URL WORKDIR POINT:N[,POINT:N...]")
    run_logged(train, *sys.argv[1:])
