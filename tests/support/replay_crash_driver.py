"""A storm agent's rollout that SIGKILLs itself after chosen answers, once each, run by the
training loop or by a rollout worker (tests/capture/test_resume_storm.py).

`storm_process(runner, agent, url, workdir, base_url, api_key, kills, calls, log_path)` is
the entry point of a process of its own (forked from a forkserver that imported ART once,
so that the 40 restarts of the long storm cost no imports), run again and again until it
exits 0. RUNNER: `loop` (ART's loop made durable: `durable_rollouts`, `group_recorder`, a
recording CheckOnlyBackend that trains one step) or `worker` (`artstore.workers.run_worker`
on the run the test's trainer registered; PostgreSQL). AGENT: `openai` or `langgraph`
(replay_agent.py), making CALLS calls to the test's inference server, which counts them.

KILLS is a comma-separated list of call numbers, in order (a number may repeat): run i
kills itself (writing WORKDIR/killed-i first) once the answer of call KILLS[i] arrived (a
call served back from the record counts: the agent sees it arrive) and was committed; a
later run resumes the rollout (the loop through `durable_rollouts`, a worker by taking
over the dead worker's slot once its lease expired), and the last writes
WORKDIR/result.json (the rollout id, its answer). Its warnings go to `log_path`.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from replay_agent import storm_agent, storm_reward

import artstore
from artstore.capture.rollout import current_rollout

PROJECT, MODEL_NAME = "replay", "agent"
RUN = f"{PROJECT}/{MODEL_NAME}"  # the run TrainingFramework names after the model
SCENARIO = {"task": "the task"}
# A killed worker's slot is taken over this long after its last heartbeat: short, so that
# on a loaded machine a claim is now and then lost before its rollout starts, which must
# not break the chain of resumes.
LEASE_S = 1.5

OnAnswer = Callable[[int], Awaitable[None]]


def killer(workdir: Path, kills: list[int]) -> OnAnswer:
    """`on_answer` for the agent: SIGKILL this process at its kill, once the calls so far
    are committed (a call still on its way to the database when a process dies is not
    recorded, and goes to the server again)."""
    armed = next((i for i in range(len(kills)) if not (workdir / f"killed-{i}").exists()), None)

    async def on_answer(call: int) -> None:
        if armed is not None and call == kills[armed]:
            await current_rollout().settle()
            (workdir / f"killed-{armed}").write_text("")
            os.kill(os.getpid(), signal.SIGKILL)

    return on_answer


def write_result(workdir: Path, rollout_id: str, answer: str) -> None:
    (workdir / "result.json").write_text(json.dumps({"rollout_id": rollout_id, "answer": answer}))


async def loop(
    store: Any, workdir: Path, server: Any, kind: str, calls: int, on_answer: OnAnswer
) -> None:
    """One train step of one group of one rollout, in ART's loop made durable."""
    import art

    from artstore.art_versions import trainable_model
    from artstore.backends import CheckOnlyBackend

    trainer = CheckOnlyBackend(
        path=workdir / "art", inference_base_url=server.base_url, inference_api_key=server.api_key
    )
    backend = artstore.recording_backend(store, trainer, run=RUN)
    model = trainable_model(name=MODEL_NAME, project=PROJECT, base_model="test-base")
    await model.register(backend)

    async def rollout(model: art.Model, scenario: Any) -> art.Trajectory:
        answer = await storm_agent(kind, server, num_calls=calls, on_answer=on_answer)
        # The calls as recorded, each a Choice with its logprobs (what ART trains on, and
        # what ART's own LangGraph support returns).
        recorder = current_rollout()
        await recorder.settle()
        trajectory = await store.trajectory(recorder.id)
        trajectory.metadata["answer"] = answer
        return trajectory

    durable = artstore.durable_rollouts(store, rollout, run=RUN)
    for step in range(await model.get_step(), 1):
        groups = await art.gather_trajectory_groups(
            [art.TrajectoryGroup([durable(model, SCENARIO)])],
            after_each=artstore.group_recorder(store, run=RUN, model=model, batch=step),
            pbar_desc=None,
        )
        (done,) = groups[0].trajectories
        write_result(workdir, done.metadata["artstore_rollout_id"], done.metadata["answer"])
        await backend.train(model, groups)
    await artstore.finish_run(store, RUN)
    await backend.close()


async def worker(
    store: Any, workdir: Path, server: Any, kind: str, calls: int, on_answer: OnAnswer
) -> None:
    """A rollout worker on the run the test's trainer registered, until the run finished."""
    from artstore.workers import run_worker

    async def agent(scenario: Any, rollout_id: str) -> str:
        answer = await storm_agent(kind, server, num_calls=calls, on_answer=on_answer)
        write_result(workdir, rollout_id, answer)
        return answer

    summary = await run_worker(
        store,
        RUN,
        agent,
        storm_reward,
        concurrency=1,
        lease_s=LEASE_S,
        api_key=server.api_key,
        wait_for_run_s=120,
    )
    print(summary, file=sys.stderr)
    assert summary.run_status == "finished", summary


RUNNERS = {"loop": loop, "worker": worker}


def log_to(path: str) -> None:
    """Output and warnings (a lease lost, a rollout given back) to `path`, which the test
    shows when a check fails."""
    import logging

    log = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")


async def main(
    runner: str, kind: str, url: str, workdir: Path, server: Any, kills: str, calls: int
) -> None:
    on_answer = killer(workdir, [int(n) for n in kills.split(",") if n])
    async with await artstore.open_store(url) as store:
        await RUNNERS[runner](store, workdir, server, kind, calls, on_answer)


def storm_process(
    runner: str,
    kind: str,
    url: str,
    workdir: str,
    base_url: str,
    api_key: str,
    kills: str,
    calls: int,
    log_path: str,
) -> None:
    log_to(log_path)
    server = SimpleNamespace(base_url=base_url, api_key=api_key)
    asyncio.run(main(runner, kind, url, Path(workdir), server, kills, calls))
