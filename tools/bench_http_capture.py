"""What recording an OpenAI client's calls costs: artstore's capture and ART's, side by side.

The workload: an agent that calls `AsyncOpenAI.chat.completions.create` over HTTP against
the local inference server (no network, no GPU), 6 turns per rollout (each answer 200
tokens with logprobs, the conversation growing each turn), 24 rollouts, one call at a
time so that each call's wall time is its own. Every call is timed from the agent's side
(the `create` call, body parsed), under each peer:

- `no capture`: the agent outside any capture: the baseline;
- `ART's art.trajectory`: ART's own capture into `Trajectory.exchanges` (ART >= 0.5.20
  only: it does not exist on 0.5.18);
- `artstore rollout (sqlite)`: the agent inside `store.rollout(...)` on a SQLite store:
  the request and response recorded from httpx, the call's event queued;
- `artstore inside art.trajectory (sqlite)`: both at once, as an ART 0.5.23 agent run in
  a rollout is recorded (artstore also finds ART's exchange for each call).

Measured: the median and p99 of the time per call, and the median time added over the
baseline; the peers are interleaved round by round so that a busy machine hits each the
same (on a machine shared with other work the figures still move by milliseconds: run
it on an idle one). It also checks that artstore's projected trajectories are what the
agent got.

Run it from the repository root: `python tools/bench_http_capture.py`.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import openai
from rich.console import Console
from rich.table import Table

import artstore
from artstore.art_versions import has_exchanges
from artstore.testing.inference_server import LocalInferenceServer, ScriptedReply

ROLLOUTS = 24
TURNS = 6
ROUNDS = 3


def policy(request: dict[str, Any], sample_index: int) -> ScriptedReply:
    """200 words per answer; a tool call on every turn but the last."""
    turn = sum(1 for m in request["messages"] if m["role"] == "assistant")
    words = " ".join(f"w{turn}x{i}" for i in range(200))
    if turn < TURNS - 1:
        return ScriptedReply(content=words, tool_calls=[("search", {"query": f"q{turn}"})])
    return ScriptedReply(content=words)


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "search",
            "description": "Search the knowledge base.",
            "parameters": {"type": "object", "properties": {"query": {"type": "string"}}},
        },
    }
]


async def agent(client: openai.AsyncOpenAI, times: list[float]) -> list[Any]:
    messages: list[Any] = [
        {"role": "system", "content": "You are a researcher."},
        {"role": "user", "content": "Find it."},
    ]
    choices = []
    for _ in range(TURNS):
        started = time.perf_counter()
        completion = await client.chat.completions.create(
            model="agent", messages=messages, tools=TOOLS, logprobs=True
        )
        times.append(time.perf_counter() - started)
        choice = completion.choices[0]
        choices.append(choice)
        message = choice.message
        messages.append(
            {
                "role": "assistant",
                "content": message.content or "",
                **(
                    {"tool_calls": [c.model_dump(mode="json") for c in message.tool_calls]}
                    if message.tool_calls
                    else {}
                ),
            }
        )
        for call in message.tool_calls or []:
            messages.append({"role": "tool", "tool_call_id": call.id, "content": "found"})
    return choices


Peer = Callable[[openai.AsyncOpenAI, list[float]], Awaitable[None]]


async def main() -> int:
    console = Console()
    failures = 0
    with tempfile.TemporaryDirectory() as directory:
        store = await artstore.open_store(f"sqlite:///{Path(directory) / 'bench.db'}")
        checked: list[tuple[str, list[Any]]] = []

        async def bare(client: openai.AsyncOpenAI, times: list[float]) -> None:
            await agent(client, times)

        async def arts(client: openai.AsyncOpenAI, times: list[float]) -> None:
            import art

            await art.trajectory(agent(client, times))

        async def ours(client: openai.AsyncOpenAI, times: list[float]) -> None:
            async with store.rollout("agent") as rollout:
                choices = await agent(client, times)
            checked.append((rollout.id, choices))

        async def both(client: openai.AsyncOpenAI, times: list[float]) -> None:
            import art

            async with store.rollout("agent"):
                await art.trajectory(agent(client, times))

        peers: dict[str, Peer] = {"no capture": bare}
        if has_exchanges():
            peers["ART's art.trajectory"] = arts
        peers["artstore rollout (sqlite)"] = ours
        if has_exchanges():
            peers["artstore inside art.trajectory (sqlite)"] = both
        times: dict[str, list[float]] = {name: [] for name in peers}
        async with LocalInferenceServer(policy) as server:
            client = openai.AsyncOpenAI(base_url=server.base_url, api_key=server.api_key)
            for peer in peers.values():  # warm-up: imports, connections, the store
                await peer(client, [])
            checked.clear()
            for _ in range(ROUNDS):
                for _ in range(ROLLOUTS // ROUNDS):
                    for name, peer in peers.items():
                        await peer(client, times[name])

        projected = await store.trajectories([rollout_id for rollout_id, _ in checked])
        equal = all(
            [i for i in projected[rollout_id].messages_and_choices if not isinstance(i, dict)]
            == choices
            for rollout_id, choices in checked
        )
        await store.close()

    baseline = statistics.median(times["no capture"])
    table = Table(title=f"{ROLLOUTS} rollouts x {TURNS} calls, one call at a time")
    for column in ("peer", "calls", "median / call", "p99 / call", "added (median)"):
        table.add_column(column, justify="left" if column == "peer" else "right")
    added: dict[str, float] = {}
    for name, values in times.items():
        median = statistics.median(values)
        p99 = statistics.quantiles(values, n=100)[98]
        added[name] = median - baseline
        table.add_row(
            name,
            str(len(values)),
            f"{median * 1000:.3f} ms",
            f"{p99 * 1000:.3f} ms",
            f"{added[name] * 1000:+.3f} ms",
        )
    console.print(table)

    def verdict(ok: bool, text: str) -> None:
        nonlocal failures
        failures += not ok
        print(f"{'PASS' if ok else 'MISS'}  {text}")

    verdict(added["artstore rollout (sqlite)"] < 0.002, "artstore adds < 2 ms per call (median)")
    if has_exchanges():
        inside = added["artstore inside art.trajectory (sqlite)"] - added["ART's art.trajectory"]
        verdict(inside < 0.002, "inside art.trajectory, artstore adds < 2 ms per call to ART's")
    verdict(equal, "every projected Choice is the one the agent got")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
