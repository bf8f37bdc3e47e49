"""A separate process that appends one event to a stream when told to, for the race tests.

    python tests/support/stream_race_worker.py URL STREAM NAME [--expected N] [--pause]

Prints `ready` once its store is open and appends after a line on stdin. With --pause,
the append's condition (which runs after the stream's head was read, before the events'
INSERT) prints `checked` and waits for another line each time it runs, so that a test
can let other processes commit in between. Prints `ok VERSION` or `error TYPE MESSAGE`.
"""

from __future__ import annotations

import argparse
import asyncio
import sys

from artstore.events import RunFinished
from artstore.eventstore.database import connect
from artstore.projections import project
from artstore.store import Store
from artstore.urls import resolve_url


def wait_for_a_line() -> None:
    if not sys.stdin.readline():
        raise SystemExit("stdin closed")


def paused(connection) -> None:
    print("checked", flush=True)
    wait_for_a_line()


async def main(url: str, stream: str, name: str, expected: int | None, pause: bool) -> None:
    store = Store(connect(resolve_url(url)), projector=project)
    try:
        print("ready", flush=True)
        wait_for_a_line()
        try:
            result = await store.append(
                stream,
                [RunFinished(run=name)],
                expected,
                condition=paused if pause else None,
            )
        except Exception as exc:
            print(f"error {type(exc).__name__} {str(exc).splitlines()[0]}", flush=True)
        else:
            print(f"ok {result.version}", flush=True)
    finally:
        await store.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("stream")
    parser.add_argument("name")
    parser.add_argument("--expected", type=int, default=None)
    parser.add_argument("--pause", action="store_true")
    args = parser.parse_args()
    asyncio.run(main(args.url, args.stream, args.name, args.expected, args.pause))
