"""ART's PipelineTrainer (ART >= 0.5.20) on the store, killing itself (SIGKILL) at one point.

    python tests/support/pipeline_crash_driver.py DATABASE_URL WORKDIR POINT:N[,POINT:N...]

12 scenarios, groups of 2 rollouts made by `make_group_rollout_fn` over an agent calling
`model.openai_client()`, 2 rollout workers, batches of 2 groups, on CheckOnlyBackend, built
with `artstore.pipeline_trainer(store, ...)`. Crash points (tests/support/crash_points.py) as in
tests/support/loop_crash_driver.py:

- rollout: a rollout, once another rollout of the same scenario has finished;
- sealed: right after a `group.sealed` append committed (a group
  recorded and queued, not trained);
- train-start / train-end / before-completed / after-completed / before-finished.
"""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from crash_points import CrashingBackend, CrashPlan, crash_around_appends, run_from_command_line

RUN = "pipelines/crash"
PROJECT, MODEL_NAME = "pipelines", "agent"
NUM_SCENARIOS, GROUP_SIZE, BATCH_SIZE = 12, 2, 2
SCENARIOS = [{"question": f"What is fact number {i}?", "id": i} for i in range(NUM_SCENARIOS)]


async def train(url: str, workdir: Path, plan: str) -> None:
    import art
    from art.pipeline_trainer import PipelineRuntimeConfig, make_group_rollout_fn

    import artstore
    from artstore.art_versions import trainable_model
    from artstore.testing.inference_server import LocalInferenceServer

    crash_plan = CrashPlan(workdir, plan)
    finished: Counter[int] = Counter()
    invocation = len(list(workdir.glob("fired-*")))  # 0 for the first run, 1 after one crash...
    completions = open(workdir / "completions.txt", "a")  # noqa: SIM115

    with LocalInferenceServer() as server:
        store = await artstore.open_store(url)
        crash_around_appends(store, crash_plan)
        backend = CrashingBackend(
            crash_plan,
            path=workdir / "art",
            inference_base_url=server.base_url,
            inference_api_key=server.api_key,
        )
        model = trainable_model(name=MODEL_NAME, project=PROJECT, base_model="test-base")
        await model.register(backend)
        client = model.openai_client()

        async def rollout(model: Any, scenario: dict[str, Any], config: Any) -> art.Trajectory:
            messages = [{"role": "user", "content": scenario["question"]}]
            completion = await client.chat.completions.create(
                model=model.get_inference_name(), messages=messages, logprobs=True
            )
            await crash_plan.reach_rollout(finished, scenario["id"])
            finished[scenario["id"]] += 1
            completions.write(f"{invocation} {scenario['id']}\n")  # what was paid for, when
            completions.flush()
            content = completion.choices[0].message.content or ""
            return art.Trajectory(
                messages_and_choices=[*messages, completion.choices[0]],
                reward=float(len(content) % 5),
            )

        trainer = artstore.pipeline_trainer(
            store,
            run=RUN,
            model=model,
            backend=backend,
            rollout_fn=make_group_rollout_fn(rollout, n=GROUP_SIZE),
            scenarios=SCENARIOS,
            pipeline=PipelineRuntimeConfig(
                num_rollout_workers=2, min_batch_size=BATCH_SIZE, max_batch_size=BATCH_SIZE
            ),
            max_steps_off_policy=None,
            log_interval_seconds=60,
        )
        await trainer.train(handle_signals=False)
        await model.backend().close()
        await store.close()


if __name__ == "__main__":
    run_from_command_line(train)
