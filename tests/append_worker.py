"""A separate process appending events, for the multi-process tests.

    python tests/append_worker.py URL STREAM COUNT [--hold SECONDS]

With --hold, the first transaction stays open for SECONDS after inserting its event
(a slow writer), so that later writers queue behind it.
"""

from __future__ import annotations

import argparse
import asyncio
import time

from artstore.events import RunFinished
from artstore.eventstore.database import connect
from artstore.projections import project
from artstore.store import Store
from artstore.urls import resolve_url


async def main(url: str, stream: str, count: int, hold: float) -> None:
    held = False

    def projector(connection, recorded) -> None:
        nonlocal held
        project(connection, recorded)
        if hold and not held:  # inside the write transaction: the lock is held meanwhile
            held = True
            print("holding", flush=True)
            time.sleep(hold)

    store = Store(connect(resolve_url(url)), projector=projector)
    try:
        # Single-event appends from 16 tasks: exercises group commit across processes.
        async def appender(task: int) -> None:
            for n in range(task, count, 16):
                await store.append(stream, [RunFinished(run=f"{stream}:{n}")])

        await asyncio.gather(*(appender(task) for task in range(min(16, count))))
    finally:
        await store.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("stream")
    parser.add_argument("count", type=int)
    parser.add_argument("--hold", type=float, default=0.0)
    args = parser.parse_args()
    asyncio.run(main(args.url, args.stream, args.count, args.hold))
