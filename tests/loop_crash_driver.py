"""A loop of ART's own kind, made durable, that kills itself (SIGKILL) at one chosen point.

    python tests/loop_crash_driver.py DATABASE_URL WORKDIR POINT:N[,POINT:N...]

The loop is what ART's examples write: an agent calling `model.openai_client()` with
tools, `art.gather_trajectory_groups` over `art.TrajectoryGroup(rollout(...) for ...)`,
`backend.train` then `model.log`, for `range(await model.get_step(), STEPS)`. Three lines
make it durable: the backend is `artstore.recording_backend(store, ...)`, the rollout function
`artstore.durable_rollouts(store, ...)`, and `after_each=artstore.group_recorder(store, ...)`.

As in tests/crash_driver.py, each invocation arms the first POINT:N whose marker file
(WORKDIR/fired-<i>) does not exist and kills itself the Nth time it reaches POINT:

- rollout: the agent, once a rollout of the same scenario has finished;
- sealed: right after a `group.sealed` append committed;
- train-start / train-end: inside the backend's `train`, before it starts / after it
  wrote the new checkpoint (the step advanced, the call has not returned);
- before-completed / after-completed: around the append of `train_step.completed`;
- before-finished: `store.append` of `run.finished`, just before it.
"""

from __future__ import annotations

import asyncio
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
    "before-finished",
)
RUN = "loops/crash"
PROJECT, MODEL_NAME = "loops", "agent"
STEPS, BATCH_SIZE, GROUP_SIZE = 4, 2, 2
SCENARIOS = [{"question": f"What is fact number {i}?", "id": i} for i in range(3)]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "Look up a fact.",
            "parameters": {
                "type": "object",
                "properties": {"query": {"type": "string"}},
                "required": ["query"],
            },
        },
    }
]


def batch_for(step: int) -> list[dict[str, Any]]:
    """The scenarios of a step (distinct within a step, repeating across steps)."""
    return [SCENARIOS[(step * BATCH_SIZE + k) % len(SCENARIOS)] for k in range(BATCH_SIZE)]


class Crasher:
    def __init__(self, workdir: Path, plan: str, points: tuple[str, ...] = POINTS) -> None:
        self.workdir = workdir
        self.seen: Counter[str] = Counter()
        self.armed: tuple[int, str, int] | None = None
        for index, item in enumerate(p for p in plan.split(",") if p):
            point, _, nth = item.partition(":")
            if point not in points:
                raise SystemExit(f"unknown crash point {point!r}; known: {', '.join(points)}")
            if not (workdir / f"fired-{index}").exists():
                self.armed = (index, point, int(nth or 1))
                break

    def reached(self, point: str) -> None:
        self.seen[point] += 1
        if self.armed is not None and self.armed[1:] == (point, self.seen[point]):
            (self.workdir / f"fired-{self.armed[0]}").write_text(f"{point}:{self.seen[point]}")
            os.kill(os.getpid(), signal.SIGKILL)

    def fires_next(self, point: str) -> bool:
        return self.armed is not None and self.armed[1:] == (point, self.seen[point] + 1)


async def train(url: str, workdir: Path, plan: str) -> None:
    import art

    import artstore
    from artstore.art_versions import trainable_model
    from artstore.backends import CheckOnlyBackend
    from artstore.events import GroupSealed, RunFinished, TrainStepCompleted
    from artstore.testing.inference_server import LocalInferenceServer

    crasher = Crasher(workdir, plan)
    finished: Counter[int] = Counter()

    class CrashingBackend(CheckOnlyBackend):
        async def train(self, model: Any, groups: Any, **kwargs: Any) -> Any:
            crasher.reached("train-start")
            result = await super().train(model, groups, **kwargs)
            crasher.reached("train-end")
            return result

    with LocalInferenceServer() as server:
        store = await artstore.open_store(url)
        append_nowait = store.append_nowait  # `append` and group commits go through it

        def append_with_crashes(stream_id: str, events: Any, *args: Any, **kwargs: Any) -> Any:
            completes = any(isinstance(e, TrainStepCompleted) and not e.reconciled for e in events)
            seals = any(isinstance(e, GroupSealed) for e in events)
            if completes:
                crasher.reached("before-completed")
            if any(isinstance(e, RunFinished) for e in events):
                crasher.reached("before-finished")
            future = append_nowait(stream_id, events, *args, **kwargs)
            if not (completes or seals):
                return future

            async def committed() -> Any:
                result = await future
                crasher.reached("after-completed" if completes else "sealed")
                return result

            return asyncio.ensure_future(committed())

        store.append_nowait = append_with_crashes  # type: ignore[method-assign]

        # --- the user's loop ------------------------------------------------------------
        backend = artstore.recording_backend(
            store,  # durable: 1 of 3
            CrashingBackend(
                path=workdir / "art",
                inference_base_url=server.base_url,
                inference_api_key=server.api_key,
            ),
            run=RUN,
        )
        model = trainable_model(name=MODEL_NAME, project=PROJECT, base_model="test-base")
        await model.register(backend)
        client = model.openai_client()

        async def agent(model: art.TrainableModel, scenario: dict[str, Any]) -> art.Trajectory:
            trajectory = art.Trajectory(
                messages_and_choices=[
                    {"role": "system", "content": "Answer with the facts you look up."},
                    {"role": "user", "content": scenario["question"]},
                ],
                tools=TOOLS,
                reward=0,
            )
            completion = await client.chat.completions.create(
                model=model.get_inference_name(),
                messages=trajectory.messages(),
                tools=TOOLS,
                logprobs=True,
            )
            trajectory.messages_and_choices.append(completion.choices[0])
            if crasher.fires_next("rollout"):
                for _ in range(100):  # let a sibling finish first
                    if finished[scenario["id"]]:
                        break
                    await asyncio.sleep(0.01)
                await asyncio.sleep(0.2)
            crasher.reached("rollout")
            message = completion.choices[0].message
            trajectory.reward = float(len(message.content or str(message.tool_calls)) % 5)
            return trajectory

        durable = artstore.durable_rollouts(store, agent, run=RUN)  # durable: 2 of 3

        async def rollout(model: art.TrainableModel, scenario: dict[str, Any]) -> art.Trajectory:
            trajectory = await durable(model, scenario)
            finished[scenario["id"]] += 1
            return trajectory

        for step in range(await model.get_step(), STEPS):
            groups = await art.gather_trajectory_groups(
                (
                    art.TrajectoryGroup(rollout(model, s) for _ in range(GROUP_SIZE))
                    for s in batch_for(step)
                ),
                after_each=artstore.group_recorder(
                    store, run=RUN, model=model, batch=step
                ),  # 3 of 3
                pbar_desc=None,
            )
            result = await backend.train(model, groups)
            await model.log(groups, metrics=result.metrics, step=result.step, split="train")
        await artstore.finish_run(store, RUN)
        await backend.close()
        await store.close()


def main(url: str, workdir: str, plan: str, log_path: str | None = None) -> None:
    """Entry point for a child process; its output goes to `log_path` when given."""
    if log_path is not None:
        log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(log, 1)
        os.dup2(log, 2)
    import warnings

    warnings.simplefilter("ignore", DeprecationWarning)  # ART 0.5.23: TrajectoryGroup(awaitables)
    asyncio.run(train(url, Path(workdir), plan))


if __name__ == "__main__":
    if len(sys.argv) != 4:
        raise SystemExit(__doc__)
    main(*sys.argv[1:])
