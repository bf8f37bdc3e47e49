"""Projections are a deterministic function of the events: same events, same bytes.

A run is appended in a random interleaving of its streams, in transactions of random
sizes (the writer's group commit takes what was queued together), with float latencies
and rewards whose sums depend on the order they are added in. Every projection table is
then dumped row by row in primary-key order, each value as the text of its exact value
(floats through repr, surrogate ids included), and compared with what a rebuild from the
log writes, and with what projecting the same log in pages of other sizes writes. Both
databases.
"""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from typing import Any

from langchain_core.messages import AIMessage, HumanMessage
from sqlalchemy import delete, select
from sqlalchemy.engine import Connection

from artstore.capture import messages as lc
from artstore.events import (
    GroupSealed,
    LLMCall,
    RewardsRecorded,
    RolloutFinished,
    RolloutStarted,
    RunStarted,
    TrainStepCompleted,
    TrainStepStarted,
)
from artstore.eventstore import blob_hash
from artstore.projections import rebuild, trained
from artstore.schema import tables as t

RUN = "mixed"
MODEL = "tests/mixed"
BASE = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


async def dump(store: Any) -> dict[str, list[tuple[str, ...]]]:
    """Every row of every projection table, in primary-key order, each value as repr."""
    found = {}
    async with store.database.read() as connection:
        for table in t.PROJECTION_TABLES:
            query = select(table).order_by(*table.primary_key.columns)
            rows = await connection.execute(query)
            found[table.name] = [tuple(map(repr, row)) for row in rows]
    return found


def _blob(message: Any, blobs: dict[str, str]) -> str:
    body = lc.dump_message(message)
    digest = blob_hash(body)
    blobs[digest] = body
    return digest


def _rollout_appends(
    rng: random.Random, rollout_id: str, group_id: str, index: int
) -> list[tuple[str, list, dict[str, str]]]:
    """The appends of one rollout, one per event as the recorder makes them: its start,
    1 to 5 calls with latencies whose sum depends on the order of the additions (one
    call recorded again, superseding the first), and its end."""
    stream = f"rollout-{rollout_id}"
    started = BASE + timedelta(seconds=index)
    appends: list[tuple[str, list, dict[str, str]]] = [
        (
            stream,
            [
                RolloutStarted(
                    rollout_id=rollout_id,
                    run=RUN,
                    group_id=group_id,
                    scenario={"question": f"q{index}"},
                    scenario_index=index,
                    model="mixed",
                    role="policy",
                    policy_step=0,
                    started_at=started,
                )
            ],
            {},
        )
    ]
    question = HumanMessage(f"question {index}")
    call_ids = [f"{rollout_id}-c{n}" for n in range(rng.randint(1, 5))]
    for n, call_id in enumerate(call_ids):
        blobs: dict[str, str] = {}
        output = AIMessage(f"answer {n} of {rollout_id}")
        supersedes = call_ids[0] if n == 1 and rng.random() < 0.5 else None
        call = LLMCall(
            call_id=call_id,
            index=0 if supersedes else n,
            input=[_blob(question, blobs)],
            output=_blob(output, blobs),
            model="mixed",
            prompt_tokens=rng.randint(1, 500),
            completion_tokens=rng.randint(1, 500),
            latency_s=rng.random() * rng.choice((0.001, 1.0, 1000.0)),
            finish_reason="stop",
            started_at=started + timedelta(seconds=n),
            supersedes=supersedes,
        )
        appends.append((stream, [call], blobs))
    appends.append(
        (stream, [RolloutFinished(rollout_id=rollout_id, result={"n": index}, duration_s=1.5)], {})
    )
    return appends


def _run(rng: random.Random, groups: int = 6, size: int = 4):
    """The run's appends: per stream in order, with what each must wait for."""
    streams: dict[str, list[tuple[str, list, dict[str, str]]]] = {}
    group_ids = [f"g{g}" for g in range(groups)]
    members = {g: [f"{g}r{n}" for n in range(size)] for g in group_ids}
    for g, rollout_ids in members.items():
        for n, rollout_id in enumerate(rollout_ids):
            streams[rollout_id] = _rollout_appends(rng, rollout_id, g, n)

    def rewards(g: str, scorer: str, rescored: bool = False) -> RewardsRecorded:
        return RewardsRecorded(
            group_id=g,
            scorer=scorer,
            rewards={r: rng.random() * rng.choice((0.1, 1.0, 3.0)) for r in members[g]},
            rescored=rescored,
        )

    for g in group_ids:
        sealed = GroupSealed(group_id=g, run=RUN, epoch=0, batch=0, rollout_ids=members[g])
        streams[f"group-{g}"] = [
            (f"group-{g}", [rewards(g, "reward"), sealed], {}),
            (f"group-{g}", [rewards(g, "judge", rescored=True)], {}),
            (f"group-{g}", [rewards(g, "reward", rescored=True)], {}),
        ]
    steps = []
    for step, chunk in enumerate((group_ids[:3], group_ids[3:])):
        started = TrainStepStarted(
            run=RUN, model=MODEL, step=step, group_ids=chunk, scorer="reward", trainer="t"
        )
        completed = TrainStepCompleted(
            run=RUN, model=MODEL, step=step + 1, group_ids=chunk, scorer="reward"
        )
        steps += [(f"train-{RUN}", [started], {}), (f"train-{RUN}", [completed], {})]
    streams[f"train-{RUN}"] = steps
    return streams, members


def _interleaved(rng: random.Random, streams: dict, members: dict) -> list:
    """The appends in a random order that keeps each stream's order; a group's seal
    comes after its rollouts ended, a train step after its groups' first rewards."""
    pending = {stream: list(appends) for stream, appends in streams.items()}
    done: dict[str, int] = {stream: 0 for stream in streams}

    def ready(stream: str) -> bool:
        if stream.startswith("group-") and done[stream] == 0:
            group = stream.removeprefix("group-")
            return all(not pending[r] for r in members[group])
        if stream.startswith("train-"):
            return all(done[f"group-{g}"] >= 1 for g in members)
        return True

    order = []
    while any(pending.values()):
        stream = rng.choice([s for s, appends in pending.items() if appends and ready(s)])
        order.append(pending[stream].pop(0))
        done[stream] += 1
    return order


async def record_interleaved(store: Any, seed: int) -> None:
    """Append the run in a random interleaving, in transactions of random sizes."""
    rng = random.Random(seed)
    streams, members = _run(rng)
    await store.append(
        f"run-{RUN}",
        [
            RunStarted(
                run=RUN,
                project="tests",
                model="mixed",
                base_model="base",
                config={"group_size": 4},
                scenarios=[{"question": f"q{n}"} for n in range(4)],
                scorer="reward",
                trainer="t",
            )
        ],
    )
    order = _interleaved(rng, streams, members)
    while order:
        taken = order[: rng.randint(1, 25)]
        order = order[len(taken) :]
        futures = [store.append_nowait(s, events, blobs=blobs) for s, events, blobs in taken]
        for future in futures:
            await future


async def project_in_pages(store: Any, page_size: int) -> None:
    """Rebuild the projections from the log, `page_size` events per projected batch."""

    def rebuilt(connection: Connection) -> int:
        store.database.lock_appends(connection)
        return rebuild(connection, page_size=page_size)

    await store.database.run_write(lambda c: c.run_sync(rebuilt))


async def test_a_rebuild_writes_the_live_tables_byte_for_byte(store):
    await record_interleaved(store, seed=24)
    live = await dump(store)
    assert live["train_steps"] and all(len(rows) > 0 for rows in live.values())

    await store.rebuild_projections()

    assert await dump(store) == live


async def test_the_same_events_projected_in_batches_of_any_size_give_the_same_tables(store):
    await record_interleaved(store, seed=10)
    live = await dump(store)

    for page_size in (1, 3, 17, 5000):
        await project_in_pages(store, page_size)
        assert await dump(store) == live, page_size


async def test_what_a_step_trained_does_not_depend_on_the_order_its_rows_are_stored_in(store):
    """The rollouts stored again in the reverse order (the order a query without ORDER BY
    returns them in), and every step summed again: the same bits."""
    await record_interleaved(store, seed=5)
    before = await dump(store)

    def stored_backwards_and_summed_again(connection: Connection) -> None:
        rollouts = connection.execute(select(t.rollouts).order_by(t.rollouts.c.rollout_id))
        backwards = [dict(row) for row in reversed(rollouts.mappings().all())]
        connection.execute(delete(t.rollouts))
        connection.execute(t.rollouts.insert(), backwards)
        steps = connection.execute(select(t.train_steps.c.id)).scalars().all()
        trained.refresh_trained(connection, steps)

    await store.database.run_write(lambda c: c.run_sync(stored_backwards_and_summed_again))

    assert await dump(store) == before
