"""A separate process appending events, for the multi-process tests.

    python tests/support/append_worker.py URL STREAM COUNT [--hold SECONDS]
        [--unprojected | --rollouts]

With --hold, the first transaction stays open for SECONDS after inserting its event
(a slow writer), so that later writers queue behind it. With --unprojected, the events
are of a type no projection reads, appended with expected versions to a stream per
task (`STREAM-TASK`): on PostgreSQL the store writes such batches as one INSERT that
commits by itself. With --rollouts, each task records rollouts of run STREAM as the
capture layer does, one event per append (`rollout.started`, two `llm.call`s with their
message blobs, `rollout.finished`; COUNT events in all): on PostgreSQL their projections
need no order and such transactions share the append lock. It prints how many
transactions were written each way at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import time
import uuid
from datetime import UTC, datetime

from langchain_core.messages import AIMessage, HumanMessage

from artstore.documents.messages import dump_message
from artstore.events import (
    Event,
    LLMCall,
    RolloutFinished,
    RolloutStarted,
    RunFinished,
    event_type,
)
from artstore.eventstore import NO_STREAM, blob_hash
from artstore.eventstore.database import connect
from artstore.projections import SideBySide, project, projected_types
from artstore.store import Store
from artstore.urls import resolve_url


@event_type("test.unprojected")
class Unprojected(Event):
    n: int


def rollout_events(run: str, n: int) -> list[tuple[Event, dict[str, str]]]:
    """One rollout's events, each with the blobs its append stores."""
    rollout_id = str(uuid.uuid4())
    started = RolloutStarted(
        rollout_id=rollout_id,
        run=run,
        group_id=f"{run}-g{n // 4}",
        scenario={"n": n},
        scenario_index=n // 4,
        model="agent",
        started_at=datetime.now(UTC),
    )
    events: list[tuple[Event, dict[str, str]]] = [(started, {})]
    history = [dump_message(HumanMessage(f"question {n}"))]
    for index in range(2):
        output = dump_message(AIMessage(f"answer {n}.{index}"))
        blobs = {blob_hash(body): body for body in [*history, output]}
        call = LLMCall(
            call_id=str(uuid.uuid4()),
            index=index,
            input=[blob_hash(body) for body in history],
            output=blob_hash(output),
            prompt_tokens=10,
            completion_tokens=5,
            latency_s=0.01,
            started_at=datetime.now(UTC),
        )
        events.append((call, blobs))
        history.append(output)
    events.append((RolloutFinished(rollout_id=rollout_id, duration_s=0.1), {}))
    return events


async def main(
    url: str, stream: str, count: int, hold: float, unprojected: bool, rollouts: bool
) -> None:
    held = False

    def projector(connection, recorded, blobs) -> None:
        nonlocal held
        project(connection, recorded, blobs)
        if hold and not held:  # inside the write transaction: the lock is held meanwhile
            held = True
            print("holding", flush=True)
            time.sleep(hold)

    types = projected_types()
    database = connect(resolve_url(url))
    store = Store(
        database, projector=projector, projected_types=types, side_by_side=SideBySide(types)
    )
    try:
        # Single-event appends from 16 tasks: exercises group commit across processes.
        per_append = 4 if rollouts else 1  # events per rollout, or per append

        async def appender(task: int) -> None:
            version = NO_STREAM
            for n in range(task, count // per_append, 16):
                if rollouts:
                    rollout = rollout_events(stream, n)
                    rollout_stream = f"rollout-{rollout[0][0].rollout_id}"
                    for event, blobs in rollout:
                        await store.append(rollout_stream, [event], blobs=blobs)
                elif unprojected:
                    appended = [Unprojected(n=n)]
                    version = (await store.append(f"{stream}-{task}", appended, version)).version
                else:
                    await store.append(stream, [RunFinished(run=f"{stream}:{n}")])

        await asyncio.gather(*(appender(task) for task in range(min(16, count // per_append))))
    finally:
        await store.close()
    print(
        f"transactions {store.transactions} side-by-side {store.side_by_side_transactions} "
        f"single-statement {store.single_statement_transactions}",
        flush=True,
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("stream")
    parser.add_argument("count", type=int)
    parser.add_argument("--hold", type=float, default=0.0)
    parser.add_argument("--unprojected", action="store_true")
    parser.add_argument("--rollouts", action="store_true")
    args = parser.parse_args()
    asyncio.run(main(args.url, args.stream, args.count, args.hold, args.unprojected, args.rollouts))
