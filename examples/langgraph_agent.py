"""ART's LangGraph pattern on the store: a ReAct agent's calls, rewards, groups and steps.

    python examples/langgraph_agent.py [--url URL] [--art-path DIR] [--steps N]

`artstore.langgraph.wrap_rollout` is ART's `art.langgraph.wrap_rollout`, recorded: every
call of the chat model inside the agent is an `llm.call` event of a rollout of the run,
and the `art.Trajectory` it returns is projected from those events. The group recorder
seals the trajectories as they are (their reward set by the rollout), and the recording
backend records the train steps. Offline: the local server and CheckOnlyBackend.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import warnings

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import art
from langchain_core.tools import tool

import artstore
from artstore.backends import CheckOnlyBackend
from artstore.langgraph import init_chat_model, wrap_rollout
from artstore.testing.inference_server import LocalInferenceServer

RUN = "examples/langgraph"
QUESTIONS = ["How many legs has a spider?", "How many legs has an ant?", "And a crab?"]


@tool
def legs_per_animal(animal: str) -> int:
    """How many legs an animal has."""
    return {"spider": 8, "ant": 6, "crab": 10}.get(animal.lower(), 4)


async def rollout(question: str) -> art.Trajectory:
    with warnings.catch_warnings():  # create_react_agent moved in LangGraph 1.x
        warnings.simplefilter("ignore")
        from langgraph.prebuilt import create_react_agent

        model = init_chat_model().bind_tools([legs_per_animal])
        graph = create_react_agent(model, [legs_per_animal])
    state = await graph.ainvoke({"messages": [("user", question)]})
    used = [m.name for m in state["messages"] if m.type == "tool"]
    return art.Trajectory(messages_and_choices=[], reward=float(len(used)))


async def main(url: str | None, art_path: str, steps: int) -> None:
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
            name="langgraph", project="examples", base_model="Qwen/Qwen3-8B", run_name="langgraph"
        )
        await model.register(backend)
        recorded = wrap_rollout(store, model, rollout, run=RUN)
        for step in range(await model.get_step(), steps):
            groups = await art.gather_trajectory_groups(
                (art.TrajectoryGroup(recorded(q) for _ in range(2)) for q in QUESTIONS[:2]),
                after_each=artstore.group_recorder(store, run=RUN, model=model, batch=step),
                pbar_desc=None,
            )
            result = await backend.train(model, groups)
            await model.log(groups, metrics=result.metrics, step=result.step, split="train")
            print(f"step {result.step}: trained {len(groups)} groups", flush=True)
        await artstore.finish_run(store, RUN)
        await backend.close()
        await store.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="the store (default: $ARTSTORE_URL, .artstore/artstore.db)")
    parser.add_argument("--art-path", default=".art", help="where the backend keeps checkpoints")
    parser.add_argument("--steps", type=int, default=2)
    args = parser.parse_args()
    asyncio.run(main(args.url, args.art_path, args.steps))
