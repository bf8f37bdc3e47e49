"""Rollouts per second of artstore's rollout workers against in-process training and ART's
PipelineTrainer, on one agent whose LLM call takes a fixed latency, in one run.

What it measures, for each setup, on the same agent (one LLM call through ART's
`art.langgraph` chat model to a local OpenAI-compatible server that answers after
`--latency` seconds) and the same workload shape (8 scenarios per batch, groups of 4
rollouts, a train step per batch on `CheckOnlyBackend`, which checks ART's trajectory
groups on the CPU):

- `workers N`: a trainer in this process with `TrainingConfig(rollouts="workers",
  max_steps_off_policy=1)` and N worker processes (`artstore.workers.run_worker`, 4
  rollouts at a time each), for N = 1, 2, 4, 8, each on a fresh PostgreSQL database;
- `in-process`: `TrainingFramework` rolling out in this process (a batch's 32 rollouts
  at once, then its train step), on PostgreSQL;
- `PipelineTrainer` (ART >= 0.5.20 only): ART's own pipeline with 8 rollout workers of a
  group of 4 rollouts each (the 32 rollouts at once of 8 artstore workers), the same agent
  written against the OpenAI client, batches of 8 groups, `max_steps_off_policy=1`, the
  same backend; no store.

Rollouts per second is the number of finished rollouts divided by the time from the first
rollout's start to the last one's end (read from the event log for artstore, from the
rollout function's own clock for PipelineTrainer), so that process start-up is not
counted; worker processes warm up (one LLM call outside any rollout) before the run starts.
Scaling efficiency is `rate(N) / (N * rate(1))`. Seal to train is, per group, the time
from its seal (`group.sealed`; for PipelineTrainer, the rollout function returning the
group) to the start of the train step that trains it.

Target: 8 worker processes >= 6x one worker process's rollouts per second.

"Waiting for the append lock" is the mean number of the database's sessions found waiting
for the append lock (the table `append_lock`), sampled every 0.1 s while a setup runs: an
append holds it from its INSERT into `events` to its commit, alone (a group's seal, a
train step) or shared with other appends (a rollout's own events, and events nothing
projects), which is what bounds the appends of many processes (measured by
tools/bench_append_scaling.py). Until 2026-12-01 this column counted sessions waiting
for an advisory lock, which the append lock no longer is: it read 0.

Run it from the repository root:

    python tools/bench_workers.py                   # about 2-3 minutes
    python tools/bench_workers.py --quick           # a smoke run: 1 and 2 workers, short
    python tools/bench_workers.py --latency 0.5 --workers 1 2 4 8

PostgreSQL comes from `--postgres-url`, else `$ARTSTORE_BENCH_POSTGRES_URL`, else
`postgresql://postgres@127.0.0.1:5432/test`; the user must be allowed to create databases.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import psycopg
from rich.console import Console
from rich.table import Table
from sqlalchemy.engine import make_url

DEFAULT_POSTGRES_URL = "postgresql://postgres@127.0.0.1:5432/test"
SCENARIOS = [{"question": f"What is fact number {i}?"} for i in range(8)]
BATCH_SIZE, GROUP_SIZE, CONCURRENCY, MAX_STEPS_OFF_POLICY = 8, 4, 4, 1
TARGET_SPEEDUP = 6.0  # 8 worker processes against one
PRELOAD = ["art", "art.langgraph", "langchain_openai", "artstore.store", "artstore.workers"]


async def agent(scenario: dict[str, Any], rollout_id: str) -> str:
    from art.langgraph import init_chat_model

    reply = await init_chat_model().ainvoke([("user", scenario["question"])])
    return reply.content


def reward(scenario: Any, results: list[Any], trajectories: list[Any]) -> list[float]:
    return [float(len(str(result)) % 5) for result in results]


@dataclass
class Result:
    setup: str
    processes: int
    concurrency: int
    rollouts: int
    seconds: float
    seal_to_train: list[float] = field(default_factory=list)
    lock_waits: float | None = None  # mean transactions waiting for the append lock
    note: str = ""

    @property
    def rate(self) -> float:
        return self.rollouts / self.seconds if self.seconds > 0 else 0.0


# --- a PostgreSQL database per setup ------------------------------------------------------


class Databases:
    def __init__(self, admin_url: str) -> None:
        self.admin = make_url(admin_url).set(drivername="postgresql")
        self.created: list[str] = []

    def create(self) -> str:
        name = f"bench_workers_{uuid.uuid4().hex[:10]}"
        with psycopg.connect(self.admin.render_as_string(False), autocommit=True) as c:
            c.execute(f'CREATE DATABASE "{name}"')
        self.created.append(name)
        return self.admin.set(database=name).render_as_string(False)

    def drop_all(self) -> None:
        with psycopg.connect(self.admin.render_as_string(False), autocommit=True) as c:
            for name in self.created:
                c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


# --- artstore: worker processes and the trainer -------------------------------------------


def worker_process(url: str, run: str, base_url: str, api_key: str, ready: str) -> None:
    """One worker process: warm up, say so, then work until the trainer finishes."""
    asyncio.run(_worker(url, run, base_url, api_key, Path(ready)))


async def _worker(url: str, run: str, base_url: str, api_key: str, ready: Path) -> None:
    from langchain_openai import ChatOpenAI

    import artstore
    from artstore.workers import run_worker

    # The first LLM call of a process imports and builds what the client needs: not a
    # rollout's cost, so not measured.
    await ChatOpenAI(model="warm-up", base_url=base_url, api_key=api_key).ainvoke("warm up")
    async with await artstore.open_store(url) as store:
        ready.write_text("ready")
        await run_worker(
            store,
            run,
            agent,
            reward,
            concurrency=CONCURRENCY,
            api_key=api_key,
            wait_for_run_s=300,
        )


async def _warm_up_here(server: Any) -> None:
    from langchain_openai import ChatOpenAI

    await ChatOpenAI(model="warm-up", base_url=server.base_url, api_key=server.api_key).ainvoke(
        "warm up"
    )


async def train_artstore(
    url: str, server: Any, workdir: Path, epochs: int, rollouts: str, name: str
) -> Any:
    import art

    import artstore
    from artstore.backends import CheckOnlyBackend

    backend = CheckOnlyBackend(
        path=workdir / name, inference_base_url=server.base_url, inference_api_key=server.api_key
    )
    model = art.TrainableModel(name=name, run_name=name, project="bench", base_model="base")
    await model.register(backend)
    async with await artstore.open_store(url) as store:
        return await artstore.TrainingFramework(store).run_training(
            model=model,
            scenarios=SCENARIOS,
            agent_function=agent,
            reward_function=reward,
            config=artstore.TrainingConfig(
                epochs=epochs,
                batch_size=BATCH_SIZE,
                group_size=GROUP_SIZE,
                validation_samples=0,
                rollouts=rollouts,  # type: ignore[arg-type]
                max_steps_off_policy=MAX_STEPS_OFF_POLICY,
            ),
        )


async def measured_from_events(url: str, setup: str, processes: int, concurrency: int) -> Result:
    """Rollouts per second and seal-to-train times, from what the store recorded."""
    import artstore
    from artstore.schema import tables as t

    async with await artstore.open_store(url) as store:
        async with store.database.read() as connection:
            from sqlalchemy import func, select

            first, last, count = (
                await connection.execute(
                    select(
                        func.min(t.rollouts.c.started_at),
                        func.max(t.rollouts.c.finished_at),
                        func.count(),
                    ).where(t.rollouts.c.status == "finished")
                )
            ).one()
        sealed = {
            e.data["group_id"]: e.recorded_at async for e in store.iter_all(types=["group.sealed"])
        }
        trained: dict[str, Any] = {}
        async for e in store.iter_all(types=["train_step.started"]):
            for group_id in e.data["group_ids"]:
                trained.setdefault(group_id, e.recorded_at)
    waits = [(trained[g] - sealed[g]).total_seconds() for g in sealed if g in trained]
    return Result(setup, processes, concurrency, count, (last - first).total_seconds(), waits)


class LockWaits:
    """Samples, every 0.1 s, how many of the database's sessions wait for the append lock
    (the table `append_lock`, which appends take from their INSERT into `events` to their
    commit, alone or side by side) while a setup runs."""

    def __init__(self, url: str) -> None:
        self.url = make_url(url).set(drivername="postgresql").render_as_string(False)
        self.samples: list[int] = []
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> LockWaits:
        self._task = asyncio.create_task(asyncio.to_thread(self._sample_until_cancelled))
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self._stop = True
        if self._task is not None:
            await self._task

    _stop = False

    def _sample_until_cancelled(self) -> None:
        with psycopg.connect(self.url, autocommit=True) as connection:
            while not self._stop:
                (waiting,) = connection.execute(
                    "SELECT count(DISTINCT pid) FROM pg_locks WHERE NOT granted "
                    "AND database = (SELECT oid FROM pg_database "
                    "WHERE datname = current_database()) "
                    "AND relation = to_regclass('append_lock')"
                ).fetchone()
                self.samples.append(waiting)
                time.sleep(0.1)

    @property
    def mean(self) -> float | None:
        return statistics.mean(self.samples) if self.samples else None


async def measure_workers(
    processes: int, context: Any, databases: Databases, server: Any, workdir: Path, epochs: int
) -> Result:
    url = databases.create()
    name = f"workers-{processes}"
    run = f"bench/{name}"
    ready = [workdir / f"{name}-ready-{i}" for i in range(processes)]
    children = [
        context.Process(
            target=worker_process, args=(url, run, server.base_url, server.api_key, str(path))
        )
        for path in ready
    ]
    for child in children:
        child.start()
    deadline = time.monotonic() + 300
    while not all(path.exists() for path in ready):
        if time.monotonic() > deadline or any(c.exitcode not in (None, 0) for c in children):
            raise RuntimeError(f"worker processes of {name} did not start")
        await asyncio.sleep(0.05)
    async with LockWaits(url) as waits:
        await train_artstore(url, server, workdir, epochs, "workers", name)
        for child in children:
            await asyncio.to_thread(child.join, 120)
            if child.exitcode != 0:
                raise RuntimeError(f"a worker of {name} exited {child.exitcode}")
    result = await measured_from_events(url, f"workers {processes}", processes, CONCURRENCY)
    result.lock_waits = waits.mean
    return result


async def measure_in_process(databases: Databases, server: Any, workdir: Path, epochs: int):
    url = databases.create()
    await _warm_up_here(server)
    async with LockWaits(url) as waits:
        await train_artstore(url, server, workdir, epochs, "in_process", "in-process")
    result = await measured_from_events(url, "in-process", 1, BATCH_SIZE * GROUP_SIZE)
    result.lock_waits = waits.mean
    return result


# --- ART's PipelineTrainer ------------------------------------------------------------------


async def measure_pipeline(server: Any, workdir: Path, steps: int, workers: int) -> Result:
    import art
    from art.pipeline_trainer import make_group_rollout_fn
    from openai.types.chat.chat_completion import Choice

    from artstore.backends import CheckOnlyBackend

    spans: list[tuple[float, float]] = []
    returned: dict[str, float] = {}
    trained_at: dict[str, float] = {}

    class TimedBackend(CheckOnlyBackend):
        async def train(self, model: Any, groups: Any, **kwargs: Any) -> Any:
            groups = list(groups)
            now = time.monotonic()
            for group in groups:
                trained_at.setdefault(str(group.metadata.get("id")), now)
            return await super().train(model, groups, **kwargs)

    backend = TimedBackend(
        path=workdir / "pipeline",
        inference_base_url=server.base_url,
        inference_api_key=server.api_key,
    )
    model = art.TrainableModel(
        name="pipeline", run_name="pipeline", project="bench", base_model="base"
    )
    await model.register(backend)
    client = model.openai_client()

    async def one_rollout(model: Any, scenario: dict[str, Any], config: Any) -> Any:
        started = time.monotonic()
        messages = [{"role": "user", "content": scenario["question"]}]
        completion = await client.chat.completions.create(
            model=model.get_inference_name(), messages=messages, logprobs=True
        )
        choice = Choice.model_validate(completion.choices[0].model_dump())
        trajectory = art.Trajectory(messages_and_choices=[*messages, choice], reward=0.0)
        trajectory.reward = float(len(choice.message.content or "") % 5)
        spans.append((started, time.monotonic()))
        return trajectory

    group_rollout = make_group_rollout_fn(one_rollout, n=GROUP_SIZE)

    async def rollout_fn(model: Any, scenario: dict[str, Any], config: Any) -> Any:
        group = await group_rollout(model, scenario, config)
        group_id = uuid.uuid4().hex
        group.metadata["id"] = group_id
        returned[group_id] = time.monotonic()
        return group

    await pipeline_trainer(model, backend, rollout_fn, steps, workers).train(handle_signals=False)
    first = min(start for start, _ in spans)
    last = max(end for _, end in spans)
    waits = [trained_at[g] - returned[g] for g in returned if g in trained_at]
    return Result("PipelineTrainer", 1, workers * GROUP_SIZE, len(spans), last - first, waits)


def pipeline_trainer(model: Any, backend: Any, rollout_fn: Any, steps: int, workers: int) -> Any:
    """ART's PipelineTrainer over the scenarios, round after round, for `steps` steps."""
    from art.pipeline_trainer import PipelineTrainer
    from art.pipeline_tuner import PipelineRuntimeConfig

    def scenarios_forever() -> Any:
        while True:
            yield from SCENARIOS

    class Pipeline(PipelineTrainer):
        def _validate_backend_support(self) -> None:
            # ART imports LocalBackend (and with it torch, not installed here) only to ask
            # whether the backend is one; ours is not, and it has no eval to check.
            pass

    return Pipeline(
        model,
        backend,
        rollout_fn,
        scenarios_forever(),
        {},
        pipeline=PipelineRuntimeConfig(
            num_rollout_workers=workers, min_batch_size=BATCH_SIZE, max_batch_size=BATCH_SIZE
        ),
        max_steps=steps,
        max_steps_off_policy=MAX_STEPS_OFF_POLICY,
        eval_at_start=False,
        eval_every_n_steps=0,
        log_interval_seconds=3600,
        resume=False,
    )


# --- the run --------------------------------------------------------------------------------


def report(results: list[Result], console: Console) -> bool:
    one = next((r for r in results if r.setup == "workers 1"), None)
    table = Table(title="rollouts per second, one agent with a fixed LLM latency")
    for column in (
        "setup",
        "processes",
        "rollouts at once",
        "rollouts",
        "seconds",
        "rollouts/s",
        "vs 1 worker",
        "scaling efficiency",
        "seal→train mean s",
        "seal→train max s",
        "waiting for the append lock",
    ):
        table.add_column(column, justify="left" if column == "setup" else "right")
    for r in results:
        ratio = r.rate / one.rate if one and one.rate else None
        efficiency = (
            f"{ratio / r.processes:.0%}"
            if ratio is not None and r.setup.startswith("workers")
            else ""
        )
        table.add_row(
            r.setup,
            str(r.processes),
            str(r.processes * r.concurrency if r.setup.startswith("workers") else r.concurrency),
            str(r.rollouts),
            f"{r.seconds:.1f}",
            f"{r.rate:.1f}",
            f"{ratio:.2f}x" if ratio is not None else "",
            efficiency,
            f"{statistics.mean(r.seal_to_train):.3f}" if r.seal_to_train else "",
            f"{max(r.seal_to_train):.3f}" if r.seal_to_train else "",
            f"{r.lock_waits:.2f}" if r.lock_waits is not None else "",
        )
    console.print(table)
    for r in results:
        if r.note:
            console.print(f"{r.setup}: {r.note}", highlight=False)
    eight = next((r for r in results if r.setup == "workers 8"), None)
    if one is None or eight is None:
        console.print("target not checked: needs the 1 and 8 worker setups")
        return True
    achieved = eight.rate / one.rate if one.rate else 0.0
    passed = achieved >= TARGET_SPEEDUP
    verdict = "[green]PASS[/green]" if passed else "[red]MISS[/red]"
    console.print(
        f"{verdict} 8 worker processes: {eight.rate:.1f} rollouts/s = {achieved:.2f}x one "
        f"worker's {one.rate:.1f} (target >= {TARGET_SPEEDUP:.0f}x)"
    )
    return passed


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])  # type: ignore[union-attr]
    parser.add_argument(
        "--postgres-url",
        default=os.environ.get("ARTSTORE_BENCH_POSTGRES_URL", DEFAULT_POSTGRES_URL),
        help="a PostgreSQL server where the user may create databases",
    )
    parser.add_argument("--latency", type=float, default=None, help="LLM latency, s (default 1)")
    parser.add_argument(
        "--workers", type=int, nargs="+", default=None, help="worker processes (default 1 2 4 8)"
    )
    parser.add_argument("--quick", action="store_true", help="a smoke run: 1 and 2 workers")
    return parser.parse_args(argv)


async def run(args: argparse.Namespace) -> int:
    from artstore.art_versions import has_exchanges
    from artstore.testing.inference_server import LocalInferenceServer

    console = Console(width=200)
    latency = args.latency if args.latency is not None else (0.2 if args.quick else 1.0)
    counts = args.workers or ([1, 2] if args.quick else [1, 2, 4, 8])
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(PRELOAD)
    databases = Databases(args.postgres_url)
    results: list[Result] = []
    console.print(
        f"LLM latency {latency:g} s; batches of {BATCH_SIZE} groups of {GROUP_SIZE} rollouts; "
        f"workers run {CONCURRENCY} rollouts at once; max_steps_off_policy "
        f"{MAX_STEPS_OFF_POLICY}",
        highlight=False,
    )
    try:
        with tempfile.TemporaryDirectory() as folder:
            workdir = Path(folder)
            # A server thread per request: it never limits the rollouts in flight.
            async with LocalInferenceServer(latency_s=latency) as server:
                for count in counts:
                    epochs = 2 if args.quick else count + 1
                    result = await measure_workers(
                        count, context, databases, server, workdir, epochs
                    )
                    results.append(result)
                    console.print(f"{result.setup}: {result.rate:.1f} rollouts/s", highlight=False)
                epochs = 1 if args.quick else 3
                results.append(await measure_in_process(databases, server, workdir, epochs))
                if has_exchanges():
                    steps = 1 if args.quick else 4
                    # As many rollouts at once as the most workers run: groups of 4.
                    groups_at_once = max(1, max(counts) * CONCURRENCY // GROUP_SIZE)
                    pipeline = await measure_pipeline(server, workdir, steps, groups_at_once)
                    results.append(pipeline)
                else:
                    console.print("PipelineTrainer: needs ART >= 0.5.20 (not installed here)")
    finally:
        databases.drop_all()
    report(results, console)
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(run(parse_args())))
