"""Running the demo: a new run each time (demo-1, demo-2, ...) on the chosen store."""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import select

from artstore.errors import NotFoundError
from artstore.schema import tables as t

if TYPE_CHECKING:
    from artstore.store import Store

PROJECT = "artstore-demo"
BASE_MODEL = "Qwen/Qwen2.5-0.5B-Instruct"  # a name only: nothing is downloaded


@dataclass
class DemoResult:
    run: str
    model: str  # "project/name"
    art_path: str  # where CheckOnlyBackend keeps the model's checkpoints
    steps: list[int] = field(default_factory=list)
    rollouts: int = 0
    already_finished: bool = False  # `resume` named a finished run: nothing was done


async def demo_runs(store: Store) -> set[str]:
    """The names of the demo runs recorded in `store`."""
    async with store.database.read() as connection:
        rows = await connection.execute(select(t.runs.c.run).where(t.runs.c.run.like("demo-%")))
        return {name for (name,) in rows if re.fullmatch(r"demo-(\d+)", name)}


async def next_run_name(store: Store, art_path: Path) -> str:
    """`demo-N` for the first N whose run and checkpoints do not exist yet."""
    taken = [int(name.removeprefix("demo-")) for name in await demo_runs(store)]
    number = max(taken, default=0) + 1
    while (art_path / PROJECT / "models" / f"demo-{number}").exists():
        number += 1
    return f"demo-{number}"


async def run_demo(
    store: Store,
    *,
    workdir: str | os.PathLike[str] | None = None,
    epochs: int = 2,
    batch_size: int = 2,
    group_size: int = 4,
    num_scenarios: int = 4,
    on_start: Callable[[str, int, int], None] | None = None,
    on_rollout: Callable[[], None] | None = None,
    on_step: Callable[[int], None] | None = None,
    resume: str | None = None,
) -> DemoResult:
    """Train a new demo run into `store`; the backend's state goes to `<workdir>/.art`.

    `resume`: the name of an earlier demo run that stopped before it finished (an
    interrupted `artstore demo`), resumed where it stopped instead of starting a new run;
    a run that finished every step is left as it is (`already_finished`).
    `on_start(run, rollouts, steps)` is called with the totals when training starts,
    `on_rollout()` after each rollout, `on_step(step)` after each train step.
    """
    from artstore.art_api import trainable_model_class
    from artstore.backends import CheckOnlyBackend
    from artstore.demo.task import agent, demo_policy, make_scenarios, reward
    from artstore.testing.inference_server import LocalInferenceServer
    from artstore.training import TrainingConfig, TrainingFramework
    from artstore.training.framework import run_is_finished

    art_path = Path(workdir or Path.cwd()).absolute() / ".art"
    run = resume or await next_run_name(store, art_path)
    if resume is not None and resume not in await demo_runs(store):
        raise NotFoundError(f"no demo run {resume!r} in this store")
    result = DemoResult(run=run, model=f"{PROJECT}/{run}", art_path=str(art_path))
    model = trainable_model_class()(name=run, run_name=run, project=PROJECT, base_model=BASE_MODEL)
    if resume is not None and await run_is_finished(store, run, model, num_scenarios, epochs):
        result.already_finished = True
        return result
    scenarios = make_scenarios(num_scenarios)
    config = TrainingConfig(
        epochs=epochs, batch_size=batch_size, group_size=group_size, validation_samples=0
    )
    if on_start is not None:
        steps = epochs * -(-num_scenarios // batch_size)
        on_start(run, epochs * num_scenarios * group_size, steps)

    class Backend(CheckOnlyBackend):
        async def train(self, model: Any, groups: Any, **kwargs: Any) -> Any:
            result = await super().train(model, groups, **kwargs)
            if on_step is not None:
                on_step(result.step)
            return result

    async def counted_agent(scenario: Any, thread_id: str) -> Any:
        result = await agent(scenario, thread_id)
        if on_rollout is not None:
            on_rollout()
        return result

    async with LocalInferenceServer(policy=demo_policy) as server:
        backend = Backend(
            path=art_path, inference_base_url=server.base_url, inference_api_key=server.api_key
        )
        await model.register(backend)
        summary = await TrainingFramework(store, progress=False).run_training(
            model=model,
            scenarios=scenarios,
            agent_function=counted_agent,
            reward_function=reward,
            config=config,
            run=run,
        )
        await backend.close()
    result.steps = summary.steps_trained
    result.rollouts = epochs * num_scenarios * group_size
    return result
