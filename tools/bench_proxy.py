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
LiteLLM's proxy is not measured here yet.

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
from pathlib import Path
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import httpx

from artstore.testing.inference_server import LocalInferenceServer

ADDED_P50_MS, ADDED_P99_MS = 1.0, 5.0
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


async def latencies(
    http: httpx.AsyncClient, direct: str, proxied: str, key: str, n: int, stream: bool
):
    mine: dict[str, list[float]] = {"direct": [], "proxy": []}
    for _ in range(5):  # warm both paths
        await timed(http, direct, key, stream)
        await timed(http, proxied, key, stream)
    for _ in range(n):
        mine["direct"].append(await timed(http, direct, key, stream))
        mine["proxy"].append(await timed(http, proxied, key, stream))
    return mine


async def throughput(http: httpx.AsyncClient, url: str, key: str, n: int) -> float:
    queue = iter(range(n))

    async def worker() -> None:
        for _ in queue:
            await timed(http, url, key, False)

    began = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))
    return n / (time.perf_counter() - began)


async def main(arguments: argparse.Namespace) -> int:
    verdicts: list[bool] = []
    with tempfile.TemporaryDirectory() as folder, LocalInferenceServer() as upstream:
        url = arguments.url or f"sqlite:///{Path(folder) / 'bench.db'}"
        server, address = start_proxy(upstream.base_url, url)
        try:
            async with httpx.AsyncClient(timeout=60) as http:
                started = await http.post(f"{address}/api/runs/bench/rollouts", json={"model": "m"})
                base = started.json()["base_url"]
                direct = f"{upstream.base_url}/chat/completions"
                proxied = f"{base}/chat/completions"
                for stream in (False, True):
                    found = await latencies(
                        http, direct, proxied, upstream.api_key, arguments.calls, stream
                    )
                    verdicts += report("streamed" if stream else "whole", found)
                rates = {
                    "direct": await throughput(http, direct, upstream.api_key, arguments.calls),
                    "proxy": await throughput(http, proxied, upstream.api_key, arguments.calls),
                }
                print(
                    f"throughput ({CONCURRENCY} at a time): direct {rates['direct']:,.0f} calls/s, "
                    f"through artstore serve {rates['proxy']:,.0f} calls/s"
                )
                await http.post(
                    f"{address}/api/rollouts/{started.json()['rollout_id']}/finish", json={}
                )
        finally:
            server.terminate()
            server.wait(timeout=60)
    return 0 if all(verdicts) else 1


def report(kind: str, found: dict[str, list[Any]]) -> list[bool]:
    ms = {name: [v * 1000 for v in values] for name, values in found.items()}
    p50 = {name: statistics.median(values) for name, values in ms.items()}
    p99 = {name: percentile(values, 0.99) for name, values in ms.items()}
    added50, added99 = p50["proxy"] - p50["direct"], p99["proxy"] - p99["direct"]
    print(
        f"{kind}: direct p50 {p50['direct']:.2f} ms p99 {p99['direct']:.2f} ms; "
        f"proxied p50 {p50['proxy']:.2f} ms p99 {p99['proxy']:.2f} ms"
    )
    ok50, ok99 = added50 <= ADDED_P50_MS, added99 <= ADDED_P99_MS
    for ok, name, added, target in (
        (ok50, "p50", added50, ADDED_P50_MS),
        (ok99, "p99", added99, ADDED_P99_MS),
    ):
        verdict = "PASS" if ok else "MISS"
        print(f"{verdict} {kind}: added {name} {added:.2f} ms (target <= {target} ms)")
    return [ok50, ok99]


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200, help="calls per measurement")
    parser.add_argument("--url", help="the store (default: a fresh SQLite file)")
    sys.exit(asyncio.run(main(parser.parse_args())))
