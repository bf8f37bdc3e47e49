"""ART's OpenAI-client agent with tools, made durable by artstore with three lines.

    python examples/openai_agent.py [--url URL] [--art-path DIR] [--steps N]

The loop is ART's own: `model.openai_client()`, an `art.Trajectory` built from the
choices, `art.gather_trajectory_groups`, `backend.train`, `model.log`. The lines marked
`artstore` record every trajectory, group and train step in the store (SQLite by
default, `--url postgresql://...` for many machines), so the run can be resumed,
re-scored (`artstore rescore`) and replayed into another model (`artstore replay`).

It runs offline: a local OpenAI-compatible server answers (tool calls and logprobs), and
CheckOnlyBackend stands in for the GPU trainer (it checks the groups, advances the step
and trains nothing). Swap in `art.LocalBackend()` and a real model to train for real.
"""

from __future__ import annotations

import argparse
import asyncio
import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import art

import artstore
from artstore.backends import CheckOnlyBackend
from artstore.testing.inference_server import LocalInferenceServer

RUN = "examples/openai-agent"
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "Look up a fact about a topic.",
            "parameters": {
                "type": "object",
                "properties": {"topic": {"type": "string"}},
                "required": ["topic"],
            },
        },
    }
]
SCENARIOS = [{"topic": topic} for topic in ("octopus", "spider", "ant", "crab")]


async def main(url: str | None, art_path: str, steps: int) -> None:
    with LocalInferenceServer() as server:
        store = await artstore.open_store(url)  # artstore
        # artstore: every train call is a recorded train step
        backend = artstore.recording_backend(
            store,
            CheckOnlyBackend(
                path=art_path, inference_base_url=server.base_url, inference_api_key=server.api_key
            ),
            run=RUN,
        )
        model = art.TrainableModel(
            name="openai-agent",
            project="examples",
            base_model="Qwen/Qwen3-8B",
            run_name="openai-agent",
        )
        await model.register(backend)
        client = model.openai_client()

        async def rollout(model: art.TrainableModel, scenario: dict) -> art.Trajectory:
            trajectory = art.Trajectory(
                messages_and_choices=[
                    {"role": "system", "content": "Use the lookup tool, then answer."},
                    {"role": "user", "content": f"How many legs has an {scenario['topic']}?"},
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
            choice = completion.choices[0]
            trajectory.messages_and_choices.append(choice)
            called = [call.function.name for call in choice.message.tool_calls or []]
            trajectory.reward = 1.0 if "lookup" in called else float(len(called))
            trajectory.metrics["tool_calls"] = len(called)
            return trajectory

        rollout = artstore.durable_rollouts(store, rollout, run=RUN)  # artstore: resumable rollouts
        for step in range(await model.get_step(), steps):
            batch = [SCENARIOS[(2 * step + k) % len(SCENARIOS)] for k in range(2)]
            groups = await art.gather_trajectory_groups(
                (art.TrajectoryGroup(rollout(model, s) for _ in range(4)) for s in batch),
                after_each=artstore.group_recorder(
                    store, run=RUN, model=model, batch=step
                ),  # artstore
                pbar_desc=None,
            )
            result = await backend.train(model, groups, learning_rate=1e-5)
            await model.log(groups, metrics=result.metrics, step=result.step, split="train")
            print(f"step {result.step}: {len(groups)} groups trained", flush=True)
        await artstore.finish_run(store, RUN)
        await backend.close()
        await store.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="the store (default: $ARTSTORE_URL, .artstore/artstore.db)")
    parser.add_argument("--art-path", default=".art", help="where the backend keeps checkpoints")
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    asyncio.run(main(args.url, args.art_path, args.steps))
