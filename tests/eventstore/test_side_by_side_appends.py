"""Appends whose projections need no order share the append lock (PostgreSQL).

A rollout's own events (its start, calls and end) write rows of that rollout only; on
PostgreSQL their transactions run side by side with each other, and every other append
(a group's seal, a train step, a run's start) still takes the lock alone. What must hold:
the tables equal a rebuild from the log, readers still see every event once and in order,
and an append that needs the order waits for the side-by-side ones in flight.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import uuid
from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlalchemy import func, select, text
from sqlalchemy.engine import make_url
from training_helpers import projections
from waiting import eventually

import artstore
from artstore.events import (
    GroupSealed,
    RewardsRecorded,
    RolloutStarted,
    RunStarted,
    TrainStepStarted,
)
from artstore.eventstore import NO_STREAM
from artstore.eventstore.database import connect
from artstore.projections import SideBySide, project, projected_types
from artstore.schema import tables as t
from artstore.store import Store
from artstore.urls import resolve_url

WORKER = Path(__file__).parents[1] / "support" / "append_worker.py"
ROLLOUTS = ["--rollouts"]


def started(rollout_id: str, run: str | None, role: str = "policy") -> RolloutStarted:
    return RolloutStarted(
        rollout_id=rollout_id,
        run=run,
        group_id="g",
        model="agent",
        role=role,
        started_at=datetime.now(UTC),
    )


def run_started(run: str) -> RunStarted:
    return RunStarted(
        run=run, project="p", model="m", config={}, scenarios=[], scorer="reward", trainer="t"
    )


async def count(store, table) -> int:
    async with store.database.read() as connection:
        return (await connection.execute(select(func.count()).select_from(table))).scalar()


async def test_rollouts_from_many_processes_project_as_a_rebuild_does(database_url):
    per_process, processes = 800, 4  # events: 200 rollouts of 4 events each
    async with await artstore.open_store(database_url) as store:
        procs = [
            subprocess.Popen(
                [
                    sys.executable,
                    str(WORKER),
                    database_url,
                    f"run-{n}",
                    str(per_process),
                    *ROLLOUTS,
                ],
                stdout=subprocess.PIPE,
                text=True,
            )
            for n in range(processes)
        ]
        expected = processes * per_process
        seen: list[int] = []
        after = 0
        while len(seen) < expected:  # a reader following positions meanwhile
            page = await store.read_all(after=after, limit=500)
            for recorded in page:
                assert recorded.position > after, "positions must strictly increase"
                seen.append(recorded.position)
                after = recorded.position
            if not page:
                assert any(p.poll() is None for p in procs) or len(seen) == expected, (
                    f"writers finished but the reader saw {len(seen)} of {expected}"
                )
                await asyncio.sleep(0.01)
        outputs = []
        for proc in procs:
            out, _ = proc.communicate(timeout=120)
            assert proc.returncode == 0
            outputs.append(dict(zip(*[iter(out.split())] * 2, strict=True)))
        assert [e.position for e in await store.read_all(limit=expected + 1)] == seen
        if store.dialect == "postgresql":
            # The way under test was taken: all but a run's first start went side by side.
            for said in outputs:
                assert int(said["side-by-side"]) >= int(said["transactions"]) - 1, said
        assert await count(store, t.rollouts) == expected // 4
        assert await count(store, t.llm_calls) == expected // 2
        # Each rollout: the question, then each call's answer (trajectory messages).
        assert await count(store, t.trajectory_messages) == 3 * expected // 4
        before = await projections(store)
        await store.rebuild_projections()
        assert await projections(store) == before


# An advisory lock key of these tests' own (each test has a database of its own).
HOLD_KEY = 7021802808247546999


def held_store(url: str, rollout_id: str) -> Store:
    """A store whose projection of `rollout_id`'s start waits inside its transaction until
    the test lets it go (`Hold.release`), so that the appends a test makes meanwhile are
    made while it is in flight, however slow the machine."""

    def projector(connection, recorded, blobs) -> None:
        project(connection, recorded, blobs)
        if any(e.data.get("rollout_id") == rollout_id for e in recorded):
            connection.execute(
                text(f"SELECT pg_advisory_xact_lock({HOLD_KEY}) -- held by the test")
            )

    types = projected_types()
    return Store(
        connect(resolve_url(url)),
        projector=projector,
        projected_types=types,
        side_by_side=SideBySide(types),
    )


class Hold:
    """The lock a `held_store`'s projection waits for, taken by the test until `release`."""

    def __init__(self, url: str) -> None:
        import psycopg

        conninfo = make_url(url).set(drivername="postgresql")
        self.connection = psycopg.connect(
            conninfo.render_as_string(hide_password=False), autocommit=True
        )
        self.connection.execute("SELECT pg_advisory_lock(%s)", (HOLD_KEY,))

    def release(self) -> None:
        if not self.connection.closed:
            self.connection.close()  # the server releases its lock


async def waiting_for_locks(store) -> int:
    """How many sessions of this database wait for a lock now."""
    async with store.database.read() as connection:
        found = await connection.execute(
            text(
                "SELECT count(DISTINCT l.pid) FROM pg_locks l "
                "JOIN pg_stat_activity a ON a.pid = l.pid "
                "WHERE NOT l.granted AND a.datname = current_database()"
            )
        )
        return found.scalar()


async def in_flight(store) -> bool:
    async with store.database.read() as connection:
        found = await connection.execute(
            text(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND query LIKE '%held by the test' AND pid <> pg_backend_pid()"
            )
        )
        return found.scalar() > 0


async def test_an_append_that_needs_the_order_waits_for_those_side_by_side(postgres_url):
    async with await artstore.open_store(postgres_url) as store:
        await store.append("run-r", [run_started("r")])
        first_id = str(uuid.uuid4())
        first = await store.append(f"rollout-{first_id}", [started(first_id, "r")])
        slow_id = str(uuid.uuid4())
        slow_store = held_store(postgres_url, slow_id)
        hold = Hold(postgres_url)
        try:
            slow = asyncio.create_task(
                slow_store.append(f"rollout-{slow_id}", [started(slow_id, "r")], NO_STREAM)
            )
            await eventually(lambda: slow.done() or in_flight(store), "the slow start")
            assert not slow.done(), slow.result()
            # Another rollout's start goes by the one in flight...
            fast_id = str(uuid.uuid4())
            fast = await store.append(f"rollout-{fast_id}", [started(fast_id, "r")], NO_STREAM)
            assert not slow.done()
            assert store.side_by_side_transactions == 2
            # ... but a reader stops below it: it holds an earlier position.
            assert [e.position for e in await store.read_all(after=0)][-1] == first.positions[0]
            # A group's seal needs the order: it waits for the slow start to commit.
            seal = GroupSealed(group_id="g", run="r", rollout_ids=[slow_id, fast_id])
            sealing = asyncio.create_task(store.append("group-g", [seal]))
            await eventually(
                lambda: sealing.done() or _both_wait(store), "the seal to wait for the slow start"
            )
            assert not sealing.done(), sealing.result()
            hold.release()
            sealed = await sealing
            assert slow.done()
            held = await slow
            assert first.positions[0] < held.positions[0] < fast.positions[0]
            assert fast.positions[0] < sealed.positions[0]
            assert store.side_by_side_transactions == 2
            assert [e.position for e in await store.read_all(after=first.positions[0])] == [
                held.positions[0],
                fast.positions[0],
                sealed.positions[0],
            ]
        finally:
            hold.release()
            await slow_store.close()


async def _both_wait(store) -> bool:
    return await waiting_for_locks(store) >= 2


async def test_which_appends_go_side_by_side(database_url):
    # Only a rollout's own events, in its own stream, of a run whose row exists; anything
    # that writes across rollouts, or makes a run's row, takes the lock alone.
    async with await artstore.open_store(database_url) as store:
        on_postgres = store.dialect == "postgresql"

        async def goes_side_by_side(stream: str, event) -> bool:
            before = store.side_by_side_transactions
            await store.append(stream, [event])
            return store.side_by_side_transactions > before

        one, two, three, four = (str(uuid.uuid4()) for _ in range(4))
        # A run nobody started: the start makes its row, alone.
        assert not await goes_side_by_side(f"rollout-{one}", started(one, "new"))
        assert await goes_side_by_side(f"rollout-{two}", started(two, "new")) == on_postgres
        # A validation rollout makes no run's row; a start outside its own stream is alone.
        assert await goes_side_by_side(
            f"rollout-{three}", started(three, "other", role="validation")
        ) == (on_postgres)
        assert not await goes_side_by_side(f"elsewhere-{four}", started(four, "new"))
        seal = GroupSealed(group_id="g", run="new", rollout_ids=[one, two])
        assert not await goes_side_by_side("group-g", seal)
        assert not await goes_side_by_side("run-x", run_started("x"))


@pytest.mark.parametrize("rewarded_first", [False, True])
async def test_a_train_step_is_summed_again_under_its_own_lock(database_url, rewarded_first):
    # Rewards recorded for rollouts before they start, of a group a step trains: each start
    # sums the step again. On PostgreSQL the two starts run side by side, the first held
    # open after its projection: the second must sum the step after the first commits
    # (seeing its row), or the step would count one rollout where a rebuild counts two.
    async with await artstore.open_store(database_url) as store:
        await store.append("run-r", [run_started("r")])
        ids = [str(uuid.uuid4()) for _ in range(2)]
        rewards = RewardsRecorded(group_id="g", scorer="reward", rewards=dict.fromkeys(ids, 1.0))
        step = TrainStepStarted(
            run="r", model="p/m", step=0, group_ids=["g"], scorer="reward", trainer="t"
        )
        for stream, event in [("group-g", rewards), ("train-r", step)][
            :: -1 if rewarded_first else 1
        ]:
            await store.append(stream, [event])
        held, other = ids
        on_postgres = store.dialect == "postgresql"
        slow_store = held_store(database_url, held) if on_postgres else store
        hold = Hold(database_url) if on_postgres else None
        try:
            slow = asyncio.create_task(
                slow_store.append(f"rollout-{held}", [started(held, "r")], NO_STREAM)
            )
            if hold is not None:
                await eventually(lambda: slow.done() or in_flight(store), "the held start")
                assert not slow.done(), slow.result()
            else:
                await slow
            second = asyncio.create_task(
                store.append(f"rollout-{other}", [started(other, "r")], NO_STREAM)
            )
            if hold is not None:  # the second start waits for the first, held open
                await eventually(
                    lambda: second.done() or _both_wait(store), "the second start to wait"
                )
                hold.release()
            await second
            await slow
        finally:
            if hold is not None:
                hold.release()
            if slow_store is not store:
                await slow_store.close()
        async with store.database.read() as connection:
            summed = (await connection.execute(select(t.train_steps.c.num_trajectories))).one()
        assert summed.num_trajectories == 2
        before = await projections(store)
        await store.rebuild_projections()
        assert await projections(store) == before


async def test_without_the_function_every_append_takes_the_lock_alone(postgres_url):
    # A schema whose function of migration 0010 is gone (or may not be run): the first
    # append that tries it is written the checked way, and later ones take the lock alone.
    import psycopg

    async with await artstore.open_store(postgres_url) as store:
        await store.append("run-r", [run_started("r")])
        conninfo = postgres_url.replace("postgresql+asyncpg://", "postgresql://")
        with psycopg.connect(conninfo, autocommit=True) as admin:
            admin.execute(
                "DROP FUNCTION artstore_insert_events("
                "varchar[], varchar[], integer[], varchar[], json[], timestamptz[])"
            )
        ids = [str(uuid.uuid4()) for _ in range(3)]
        for rollout_id in ids:
            await store.append(f"rollout-{rollout_id}", [started(rollout_id, "r")], NO_STREAM)
        assert not store.events._writer.side_by_side_appends
        assert store.side_by_side_transactions == 0
        assert await count(store, t.rollouts) == 3
