"""ART's PipelineTrainer (ART >= 0.5.20) on the store, killing itself (SIGKILL) at one point.

    python tests/pipeline_crash_driver.py DATABASE_URL WORKDIR POINT:N[,POINT:N...]

12 scenarios, groups of 2 rollouts made by `make_group_rollout_fn` over an agent calling
`model.openai_client()`, 2 rollout workers, batches of 2 groups, on CheckOnlyBackend, built
with `artstore.pipeline_trainer(store, ...)`. Points, as in tests/loop_crash_driver.py:

- rollout: a rollout, once another rollout of the same scenario has finished;
- sealed: right after a `group.sealed` append committed (a group
  recorded and queued, not trained);
- train-start / train-end / before-completed / after-completed / before-finished.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections import Counter
from pathlib import Path
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from loop_crash_driver import Crasher

POINTS = (
    "rollout",
    "sealed",
    "train-start",
    "train-end",
    "before-completed",
    "after-completed",
    "before-finished",
)
RUN = "pipelines/crash"
PROJECT, MODEL_NAME = "pipelines", "agent"
NUM_SCENARIOS, GROUP_SIZE, BATCH_SIZE = 12, 2, 2
SCENARIOS = [{"question": f"What is fact number {i}?", "id": i} for i in range(NUM_SCENARIOS)]


async def train(url: str, workdir: Path, plan: str) -> None:
    import art
    from art.pipeline_trainer import PipelineRuntimeConfig, make_group_rollout_fn

    import artstore
    from artstore.art_versions import trainable_model
    from artstore.backends import CheckOnlyBackend
    from artstore.events import GroupSealed, RunFinished, TrainStepCompleted
    from artstore.testing.inference_server import LocalInferenceServer

    crasher = Crasher(workdir, plan, POINTS)
    finished: Counter[int] = Counter()
    invocation = len(list(workdir.glob("fired-*")))  # 0 for the first run, 1 after one crash...
    completions = open(workdir / "completions.txt", "a")  # noqa: SIM115

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
        backend = CrashingBackend(
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
            if crasher.fires_next("rollout"):
                for _ in range(100):
                    if finished[scenario["id"]]:
                        break
                    await asyncio.sleep(0.01)
            crasher.reached("rollout")
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


def main(url: str, workdir: str, plan: str, log_path: str | None = None) -> None:
    if log_path is not None:
        log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(log, 1)
        os.dup2(log, 2)
    asyncio.run(train(url, Path(workdir), plan))


if __name__ == "__main__":
    if len(sys.argv) != 4:
        raise SystemExit(__doc__)
    main(*sys.argv[1:])
