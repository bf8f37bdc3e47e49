"""A separate process appending events, for the multi-process tests.

    python tests/append_worker.py URL STREAM COUNT [--hold SECONDS] [--unprojected]

With --hold, the first transaction stays open for SECONDS after inserting its event
(a slow writer), so that later writers queue behind it. With --unprojected, the events
are of a type no projection reads, appended with expected versions to a stream per
task (`STREAM-TASK`): on PostgreSQL the store writes such batches as one INSERT that
commits by itself. It prints how many transactions were written so at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import time

from artstore.events import Event, RunFinished, event_type
from artstore.eventstore import NO_STREAM
from artstore.eventstore.database import connect
from artstore.projections import project, projected_types
from artstore.store import Store
from artstore.urls import resolve_url


@event_type("test.unprojected")
class Unprojected(Event):
    n: int


async def main(url: str, stream: str, count: int, hold: float, unprojected: bool) -> None:
    held = False

    def projector(connection, recorded) -> None:
        nonlocal held
        project(connection, recorded)
        if hold and not held:  # inside the write transaction: the lock is held meanwhile
            held = True
            print("holding", flush=True)
            time.sleep(hold)

    store = Store(connect(resolve_url(url)), projector=projector, projected_types=projected_types())
    try:
        # Single-event appends from 16 tasks: exercises group commit across processes.
        async def appender(task: int) -> None:
            version = NO_STREAM
            for n in range(task, count, 16):
                if unprojected:
                    appended = [Unprojected(n=n)]
                    version = (await store.append(f"{stream}-{task}", appended, version)).version
                else:
                    await store.append(stream, [RunFinished(run=f"{stream}:{n}")])

        await asyncio.gather(*(appender(task) for task in range(min(16, count))))
    finally:
        await store.close()
    if unprojected:
        print(f"single-statement {store.single_statement_transactions}", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("stream")
    parser.add_argument("count", type=int)
    parser.add_argument("--hold", type=float, default=0.0)
    parser.add_argument("--unprojected", action="store_true")
    args = parser.parse_args()
    asyncio.run(main(args.url, args.stream, args.count, args.hold, args.unprojected))
