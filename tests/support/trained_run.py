"""A real, small training run for the replay / rescore / CLI tests.

`train_run` trains the demo's LangGraph agent (`artstore.demo.task`) through
`TrainingFramework` against the local inference server and `CheckOnlyBackend`: every
event is the real thing. Sizes are small so that a test pays about a second for it.
`batch_size=1` makes one group per step, so the groups' policy steps are 0, 1, 2, ...
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import art
from command_line import run_artstore

from artstore.backends import CHECKPOINT_FILE, CheckOnlyBackend
from artstore.demo.task import agent as demo_agent
from artstore.demo.task import demo_policy, make_scenarios, reward
from artstore.testing.inference_server import LocalInferenceServer
from artstore.training import TrainingConfig, TrainingFramework

PROJECT = "tests"
BASE_MODEL = "Qwen/Qwen2.5-0.5B-Instruct"


@dataclass
class TrainedRun:
    run: str
    model: str  # "project/name"
    art_path: Path
    group_ids: list[str]


async def train_run(
    store: Any,
    art_path: Path,
    *,
    run: str = "legs",
    name: str = "agent",
    epochs: int = 2,
    scenarios: int = 2,
    batch_size: int = 1,
    group_size: int = 3,
    agent: Any = None,
) -> TrainedRun:
    """Train `project/name` on the demo task as run `run`; returns its groups in order."""
    from artstore.training.overview import describe_run

    async with LocalInferenceServer(policy=demo_policy) as server:
        backend = CheckOnlyBackend(
            path=art_path, inference_base_url=server.base_url, inference_api_key=server.api_key
        )
        model = art.TrainableModel(name=name, run_name=name, project=PROJECT, base_model=BASE_MODEL)
        await model.register(backend)
        await TrainingFramework(store).run_training(
            model=model,
            scenarios=make_scenarios(scenarios),
            agent_function=agent or demo_agent,
            reward_function=reward,
            config=TrainingConfig(
                epochs=epochs, batch_size=batch_size, group_size=group_size, validation_samples=0
            ),
            run=run,
        )
    groups = (await describe_run(store, run))["groups"]
    return TrainedRun(run, f"{PROJECT}/{name}", art_path, [g["group_id"] for g in groups])


async def new_model(art_path: Path, name: str) -> art.TrainableModel:
    """Another trainable model of the same base, registered with a CheckOnlyBackend."""
    model = art.TrainableModel(name=name, run_name=name, project=PROJECT, base_model=BASE_MODEL)
    await model.register(CheckOnlyBackend(path=art_path))
    return model


def checkpoint_record(art_path: Path, name: str, step: int) -> dict[str, Any]:
    """What CheckOnlyBackend wrote for `step` of `tests/name` (advantages, metrics...)."""
    path = art_path / PROJECT / "models" / name / "checkpoints" / f"{step:04d}" / CHECKPOINT_FILE
    return json.loads(path.read_text())


async def event_count(store: Any) -> int:
    from sqlalchemy import func, select

    from artstore.schema import tables as t

    async with store.database.read() as connection:
        return (await connection.execute(select(func.count()).select_from(t.events))).scalar()


async def latest_rewards(store: Any, group_id: str, scorer: str) -> list[float]:
    """The group's policy rewards by `scorer`, in the group's order (latest per rollout)."""
    from artstore.training.replay import policy_rewards

    return (await policy_rewards(store, [group_id], scorer))[group_id]


# --- for the command-line tests (synchronous: the commands run their own event loop) ------


def train_run_sync(url: str, art_path: Path, **options: Any) -> TrainedRun:
    """`train_run` on the store at `url`, from a test that is not async."""
    import asyncio

    import artstore

    async def work() -> TrainedRun:
        async with await artstore.open_store(url) as store:
            return await train_run(store, art_path, **options)

    return asyncio.run(work())


def in_store(url: str, work: Any) -> Any:
    """`await work(store)` on the store at `url`, from a test that is not async."""
    import asyncio

    import artstore

    async def run() -> Any:
        async with await artstore.open_store(url) as store:
            return await work(store)

    return asyncio.run(run())


def cli(*args: Any, columns: int = 200) -> Any:
    """Run `artstore ARGS...` in this process (`command_line.run_artstore`); the result
    has exit_code, stdout, stderr. Rich tables are as wide as `columns`."""
    return run_artstore(*args, columns=columns)


def one_line_error(result: Any) -> str:
    """The single line a failed command printed on stderr (and nothing like a traceback)."""
    assert "Traceback" not in result.output, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: "), lines[0]
    return lines[0]


# --- a RULER judge for LocalInferenceServer -------------------------------------------------

TRAJECTORY = re.compile(r'<trajectory id="(\d+)">\n(.*?)\n</trajectory>', re.S)


def judge_score(tools_used: list[str]) -> float:
    """What the judge gives a trajectory, by the tools it called."""
    if "multiply" in tools_used:
        return 0.9
    return 0.4 if "legs_per_animal" in tools_used else 0.1


def judge_policy(request: dict[str, Any], sample_index: int) -> str:
    """RULER's judge: one score per trajectory id found in the prompt, as RULER's JSON."""
    prompt = request["messages"][-1]["content"]
    scores = []
    for trajectory_id, body in TRAJECTORY.findall(prompt):
        used = [name for name in ("multiply", "legs_per_animal") if f'"{name}"' in body]
        scores.append(
            {
                "trajectory_id": trajectory_id,
                "explanation": f"called {', '.join(used) or 'no tool'}",
                "score": judge_score(used),
            }
        )
    return json.dumps({"scores": scores})
