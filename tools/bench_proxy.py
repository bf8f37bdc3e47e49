"""What `artstore serve` adds to an agent's call: latency and throughput next to a direct call.

The upstream is the local inference server (no network, no GPU), in this process. The
proxy is `artstore serve` in its own process, recording into a store (a fresh SQLite file
by default; `--url` for PostgreSQL). The agent is an `httpx.AsyncClient` posting a chat
completion of a short conversation, streamed and not; direct and proxied calls are
interleaved one by one, so that a busy machine hits both the same.

Measured: the median (p50) and p99 time per call, direct and through the proxy, and the
difference (the latency the proxy adds, recording included: a call is answered once its
record is committed); then calls per second with 16 calls at a time, direct and proxied.
Targets, each a PASS or MISS line: added p50 <= 1 ms and added p99 <= 5 ms on loopback.

The peer is LiteLLM's proxy (`tools/litellm_peer.py`: what a user puts in front of vLLM
today) with a logging callback writing each call's request and response to a JSONL file,
interleaved with the two others: its added latency, its calls/s, and the target that
artstore serve's calls/s be at least twice LiteLLM's; a last line checks that its callback
logged every call made through it. When LiteLLM's environment cannot be built, one line
says so and the rest is measured (`--no-litellm` leaves it out).

Run it from the repository root: `python tools/bench_proxy.py [--calls 200] [--url URL]`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import httpx
import litellm_peer  # tools/litellm_peer.py, beside this file

from artstore.testing.inference_server import LocalInferenceServer

ADDED_P50_MS, ADDED_P99_MS = 1.0, 5.0
THROUGHPUT_RATIO = 2.0  # artstore serve's calls/s against LiteLLM's proxy's
Targets = dict[str, tuple[str, str]]  # name: (URL, the key to call it with)
LABELS = {"direct": "direct", "artstore": "artstore serve", "litellm": "LiteLLM's proxy"}
CONCURRENCY = 16
MESSAGES = [
    {"role": "system", "content": "You are a weather agent."},
    {"role": "user", "content": "What is the weather in Oslo today?"},
]


def start_proxy(upstream: str, url: str) -> tuple[subprocess.Popen, str]:
    command = [sys.executable, "-c", "from artstore.cli import main; main()"]
    server = subprocess.Popen(
        [*command, "serve", "--upstream", upstream, "--port", "0", "--url", url],
        stdout=subprocess.PIPE,
        text=True,
    )
    line = server.stdout.readline() if server.stdout else ""
    if not line.startswith("artstore serve: "):
        server.kill()
        raise SystemExit(f"artstore serve did not start: {line!r}")
    return server, line.split()[2]


async def timed(client: httpx.AsyncClient, url: str, key: str, stream: bool) -> float:
    body = {"model": "test-model", "messages": MESSAGES, "stream": stream}
    headers = {"Authorization": f"Bearer {key}"}
    began = time.perf_counter()
    if stream:
        async with client.stream("POST", url, json=body, headers=headers) as response:
            async for _ in response.aiter_bytes():
                pass
    else:
        response = await client.post(url, json=body, headers=headers)
        response.json()
    response.raise_for_status()
    return time.perf_counter() - began


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def latencies(http: httpx.AsyncClient, urls: Targets, n: int, stream: bool):
    """Time per call of each of `urls`, one call to each in turn (warmed first)."""
    mine: dict[str, list[float]] = {name: [] for name in urls}
    for _ in range(5):
        for url, key in urls.values():
            await timed(http, url, key, stream)
    for _ in range(n):
        for name, (url, key) in urls.items():
            mine[name].append(await timed(http, url, key, stream))
    return mine


async def throughput(http: httpx.AsyncClient, url: str, key: str, n: int) -> float:
    queue = iter(range(n))

    async def worker() -> None:
        for _ in queue:
            await timed(http, url, key, False)

    began = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))
    return n / (time.perf_counter() - began)


def start_litellm(stack: ExitStack, upstream: LocalInferenceServer, folder: Path):
    """LiteLLM's proxy, or None with one line saying why it is not measured."""
    try:
        python = litellm_peer.litellm_python()
        return stack.enter_context(
            litellm_peer.LiteLLMProxy(python, upstream.base_url, upstream.api_key, folder)
        )
    except (OSError, RuntimeError, subprocess.CalledProcessError) as exc:
        print(f"LiteLLM's proxy: not measured ({type(exc).__name__}: {exc})")
        return None


async def main(arguments: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory() as folder, ExitStack() as stack:
        upstream = stack.enter_context(LocalInferenceServer())
        url = arguments.url or f"sqlite:///{Path(folder) / 'bench.db'}"
        server, address = start_proxy(upstream.base_url, url)
        stack.callback(server.wait, timeout=60)
        stack.callback(server.terminate)
        litellm = None if arguments.no_litellm else start_litellm(stack, upstream, Path(folder))
        async with httpx.AsyncClient(timeout=60) as http:
            started = await http.post(f"{address}/api/runs/bench/rollouts", json={"model": "m"})
            urls = {
                "direct": (f"{upstream.base_url}/chat/completions", upstream.api_key),
                "artstore": (f"{started.json()['base_url']}/chat/completions", upstream.api_key),
            }
            if litellm is not None:
                urls["litellm"] = (f"{litellm.base_url}/chat/completions", litellm.master_key)
            verdicts = await measure(http, urls, arguments.calls)
            await http.post(
                f"{address}/api/rollouts/{started.json()['rollout_id']}/finish", json={}
            )
        if litellm is not None:
            made = 2 * (5 + arguments.calls) + arguments.calls
            verdicts.append(callback_fired(litellm, made))
    return 0 if all(verdicts) else 1


async def measure(http: httpx.AsyncClient, urls: Targets, n: int) -> list[bool]:
    verdicts: list[bool] = []
    for stream in (False, True):
        found = await latencies(http, urls, n, stream)
        verdicts += report("streamed" if stream else "whole", found)
    rates = {name: await throughput(http, url, key, n) for name, (url, key) in urls.items()}
    shown = ", ".join(f"{LABELS[name]} {rate:,.0f}" for name, rate in rates.items())
    print(f"throughput ({CONCURRENCY} at a time), calls/s: {shown}")
    if "litellm" in rates:
        ratio = rates["artstore"] / rates["litellm"]
        ok = ratio >= THROUGHPUT_RATIO
        verdict = "PASS" if ok else "MISS"
        print(
            f"{verdict} throughput: artstore {ratio:.2f}x LiteLLM's (target >= {THROUGHPUT_RATIO}x)"
        )
        verdicts.append(ok)
    return verdicts


def callback_fired(litellm: litellm_peer.LiteLLMProxy, made: int) -> bool:
    """LiteLLM logs after answering: wait a little for its callback to catch up."""
    deadline = time.monotonic() + 30
    while litellm.logged() < made and time.monotonic() < deadline:
        time.sleep(0.2)
    logged = litellm.logged()
    print(
        f"{'PASS' if logged == made else 'MISS'} LiteLLM's callback logged {logged} of {made} calls"
    )
    return logged == made


def report(kind: str, found: dict[str, list[Any]]) -> list[bool]:
    ms = {name: [v * 1000 for v in values] for name, values in found.items()}
    p50 = {name: statistics.median(values) for name, values in ms.items()}
    p99 = {name: percentile(values, 0.99) for name, values in ms.items()}
    shown = "; ".join(f"{LABELS[n]} p50 {p50[n]:.2f} ms p99 {p99[n]:.2f} ms" for n in ms)
    print(f"{kind}: {shown}")
    for name in ms.keys() - {"direct", "artstore"}:
        added50, added99 = p50[name] - p50["direct"], p99[name] - p99["direct"]
        print(f"     {kind}: {LABELS[name]} adds p50 {added50:.2f} ms, p99 {added99:.2f} ms")
    added50, added99 = p50["artstore"] - p50["direct"], p99["artstore"] - p99["direct"]
    ok50, ok99 = added50 <= ADDED_P50_MS, added99 <= ADDED_P99_MS
    for ok, name, added, target in (
        (ok50, "p50", added50, ADDED_P50_MS),
        (ok99, "p99", added99, ADDED_P99_MS),
    ):
        verdict = "PASS" if ok else "MISS"
        print(f"{verdict} {kind}: artstore adds {name} {added:.2f} ms (target <= {target} ms)")
    return [ok50, ok99]


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200, help="calls per measurement")
    parser.add_argument("--url", help="the store (default: a fresh SQLite file)")
    parser.add_argument("--no-litellm", action="store_true", help="leave LiteLLM's proxy out")
    sys.exit(asyncio.run(main(parser.parse_args())))
