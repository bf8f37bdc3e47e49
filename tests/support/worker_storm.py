"""The processes of the worker fault storm (tests/workers/test_worker_storm.py): a trainer
and workers.

Each entry point runs in a process of its own, forked from a forkserver that imported ART
once, and is killed, paused and cut off from the database by the test:

- `trainer`: trains run `storm/storm` from workers (TrainingConfig(rollouts="workers"))
  with a CheckOnlyBackend under WORKDIR/art; run again after every kill, it resumes;
- `worker`: `artstore.workers.run_worker` on the run, with the agent and reward function
  below (the trainer registers the reward function by its import path, as a user's
  module-level function would be), and writes its summary as JSON when it exits.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
from pathlib import Path
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

PROJECT = MODEL_NAME = "storm"
RUN = f"{PROJECT}/{MODEL_NAME}"
SCENARIOS = [{"question": f"What is fact number {i}?", "id": i} for i in range(6)]
EPOCHS, BATCH_SIZE, GROUP_SIZE, MAX_STEPS_OFF_POLICY = 8, 2, 3, 1


async def agent(scenario: dict[str, Any], rollout_id: str) -> str:
    """One LLM call through ART's own LangGraph chat model (a trainable Choice)."""
    from art.langgraph import init_chat_model

    reply = await init_chat_model().ainvoke([("user", scenario["question"])])
    return reply.content


def reward(scenario: Any, results: list[Any], trajectories: list[Any]) -> list[float]:
    return [float(len(str(result)) % 5) for result in results]


def _log_to(path: str) -> None:
    log = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    logging.basicConfig(level=logging.WARNING, format=f"{os.getpid()} %(message)s")


def trainer(url: str, workdir: str, base_url: str, api_key: str, log_path: str) -> None:
    _log_to(log_path)
    asyncio.run(_train(url, Path(workdir), base_url, api_key))


async def _train(url: str, workdir: Path, base_url: str, api_key: str) -> None:
    import art

    import artstore
    from artstore.backends import CheckOnlyBackend
    from artstore.errors import TrainerConflictError

    backend = CheckOnlyBackend(
        path=workdir / "art", inference_base_url=base_url, inference_api_key=api_key
    )
    model = art.TrainableModel(
        name=MODEL_NAME, run_name=MODEL_NAME, project=PROJECT, base_model="test-base"
    )
    await model.register(backend)
    config = artstore.TrainingConfig(
        epochs=EPOCHS,
        batch_size=BATCH_SIZE,
        group_size=GROUP_SIZE,
        rollouts="workers",
        max_steps_off_policy=MAX_STEPS_OFF_POLICY,
    )
    async with await artstore.open_store(url) as store:
        # Started again right after a kill, as a scheduler would: the killed trainer's
        # session (and its lease on the model) may take a moment to end on the server.
        for _ in range(100):
            try:
                summary = await artstore.TrainingFramework(store).run_training(
                    model=model,
                    scenarios=SCENARIOS,
                    agent_function=agent,
                    reward_function=reward,
                    config=config,
                )
                break
            except TrainerConflictError:
                await asyncio.sleep(0.1)
    print("trainer finished:", summary, flush=True)


def worker(url: str, api_key: str, lease_s: float, summary_path: str, log_path: str) -> None:
    _log_to(log_path)
    asyncio.run(_work(url, api_key, lease_s, Path(summary_path)))


async def _work(url: str, api_key: str, lease_s: float, summary_path: Path) -> None:
    import artstore
    from artstore.workers import run_worker

    async with await artstore.open_store(url) as store:
        summary = await run_worker(
            store, RUN, agent, concurrency=3, lease_s=lease_s, api_key=api_key, wait_for_run_s=120
        )
    summary_path.write_text(json.dumps(dataclasses.asdict(summary)))
    print("worker finished:", summary, flush=True)
