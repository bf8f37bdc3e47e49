"""A loop of ART's own kind, made durable, that kills itself (SIGKILL) at one chosen point.

    python tests/support/loop_crash_driver.py DATABASE_URL WORKDIR POINT:N[,POINT:N...]

The loop is what ART's examples write: an agent calling `model.openai_client()` with
tools, `art.gather_trajectory_groups` over `art.TrajectoryGroup(rollout(...) for ...)`,
`backend.train` then `model.log`, for `range(await model.get_step(), STEPS)`. Three lines
make it durable: the backend is `artstore.recording_backend(store, ...)`, the rollout function
`artstore.durable_rollouts(store, ...)`, and `after_each=artstore.group_recorder(store, ...)`.

Its crash points are those of tests/support/crash_points.py that a loop reaches (all but push),
with `rollout` reached by the agent once a rollout of the same scenario has finished.

WORKDIR/options.json, when present, changes the loop (see `Options`): its group size and
steps, `max_exceptions`, rollouts the agent fails, each once over all the runs (an agent
that fails now and then: a rollout done again succeeds), `@art.retry` around the agent,
and the loop of examples/resumable_loop.py instead of durable rollouts (each group
recorded as it ends, what was recorded and never trained trained first on a start). Each
trajectory the agent returns carries a fresh `attempt` id in its metadata, also appended
to WORKDIR/attempts.txt, so that a test can tell a trajectory recorded (or trained) twice
from two alike.
"""

from __future__ import annotations

import json
import os
import uuid
import warnings
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from crash_points import (
    CrashingBackend,
    CrashPlan,
    Failures,
    crash_around_appends,
    finished_in_unsealed_group,
    run_from_command_line,
)
from training_helpers import LOOKUP_TOOL

RUN = "loops/crash"
PROJECT, MODEL_NAME = "loops", "agent"
STEPS, BATCH_SIZE, GROUP_SIZE = 4, 2, 2
SCENARIOS = [{"question": f"What is fact number {i}?", "id": i} for i in range(3)]
TOOLS = [LOOKUP_TOOL]


def batch_for(step: int) -> list[dict[str, Any]]:
    """The scenarios of a step (distinct within a step, repeating across steps)."""
    return [SCENARIOS[(step * BATCH_SIZE + k) % len(SCENARIOS)] for k in range(BATCH_SIZE)]


@dataclass
class Options:
    """How the loop runs (WORKDIR/options.json; the defaults are the plain loop)."""

    steps: int = STEPS
    group_size: int = GROUP_SIZE
    max_exceptions: int = 0
    retry: bool = False  # the agent under @art.retry(max_attempts=2), inside durable_rollouts
    durable: bool = True  # else no durable_rollouts: unconsumed_groups first on a start
    #: [step, scenario id, n]: the nth call of the agent for that step and scenario in a
    #: run raises AgentFailure, once over all runs (a marker file says it did).
    fail: list[list[int]] = field(default_factory=list)

    @classmethod
    def of(cls, workdir: Path) -> Options:
        path = workdir / "options.json"
        return cls(**json.loads(path.read_text())) if path.exists() else cls()

    def write(self, workdir: Path) -> None:
        (workdir / "options.json").write_text(json.dumps(self.__dict__))


def record_attempt(workdir: Path, trajectory: Any) -> None:
    """Give `trajectory` a fresh attempt id, and note it in WORKDIR/attempts.txt."""
    attempt = uuid.uuid4().hex
    trajectory.metadata["attempt"] = attempt
    with open(workdir / "attempts.txt", "a") as attempts:
        attempts.write(attempt + "\n")


async def train(url: str, workdir: Path, plan: str) -> None:
    warnings.simplefilter("ignore", DeprecationWarning)  # ART 0.5.23: TrajectoryGroup(awaitables)
    import art

    import artstore
    from artstore.art_versions import trainable_model
    from artstore.testing.inference_server import LocalInferenceServer

    crash_plan = CrashPlan(workdir, plan)
    options = Options.of(workdir)
    failures = Failures(workdir, options.fail)
    finished: Counter[int] = Counter()

    with LocalInferenceServer() as server:
        store = await artstore.open_store(url)
        crash_around_appends(store, crash_plan)

        # --- the user's loop ------------------------------------------------------------
        backend = artstore.recording_backend(
            store,  # durable: 1 of 3
            CrashingBackend(
                crash_plan,
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
            await crash_plan.reach_rollout(
                finished,
                scenario["id"],
                # Only durable rollouts are stored before their group is.
                (lambda: finished_in_unsealed_group(store, scenario["id"]))
                if options.durable
                else None,
            )
            failures.check(await model.get_step(), scenario["id"])
            message = completion.choices[0].message
            trajectory.reward = float(len(message.content or str(message.tool_calls)) % 5)
            record_attempt(workdir, trajectory)
            return trajectory

        if options.retry:
            agent = art.retry(max_attempts=2, delay=0)(agent)
        if options.durable:
            agent = artstore.durable_rollouts(store, agent, run=RUN)  # durable: 2 of 3
        else:  # examples/resumable_loop.py: what was recorded and not trained, first
            leftover = await artstore.unconsumed_groups(store, RUN, model)
            if leftover:
                result = await backend.train(model, leftover)
                await model.log(leftover, metrics=result.metrics, step=result.step, split="train")

        async def rollout(model: art.TrainableModel, scenario: dict[str, Any]) -> art.Trajectory:
            trajectory = await agent(model, scenario)
            finished[scenario["id"]] += 1
            return trajectory

        for step in range(await model.get_step(), options.steps):
            groups = await art.gather_trajectory_groups(
                (
                    art.TrajectoryGroup(rollout(model, s) for _ in range(options.group_size))
                    for s in batch_for(step)
                ),
                after_each=artstore.group_recorder(
                    store, run=RUN, model=model, batch=step
                ),  # 3 of 3
                pbar_desc=None,
                max_exceptions=options.max_exceptions,
            )
            result = await backend.train(model, groups)
            await model.log(groups, metrics=result.metrics, step=result.step, split="train")
        await artstore.finish_run(store, RUN)
        await backend.close()
        await store.close()


if __name__ == "__main__":
    run_from_command_line(train)
