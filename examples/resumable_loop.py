"""A training loop of your own, killed at any point and started again: nothing lost, nothing twice.

    python examples/resumable_loop.py [--url URL] [--art-path DIR] [--steps N]

Batches are drawn at random, so a restarted loop cannot roll the same batch out again.
What makes it resumable is the store: each group is recorded the moment it is complete
(`after_each=artstore.group_recorder(store, ...)`), every `backend.train` call is a
recorded train step (`artstore.recording_backend(store, ...)`), and at the start the loop
trains what was recorded and never trained (`artstore.unconsumed_groups(store, ...)`),
before rolling anything out. Kill it (even with SIGKILL) and run it again: no finished
group is rolled out again, none is trained twice, and a step the backend finished just
before the kill is recorded from the backend's own step (`model.get_step()`).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import art

import artstore
from artstore.backends import CheckOnlyBackend
from artstore.testing.inference_server import LocalInferenceServer

RUN = "examples/resumable"
SCENARIOS = [f"What is fact number {i}?" for i in range(10)]


async def main(url: str | None, art_path: str, steps: int, delay: float) -> None:
    with LocalInferenceServer() as server:
        store = await artstore.open_store(url)
        backend = artstore.recording_backend(
            store,
            CheckOnlyBackend(
                path=art_path, inference_base_url=server.base_url, inference_api_key=server.api_key
            ),
            run=RUN,
        )
        model = art.TrainableModel(
            name="resumable", project="examples", base_model="Qwen/Qwen3-8B", run_name="resumable"
        )
        await model.register(backend)
        client = model.openai_client()

        async def rollout(model: art.TrainableModel, question: str) -> art.Trajectory:
            messages = [{"role": "user", "content": question}]
            completion = await client.chat.completions.create(
                model=model.get_inference_name(), messages=messages, logprobs=True
            )
            await asyncio.sleep(random.uniform(0, delay))  # a slow agent: tools, a sandbox...
            answer = completion.choices[0].message.content or ""
            return art.Trajectory(
                messages_and_choices=[*messages, completion.choices[0]],
                reward=float(len(answer) % 4),
            )

        async def train(groups: list[art.TrajectoryGroup]) -> None:
            result = await backend.train(model, groups)
            await model.log(groups, metrics=result.metrics, step=result.step, split="train")
            print(f"step {result.step}: trained {len(groups)} groups", flush=True)

        leftover = await artstore.unconsumed_groups(store, RUN, model)  # recorded before a crash
        if leftover:
            await train(leftover)
        while (step := await model.get_step()) < steps:
            batch = random.sample(SCENARIOS, 3)
            groups = await art.gather_trajectory_groups(
                (art.TrajectoryGroup(rollout(model, q) for _ in range(3)) for q in batch),
                after_each=artstore.group_recorder(store, run=RUN, model=model, batch=step),
                pbar_desc=None,
            )
            await train(groups)
        await artstore.finish_run(store, RUN)
        await backend.close()
        await store.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="the store (default: $ARTSTORE_URL, .artstore/artstore.db)")
    parser.add_argument("--art-path", default=".art", help="where the backend keeps checkpoints")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--delay", type=float, default=0.2, help="seconds a rollout may take")
    args = parser.parse_args()
    asyncio.run(main(args.url, args.art_path, args.steps, args.delay))
