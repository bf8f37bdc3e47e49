"""Rollout workers started by Ray, a trainer here, coordinated through PostgreSQL.

    python examples/ray_workers.py --url postgresql://user@host/db [--workers 2]

artstore needs nothing from Ray but a way to start processes: each Ray task below runs
`artstore.workers.run_worker` (what `artstore worker RUN --agent ...` runs), which claims
the run's rollouts from PostgreSQL, runs the agent, records every LLM call, and seals
groups; the trainer in this process trains each batch as soon as its groups are sealed.
Any other scheduler (Kubernetes, Slurm, SkyPilot) would start the same command.

To stay self-contained the example serves the model with artstore's local test server
(`LocalInferenceServer`, an OpenAI-compatible endpoint with logprobs) and trains with
`CheckOnlyBackend` (ART's training checks on the CPU, no weights). With a real setup, the
model is registered with `art.LocalBackend` or another ART backend, and workers reach its
inference server at the URL it serves on (`inference_base_url=` / `--inference-url`).

Ray starts a local cluster (`ray.init()`), or joins the one `RAY_ADDRESS` names. The
inference API key travels to the workers in their environment
(`ARTSTORE_INFERENCE_API_KEY`), never through the database.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import tempfile
from pathlib import Path
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

SCENARIOS = [{"question": f"What is fact number {i}?"} for i in range(4)]


async def agent(scenario: dict[str, Any], rollout_id: str) -> str:
    """The agent `TrainingFramework` takes: one call through ART's LangGraph chat model."""
    from art.langgraph import init_chat_model

    reply = await init_chat_model().ainvoke([("user", scenario["question"])])
    return reply.content


def reward(scenario: Any, results: list[Any], trajectories: list[Any]) -> list[float]:
    return [float(len(str(result)) % 5) for result in results]


def rollout_worker(url: str, run: str, concurrency: int) -> dict[str, Any]:
    """What each Ray task runs: a worker on the run, until its trainer finishes it."""
    import artstore
    from artstore.workers import run_worker

    async def work() -> Any:
        async with await artstore.open_store(url) as store:
            return await run_worker(
                store,
                run,
                agent,
                reward,  # defined in a script: workers cannot import it by name
                concurrency=concurrency,
                api_key=os.environ["ARTSTORE_INFERENCE_API_KEY"],
            )

    return dataclasses.asdict(asyncio.run(work()))


async def train(url: str, workdir: Path, workers: int) -> None:
    import art
    import ray

    import artstore
    from artstore.backends import CheckOnlyBackend
    from artstore.testing.inference_server import LocalInferenceServer

    async with LocalInferenceServer(latency_s=0.05) as server:
        backend = CheckOnlyBackend(
            path=workdir, inference_base_url=server.base_url, inference_api_key=server.api_key
        )
        model = art.TrainableModel(
            name="ray-agent", run_name="ray-agent", project="ray-example", base_model="base"
        )
        await model.register(backend)
        run = "ray-example/ray-agent"

        ray.init(
            num_cpus=max(2, workers),
            include_dashboard=False,
            runtime_env={"env_vars": {"ARTSTORE_INFERENCE_API_KEY": server.api_key}},
        )
        try:
            task = ray.remote(num_cpus=1)(rollout_worker)
            started = [task.remote(url, run, 2) for _ in range(workers)]
            async with await artstore.open_store(url) as store:
                summary = await artstore.TrainingFramework(store).run_training(
                    model=model,
                    scenarios=SCENARIOS,
                    agent_function=agent,
                    reward_function=reward,
                    config=artstore.TrainingConfig(
                        epochs=2, batch_size=2, group_size=3, rollouts="workers"
                    ),
                )
            done = await asyncio.to_thread(ray.get, started)
        finally:
            ray.shutdown()
    print(f"trained steps {summary.steps_trained} from {len(done)} Ray workers")
    for worker in done:
        print(
            f"worker {worker['worker']}: {worker['rollouts_finished']} rollouts, "
            f"{worker['groups_sealed']} groups sealed"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])  # type: ignore[union-attr]
    parser.add_argument("--url", default=os.environ.get("ARTSTORE_URL"), help="PostgreSQL URL")
    parser.add_argument("--workers", type=int, default=2, help="Ray tasks running workers")
    args = parser.parse_args()
    if not args.url or not args.url.startswith("postgres"):
        raise SystemExit("give a PostgreSQL database: --url postgresql://user@host/db")
    with tempfile.TemporaryDirectory() as workdir:
        asyncio.run(train(args.url, Path(workdir), args.workers))


if __name__ == "__main__":
    main()
