"""What a crash inside a rollout costs: resuming from its recorded calls against running it again.

A tool-using agent of `--calls` OpenAI-client calls runs against the LocalInferenceServer
(each answer takes `--latency` seconds, standing for generation), is stopped at a random
call (as a crash would stop it: the calls answered before are recorded), and is finished
two ways:

- `artstore`: a rollout that `resumes` the stopped one (`store.rollout(..., resumes=id)`):
  the answered calls are served back from the store;
- `rerun`: the rollout run again from its first call (what every other trainer does).

For each, over `--crashes` crashes: the completion tokens generated again per crash (those
of calls the stopped attempt had already been answered; 0 expected for artstore), the
requests the server received after the crash, and the wall time to finish the rollout.

    python tools/bench_resume.py                    # SQLite in a temporary directory
    python tools/bench_resume.py --calls 30 --crashes 10 --latency 0.2
    python tools/bench_resume.py --url postgresql://postgres@127.0.0.1:5432/bench
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "support"))

import replay_agent
from replay_agent import Stopped, agent, policy

import artstore
from artstore.testing.inference_server import LocalInferenceServer


async def completion_tokens(store: Any, rollout_id: str, *, fresh_only: bool) -> int:
    events = [e.decode() for e in await store.read_stream(f"rollout-{rollout_id}")]
    return sum(
        e.completion_tokens or 0
        for e in events
        if e.type == "llm.call" and not (fresh_only and e.replayed_from is not None)
    )


async def one_crash(store: Any, server: LocalInferenceServer, calls: int, rng: random.Random):
    """(tokens generated again, requests after the crash, seconds to finish) per way."""
    stop_at = rng.randrange(1, calls)
    with_model = artstore_model(server)
    try:
        async with store.rollout(with_model, scenario="bench") as stopped:
            await agent(server, stream=False, stop_after=stop_at)
    except Stopped:
        pass
    answered = await completion_tokens(store, stopped.id, fresh_only=False)
    results = {}
    for way in ("artstore", "rerun"):
        before, clock = len(server.requests), time.perf_counter()
        resumes = stopped.id if way == "artstore" else None
        async with store.rollout(with_model, scenario="bench", resumes=resumes) as finished:
            finished.result = await agent(server, stream=False)
        seconds = time.perf_counter() - clock
        fresh = await completion_tokens(store, finished.id, fresh_only=True)
        total = await completion_tokens(store, finished.id, fresh_only=False)
        again = fresh - (total - answered)  # fresh tokens of calls answered before the crash
        results[way] = (again, len(server.requests) - before, seconds, stop_at)
    return results


def artstore_model(server: LocalInferenceServer) -> Any:
    import art

    return art.Model(
        name="agent",
        project="bench",
        inference_base_url=server.base_url,
        inference_api_key=server.api_key,
        inference_model_name="test-model",
    )


async def main(arguments: argparse.Namespace) -> None:
    rng = random.Random(arguments.seed)
    with tempfile.TemporaryDirectory() as directory:
        url = arguments.url or f"sqlite:///{directory}/bench.db"
        replay_agent.CALLS = arguments.calls  # the agent and its policy read it at each call
        server = LocalInferenceServer(policy, latency_s=arguments.latency)
        async with server, await artstore.open_store(url) as store:
            rows = [
                await one_crash(store, server, arguments.calls, rng)
                for _ in range(arguments.crashes)
            ]
    print(
        f"{arguments.crashes} crashes of a {arguments.calls}-call agent "
        f"({arguments.latency:.2f} s per answer), stopped at a random call"
    )
    print(f"{'way':10} {'tokens again/crash':>20} {'requests/crash':>16} {'s to finish':>12}")
    for way in ("artstore", "rerun"):
        again = statistics.mean(r[way][0] for r in rows)
        sent = statistics.mean(r[way][1] for r in rows)
        seconds = statistics.mean(r[way][2] for r in rows)
        print(f"{way:10} {again:>20.1f} {sent:>16.1f} {seconds:>12.2f}")
    zero = all(r["artstore"][0] == 0 for r in rows)
    print(f"{'PASS' if zero else 'MISS'}: artstore regenerates 0 tokens of answered calls")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="a database URL (default: SQLite in a temporary directory)")
    parser.add_argument("--calls", type=int, default=30)
    parser.add_argument("--crashes", type=int, default=10)
    parser.add_argument("--latency", type=float, default=0.05, help="seconds per answer")
    parser.add_argument("--seed", type=int, default=0)
    asyncio.run(main(parser.parse_args()))
