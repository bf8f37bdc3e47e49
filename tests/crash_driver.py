"""A training script that kills itself (SIGKILL) at one chosen point, for the crash tests.

    python tests/crash_driver.py DATABASE_URL WORKDIR POINT:N[,POINT:N...]

It trains a small run (3 scenarios in batches of 2 and 1, 3 epochs, groups of 2 policy
rollouts and 1 validation rollout) with a one-call agent on a LocalInferenceServer and a
CheckOnlyBackend under WORKDIR. Run it again and again until it exits 0: each invocation
arms the first POINT:N whose marker file (WORKDIR/fired-<i>) does not exist yet, and kills
itself at the Nth time this process reaches POINT, writing the marker first so that every
point fires exactly once. Nothing in artstore knows about these points; they are injected
from outside:

- rollout: the agent, on its Nth call, once another rollout of the same scenario has
  finished (so a group holds a finished and an in-flight rollout at the crash);
- sealed: `store.append`, right after a `group.sealed` append has committed;
- train-start / train-end: inside `backend.train`, before it starts / after it wrote the
  new checkpoint (the step advanced, the call has not returned);
- before-completed / after-completed: `store.append` of a (not reconciled)
  `train_step.completed`, just before it / just after it committed;
- push: inside `_experimental_push_to_s3`, after the copy, before it returns;
- before-finished: `store.append` of `run.finished`, just before it;
- before-reconciled / after-reconciled: `store.append` of a reconciled
  `train_step.completed` (a step found trained after a crash), just before / after it.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from collections import Counter
from pathlib import Path
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

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
)
MODEL_NAME = "crash"
PROJECT = "crashtest"
SCENARIOS = [{"question": f"What is fact number {i}?", "id": i} for i in range(3)]
EPOCHS, BATCH_SIZE, GROUP_SIZE, VALIDATION_SAMPLES = 3, 2, 2, 1


class Crasher:
    """The one armed point of this process, and how often it was reached."""

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
        self.seen[point] += 1
        if self.armed is None:
            return
        index, armed_point, nth = self.armed
        if point == armed_point and self.seen[point] == nth:
            (self.workdir / f"fired-{index}").write_text(f"{point}:{nth}")
            os.kill(os.getpid(), signal.SIGKILL)

    def fires_next(self, point: str) -> bool:
        """Whether reaching `point` once more kills this process."""
        return self.armed is not None and self.armed[1:] == (point, self.seen[point] + 1)


async def train(url: str, workdir: Path, plan: str) -> None:
    import art
    from art.langgraph import init_chat_model

    import artstore
    from artstore.backends import CheckOnlyBackend
    from artstore.events import GroupSealed, RunFinished, TrainStepCompleted
    from artstore.testing.inference_server import LocalInferenceServer

    crasher = Crasher(workdir, plan)
    finished_per_scenario: Counter[int] = Counter()

    class CrashingBackend(CheckOnlyBackend):
        async def train(self, model: Any, groups: Any, **kwargs: Any) -> Any:
            crasher.reached("train-start")
            result = await super().train(model, groups, **kwargs)
            crasher.reached("train-end")
            return result

        async def _experimental_push_to_s3(self, model: Any, **kwargs: Any) -> None:
            await super()._experimental_push_to_s3(model, **kwargs)
            crasher.reached("push")

    async def agent(scenario: dict[str, Any], thread_id: str) -> str:
        reply = await init_chat_model().ainvoke([("user", scenario["question"])])
        if crasher.fires_next("rollout"):
            for _ in range(100):  # let a sibling finish first (if it runs in this process)
                if finished_per_scenario[scenario["id"]]:
                    break
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.2)  # and its rollout.finished commit
        crasher.reached("rollout")
        finished_per_scenario[scenario["id"]] += 1
        return reply.content

    def reward(scenario: Any, results: list[Any], trajectories: list[Any]) -> list[float]:
        return [float(len(str(result)) % 5) for result in results]

    with LocalInferenceServer() as server:
        backend = CrashingBackend(
            path=workdir / "art",
            inference_base_url=server.base_url,
            inference_api_key=server.api_key,
            push_dir=workdir / "bucket",
        )
        model = art.TrainableModel(
            name=MODEL_NAME, run_name=MODEL_NAME, project=PROJECT, base_model="test-base"
        )
        await model.register(backend)
        validator = art.Model(
            name="validator",
            project=PROJECT,
            inference_base_url=server.base_url,
            inference_api_key=server.api_key,
            inference_model_name="test-model",
        )
        store = await artstore.open_store(url)
        append = store.append

        async def append_with_crashes(stream_id: str, events: Any, *args: Any, **kwargs: Any):
            completes = any(isinstance(e, TrainStepCompleted) and not e.reconciled for e in events)
            reconciles = any(isinstance(e, TrainStepCompleted) and e.reconciled for e in events)
            if completes:
                crasher.reached("before-completed")
            if reconciles:
                crasher.reached("before-reconciled")
            if any(isinstance(e, RunFinished) for e in events):
                crasher.reached("before-finished")
            result = await append(stream_id, events, *args, **kwargs)
            if completes:
                crasher.reached("after-completed")
            if reconciles:
                crasher.reached("after-reconciled")
            if any(isinstance(e, GroupSealed) for e in events):
                crasher.reached("sealed")
            return result

        store.append = append_with_crashes  # type: ignore[method-assign]
        try:
            summary = await artstore.TrainingFramework(store).run_training(
                model=model,
                scenarios=SCENARIOS,
                agent_function=agent,
                reward_function=reward,
                config=artstore.TrainingConfig(
                    epochs=EPOCHS,
                    batch_size=BATCH_SIZE,
                    group_size=GROUP_SIZE,
                    validation_samples=VALIDATION_SAMPLES,
                ),
                validation_model=validator,
            )
        finally:
            await store.close()
    (workdir / "summary.json").write_text(json.dumps(summary.__dict__))


def main(url: str, workdir: str, plan: str, log_path: str | None = None) -> None:
    """Entry point for a child process; its output goes to `log_path` when given."""
    if log_path is not None:
        log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(log, 1)
        os.dup2(log, 2)
    asyncio.run(train(url, Path(workdir), plan))


if __name__ == "__main__":
    if len(sys.argv) != 4:
        raise SystemExit(__doc__)
    main(*sys.argv[1:])
