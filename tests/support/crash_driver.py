"""A training script that kills itself (SIGKILL) at one chosen point, for the crash tests.

    python tests/support/crash_driver.py DATABASE_URL WORKDIR POINT:N[,POINT:N...]

It trains a small run (3 scenarios in batches of 2 and 1, 3 epochs, groups of 2 policy
rollouts and 1 validation rollout) with a one-call agent on a LocalInferenceServer and a
CheckOnlyBackend under WORKDIR. Run it again and again until it exits 0; the crash points
are those of tests/support/crash_points.py (all of them), with `rollout` reached by the agent on
its Nth call, once another rollout of the same scenario has finished (so a group holds a
finished and an in-flight rollout at the crash). WORKDIR/fail.json, when present, lists
[0, scenario id, n]: the agent's nth call for that scenario in a run raises, once over all
the runs (`crash_points.Failures`).
"""

from __future__ import annotations

import json
import os
from collections import Counter
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

MODEL_NAME = "crash"
PROJECT = "crashtest"
SCENARIOS = [{"question": f"What is fact number {i}?", "id": i} for i in range(3)]
EPOCHS, BATCH_SIZE, GROUP_SIZE, VALIDATION_SAMPLES = 3, 2, 2, 1


async def train(url: str, workdir: Path, plan: str) -> None:
    import art
    from art.langgraph import init_chat_model

    import artstore
    from artstore.testing.inference_server import LocalInferenceServer

    crash_plan = CrashPlan(workdir, plan)
    planned = workdir / "fail.json"
    failures = Failures(workdir, json.loads(planned.read_text()) if planned.exists() else [])
    finished_per_scenario: Counter[int] = Counter()

    async def agent(scenario: dict[str, Any], thread_id: str) -> str:
        reply = await init_chat_model().ainvoke([("user", scenario["question"])])
        await crash_plan.reach_rollout(
            finished_per_scenario,
            scenario["id"],
            lambda: finished_in_unsealed_group(store, scenario["id"]),
        )
        failures.check(0, scenario["id"])
        finished_per_scenario[scenario["id"]] += 1
        return reply.content

    def reward(scenario: Any, results: list[Any], trajectories: list[Any]) -> list[float]:
        return [float(len(str(result)) % 5) for result in results]

    with LocalInferenceServer() as server:
        backend = CrashingBackend(
            crash_plan,
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
        crash_around_appends(store, crash_plan)
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


if __name__ == "__main__":
    run_from_command_line(train)
