"""ART's PipelineTrainer (ART >= 0.5.20, Python 3.12+) on the store: durable async RL.

    python examples/pipeline_trainer.py [--url URL] [--art-path DIR]

`artstore.pipeline_trainer(store, ...)` takes PipelineTrainer's own arguments and returns ART's
trainer, with the store as its memory: each group is recorded when the rollout function
returns it (before it is queued), each train call is a recorded step, and after a crash
the groups recorded and never trained are trained first, and only the scenarios without
a group are rolled out again. ART's own resume counts scenarios pulled, so its queued and
in-flight groups would be lost. Offline: the local server and CheckOnlyBackend.
"""

from __future__ import annotations

import argparse
import asyncio
import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import art
from art.pipeline_trainer import PipelineRuntimeConfig, make_group_rollout_fn

import artstore
from artstore.backends import CheckOnlyBackend
from artstore.testing.inference_server import LocalInferenceServer

RUN = "examples/pipeline"


async def main(url: str | None, art_path: str, scenarios: int) -> None:
    with LocalInferenceServer() as server:
        store = await artstore.open_store(url)
        backend = CheckOnlyBackend(
            path=art_path, inference_base_url=server.base_url, inference_api_key=server.api_key
        )
        model = art.TrainableModel(
            name="pipeline", project="examples", base_model="Qwen/Qwen3-8B", run_name="pipeline"
        )
        await model.register(backend)
        client = model.openai_client()

        async def rollout(
            model: art.TrainableModel, scenario: dict, config: None
        ) -> art.Trajectory:
            messages = [{"role": "user", "content": scenario["question"]}]
            completion = await client.chat.completions.create(
                model=model.get_inference_name(), messages=messages, logprobs=True
            )
            answer = completion.choices[0].message.content or ""
            return art.Trajectory(
                messages_and_choices=[*messages, completion.choices[0]],
                reward=float(len(answer) % 3),
            )

        trainer = artstore.pipeline_trainer(
            store,
            run=RUN,
            model=model,
            backend=backend,
            rollout_fn=make_group_rollout_fn(rollout, n=4),
            scenarios=[{"question": f"What is fact number {i}?"} for i in range(scenarios)],
            pipeline=PipelineRuntimeConfig(num_rollout_workers=2, min_batch_size=2),
            log_interval_seconds=60,
        )
        await trainer.train()
        print(f"trained to step {await model.get_step()}", flush=True)
        await model.backend().close()
        await store.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="the store (default: $ARTSTORE_URL, .artstore/artstore.db)")
    parser.add_argument("--art-path", default=".art", help="where the backend keeps checkpoints")
    parser.add_argument("--scenarios", type=int, default=8)
    args = parser.parse_args()
    asyncio.run(main(args.url, args.art_path, args.scenarios))
