"""The event store's guarantees (issue: event store foundation), on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import math
import subprocess
import sys
import uuid
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest
from budget import budget
from sqlalchemy import func, select, text
from sqlalchemy.dialects.sqlite.pysqlite import SQLiteDialect_pysqlite

import artstore
from artstore.errors import (
    AppendRefusedError,
    DatabaseUnavailableError,
    DuplicateEventError,
    ImmutableEventError,
    InvalidEventError,
    SchemaTooNewError,
    UnknownEventTypeError,
    WrongExpectedVersionError,
)
from artstore.events import (
    Event,
    RewardsRecorded,
    RunFinished,
    decode_event,
    event_type,
    new_event_id,
)
from artstore.eventstore import NO_STREAM, encode_blob
from artstore.eventstore import store as eventstore_module
from artstore.eventstore.database import connect, translate_error
from artstore.eventstore.records import AppendResult, PendingAppend
from artstore.eventstore.sqlite import sqlite_timestamp
from artstore.eventstore.store import EventStore
from artstore.projections import project, projected_types
from artstore.schema.tables import blobs, events
from artstore.urls import resolve_url

WORKER = Path(__file__).parents[1] / "support" / "append_worker.py"


def finished(run: str) -> RunFinished:
    return RunFinished(run=run)


async def count_events(store) -> int:
    async with store.database.read() as connection:
        return (await connection.execute(select(func.count()).select_from(events))).scalar()


async def test_append_and_read_round_trip(store):
    first = await store.append("run-a", [finished("a1"), finished("a2")], NO_STREAM)
    second = await store.append("run-b", [finished("b1")], NO_STREAM)
    third = await store.append("run-a", [finished("a3")], expected_version=2)

    assert (first.version, second.version, third.version) == (2, 1, 3)
    stream = await store.read_stream("run-a")
    assert [e.decode().run for e in stream] == ["a1", "a2", "a3"]
    assert [e.version for e in stream] == [1, 2, 3]
    assert [e.decode().run for e in await store.read_stream("run-a", from_version=3)] == ["a3"]

    everything = await store.read_all()
    assert [e.decode().run for e in everything] == ["a1", "a2", "b1", "a3"]
    positions = [e.position for e in everything]
    assert positions == sorted(positions) and len(set(positions)) == 4
    assert [e.decode().run for e in await store.read_all(after=positions[1])] == ["b1", "a3"]
    assert [e.position for e in await store.read_all(after=0, limit=2)] == positions[:2]
    paged = [e async for e in store.iter_all(page_size=1)]
    assert [e.position for e in paged] == positions
    assert everything[0].recorded_at.tzinfo is not None
    assert await store.stream_version("run-a") == 3
    assert await store.stream_version("run-none") == 0
    assert await store.last_position() == positions[-1]


async def test_two_writers_with_the_same_expected_version(database_url):
    # Two stores are two independent writers (own engines and connections).
    async with (
        await artstore.open_store(database_url) as one,
        await artstore.open_store(database_url) as two,
    ):
        await one.append("run-shared", [finished("base")], NO_STREAM)
        release = asyncio.Event()

        async def write(store, name):
            await release.wait()
            return await store.append("run-shared", [finished(name)], expected_version=1)

        tasks = [asyncio.create_task(write(one, "one")), asyncio.create_task(write(two, "two"))]
        await asyncio.sleep(0.05)
        release.set()
        outcomes = await asyncio.gather(*tasks, return_exceptions=True)

        winners = [o for o in outcomes if not isinstance(o, BaseException)]
        losers = [o for o in outcomes if isinstance(o, BaseException)]
        assert len(winners) == 1 and len(losers) == 1
        assert isinstance(losers[0], WrongExpectedVersionError)
        assert losers[0].actual == 2 and "nothing was written" in str(losers[0])

        loser = two if outcomes[0] is winners[0] else one
        retried = await loser.append("run-shared", [finished("retry")], expected_version=2)
        assert retried.version == 3
        assert len(await one.read_stream("run-shared")) == 3


async def test_retried_append_writes_nothing_twice(database_url):
    batch = [finished("x1"), finished("x2")]
    async with await artstore.open_store(database_url) as store:
        first = await store.append("run-x", batch, NO_STREAM)
        again = await store.append("run-x", batch, NO_STREAM)  # the same event objects
        assert again.positions == first.positions and not again.written
    # A retry from another process (nothing cached) is recognised by the database.
    async with await artstore.open_store(database_url) as other:
        third = await other.append("run-x", batch, NO_STREAM)
        assert third.positions == first.positions and not third.written
        assert await count_events(other) == 2


async def test_a_batch_with_one_invalid_event_writes_nothing(store):
    await store.append("run-y", [finished("y1")], NO_STREAM)
    stored = finished("y2")
    await store.append("run-y", [stored])

    nan = RewardsRecorded(group_id="g", scorer="s", rewards={"r": math.nan})
    with pytest.raises(InvalidEventError, match="JSON"):
        await store.append("run-y", [finished("y3"), nan])

    class NotDeclared(Event):
        value: int = 1

    with pytest.raises(UnknownEventTypeError):
        await store.append("run-y", [finished("y3"), NotDeclared()])

    # Passes every check in Python, but one event id is already stored: the database
    # refuses the batch and nothing of it is written.
    with pytest.raises(DuplicateEventError, match="nothing was written"):
        await store.append("run-y", [finished("y3"), stored])

    assert [e.decode().run for e in await store.read_stream("run-y")] == ["y1", "y2"]
    assert await count_events(store) == 2


async def test_a_loop_of_lone_appends_lets_timers_and_other_tasks_run(store):
    """A lone append may commit without giving the event loop a turn; a program that only
    appends must still see its timers fire and its other tasks run."""
    loop = asyncio.get_running_loop()
    fired = asyncio.Event()
    loop.call_later(0.002, fired.set)
    ticks = 0

    async def ticking() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.001)
            ticks += 1

    ticker = asyncio.create_task(ticking())
    appended = 0
    version = NO_STREAM
    # Fewer than STATISTICS_EVERY_EVENTS: that refresh goes through the writer task, a turn.
    while not (fired.is_set() and ticks >= 3) and appended < 5_000:
        version = (await store.append("lone", [finished(str(appended))], version)).version
        appended += 1
    ticker.cancel()
    assert fired.is_set() and ticks >= 3, appended
    assert version == appended


async def test_group_commit_takes_apart_a_batch_with_one_conflict(store):
    await store.append("run-c", [finished("c0")], NO_STREAM)
    appends = [store.append(f"run-{n}", [finished(str(n))], NO_STREAM) for n in range(63)]
    appends.append(store.append("run-c", [finished("stale")], expected_version=5))
    before = store.transactions
    outcomes = await asyncio.gather(*appends, return_exceptions=True)

    assert all(not isinstance(o, BaseException) for o in outcomes[:63])
    assert isinstance(outcomes[63], WrongExpectedVersionError)
    assert await count_events(store) == 64
    # 64 concurrent single-event appends took a handful of transactions, not 64.
    assert store.transactions - before <= 4


async def _stored_rows(store) -> tuple[list, list]:
    async with store.database.read() as connection:
        stored_events = (await connection.execute(select(events).order_by(events.c.position))).all()
        stored_blobs = (await connection.execute(select(blobs).order_by(blobs.c.hash))).all()
    return stored_events, stored_blobs


# Ordinary statements that would change or remove a stored event or blob, each database's
# own: SQLite's REPLACE deletes the row it collides with without firing DELETE triggers.
_COLUMNS = "position, event_id, stream_id, version, type, data, recorded_at"
TAMPERING = {
    "sqlite": [
        f"INSERT OR REPLACE INTO events ({_COLUMNS}) "
        f"SELECT position, event_id, stream_id, version, 'tampered', data, recorded_at FROM events",
        "REPLACE INTO events (event_id, stream_id, version, type, data, recorded_at) "
        "VALUES ('other-id', 'run-z', 1, 'tampered', '{}', '2026-01-01 00:00:00.000000')",
        f"INSERT INTO events ({_COLUMNS}) SELECT * FROM events WHERE true "
        "ON CONFLICT (event_id) DO UPDATE SET type = 'tampered'",
        "INSERT INTO events (event_id, stream_id, version, type, data, recorded_at) "
        "VALUES ('other-id', 'run-z', 1, 'x', '{}', '2026-01-01') ON CONFLICT DO NOTHING",
        "UPDATE OR REPLACE events SET version = 7",
        "REPLACE INTO blobs (hash, body, size) SELECT hash, '{}', 2 FROM blobs",
        "INSERT OR REPLACE INTO blobs (hash, body, size) SELECT hash, '[]', 2 FROM blobs",
        "INSERT INTO blobs (hash, body, size) SELECT hash, '{}', 2 FROM blobs WHERE true "
        "ON CONFLICT (hash) DO UPDATE SET body = excluded.body",
    ],
    "postgresql": [
        f"INSERT INTO events ({_COLUMNS}) SELECT * FROM events "
        "ON CONFLICT (event_id) DO UPDATE SET type = 'tampered'",
        "INSERT INTO blobs (hash, body, size) SELECT hash, '{}', 2 FROM blobs "
        "ON CONFLICT (hash) DO UPDATE SET body = excluded.body",
        "MERGE INTO events USING (SELECT 1) AS s ON true "
        "WHEN MATCHED THEN UPDATE SET type = 'tampered'",
        "MERGE INTO events USING (SELECT 1) AS s ON true WHEN MATCHED THEN DELETE",
        "MERGE INTO blobs USING (SELECT 1) AS s ON true WHEN MATCHED THEN UPDATE SET body = '{}'",
        "MERGE INTO blobs USING (SELECT 1) AS s ON true WHEN MATCHED THEN DELETE",
        "TRUNCATE events",
        "TRUNCATE blobs",
        "TRUNCATE events, blobs RESTART IDENTITY CASCADE",
        "WITH gone AS (DELETE FROM events RETURNING *) SELECT count(*) FROM gone",
    ],
}


async def test_no_ordinary_statement_changes_or_removes_a_stored_event_or_blob(store):
    digest, body = encode_blob({"role": "user", "content": "hi"})
    await store.append("run-z", [finished("z")], NO_STREAM, blobs={digest: body})
    before = await _stored_rows(store)
    for statement in [
        "UPDATE events SET type = 'tampered'",
        "DELETE FROM events",
        "UPDATE blobs SET body = '{}'",
        "DELETE FROM blobs",
        *TAMPERING[store.dialect],
    ]:
        with pytest.raises(Exception) as raised:
            async with store.database.write() as connection:
                await connection.execute(text(statement))
        assert isinstance(translate_error(raised.value), ImmutableEventError), statement
        assert await _stored_rows(store) == before, statement
    # The store's own writes still go through (a blob stored again is left as it is).
    await store.append("run-z", [finished("z2")], blobs={digest: body})
    assert [e.decode().run for e in await store.read_all()] == ["z", "z2"]


async def test_blobs_are_stored_once_by_content(store):
    digest, body = encode_blob({"role": "system", "content": "be brief"})
    for n in range(3):
        await store.append(f"run-{n}", [finished(str(n))], blobs={digest: body})
    async with await artstore.open_store(str(store.database.url)) as other:
        await other.append("run-other", [finished("o")], blobs={digest: body})
    async with store.database.read() as connection:
        rows = (await connection.execute(select(blobs.c.hash))).all()
    assert [row.hash for row in rows] == [digest]
    assert await store.get_blobs([digest, "missing"]) == {digest: body}


async def test_a_blob_under_another_hash_than_its_texts_is_refused_with_its_append(store):
    digest, body = encode_blob({"role": "user", "content": "the text"})
    other, _ = encode_blob({"role": "user", "content": "another text"})
    with pytest.raises(InvalidEventError, match="SHA-256 of its text") as refused:
        await store.append("run-b", [finished("b")], NO_STREAM, blobs={other: body})
    assert "\n" not in str(refused.value)
    assert await store.read_all() == [] and await store.get_blobs([other]) == {}
    for unusable in ('"\udcff"', b"{}"):  # a str UTF-8 cannot hold, bytes: as clear
        with pytest.raises(InvalidEventError, match="a str that UTF-8 can hold"):
            await store.append("run-b", [finished("b")], NO_STREAM, blobs={other: unusable})
    # The same append with the blob under its own hash goes through.
    await store.append("run-b", [finished("b")], NO_STREAM, blobs={digest: body})
    assert await store.get_blobs([digest, other]) == {digest: body}


@pytest.mark.slow
@pytest.mark.parametrize("events", ["projected", "unprojected"])
async def test_catch_up_reader_sees_every_event_once_in_order(database_url, events):
    # "unprojected": the writers' batches need no projection, so that on PostgreSQL each
    # is one INSERT that commits by itself; they queue behind the slow writer all the same.
    per_writer, writers = budget(500, 2000), 4
    mode = ["--unprojected"] if events == "unprojected" else []
    async with await artstore.open_store(database_url) as store:
        # The slow writer starts first: its position is low, its commit late.
        slow = subprocess.Popen(
            [sys.executable, str(WORKER), database_url, "run-slow", "1", "--hold", "2"],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert slow.stdout is not None and slow.stdout.readline().strip() == "holding"
        procs = [
            subprocess.Popen(
                [sys.executable, str(WORKER), database_url, f"run-w{n}", str(per_writer), *mode],
                stdout=subprocess.PIPE,
                text=True,
            )
            for n in range(writers)
        ]
        expected = writers * per_writer + 1
        seen: list[int] = []
        ids: set[str] = set()
        after = 0
        while len(seen) < expected:
            page = await store.read_all(after=after, limit=500)
            for recorded in page:
                assert recorded.position > after, "positions must strictly increase"
                assert recorded.event_id not in ids, "an event was seen twice"
                ids.add(recorded.event_id)
                seen.append(recorded.position)
                after = recorded.position
            if not page:
                assert any(p.poll() is None for p in [slow, *procs]) or len(seen) == expected, (
                    f"writers finished but the reader saw {len(seen)} of {expected}"
                )
                await asyncio.sleep(0.01)
        for proc in [slow, *procs]:
            assert proc.wait(timeout=120) == 0
        final = await store.read_all(limit=expected + 10)
        assert [e.position for e in final] == seen
        assert len(final) == expected
        said = [proc.stdout.read() for proc in procs if proc.stdout is not None]
        if events == "unprojected" and store.dialect == "postgresql":
            # The path under test was taken: most batches were single statements.
            counts = [int(output.split()[-1]) for output in said]
            assert all(count > per_writer / 32 for count in counts), counts


async def test_unknown_event_type_is_a_clear_error():
    with pytest.raises(UnknownEventTypeError, match="newer artstore"):
        decode_event("from.the.future", {})


async def test_a_newer_schema_is_refused(database_url):
    async with await artstore.open_store(database_url) as store:
        async with store.database.write() as connection:
            await connection.execute(text("UPDATE alembic_version SET version_num = '9999_future'"))
    with pytest.raises(SchemaTooNewError, match="newer artstore"):
        await artstore.open_store(database_url)


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://nobody@127.0.0.1:1/none",
        "sqlite:////proc/artstore-cannot-write-here/x.db",
    ],
)
async def test_an_unreachable_database_is_a_clear_error(url):
    with pytest.raises(DatabaseUnavailableError, match="cannot reach the database"):
        await artstore.open_store(url)


async def test_sqlite_keeps_planner_statistics_for_the_views(tmp_path):
    # Without statistics SQLite planned v_train_steps in seconds on a large run.
    url = f"sqlite:///{tmp_path / 'stats.db'}"
    async with await artstore.open_store(url) as store:
        await store.append("run-s", [finished("s")], NO_STREAM)
    async with await artstore.open_store(url) as store:
        async with store.database.read() as connection:
            tables = await connection.execute(text("SELECT name FROM sqlite_master"))
            assert "sqlite_stat1" in {row.name for row in tables}


async def test_no_event_keeps_a_known_secret(store, monkeypatch):
    # Whatever layer makes an event (a run's error, a failed step), the store rewrites it.
    secret = "sk-live-0123456789abcdef"
    store.redact.add([secret])
    await store.append("run-r", [RunFinished(run="r", status="failed", error=f"401 for {secret}")])
    (recorded,) = await store.read_stream("run-r")
    assert secret not in str(recorded.data) and "[REDACTED]" in recorded.data["error"]


class RaceWorker:
    """A process of tests/support/stream_race_worker.py, driven line by line."""

    def __init__(self, url: str, stream: str, name: str, *args: str) -> None:
        self.process = subprocess.Popen(
            [sys.executable, str(RACE_WORKER), url, stream, name, *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.said() == "ready"

    def said(self) -> str:
        assert self.process.stdout is not None
        return self.process.stdout.readline().strip()

    def go(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write("\n")
        self.process.stdin.flush()

    def finish(self) -> str:
        outcome = self.said()
        assert self.process.wait(timeout=60) == 0
        return outcome


RACE_WORKER = Path(__file__).parents[1] / "support" / "stream_race_worker.py"


async def test_processes_racing_for_a_stream_version_get_wrong_expected_version(postgres_url):
    # On PostgreSQL the stream's head is read before the append lock is taken: another
    # process can commit the same version in between. The loser must hear it as a
    # version conflict (never a raw constraint error) and write nothing.
    async with await artstore.open_store(postgres_url) as store:
        await store.append("run-race", [finished("base")], NO_STREAM)
        slow = RaceWorker(postgres_url, "run-race", "slow", "--expected", "1", "--pause")
        fast = RaceWorker(postgres_url, "run-race", "fast", "--expected", "1")
        slow.go()
        assert slow.said() == "checked"  # the head (1) is read; the INSERT is to come
        fast.go()
        assert fast.finish() == "ok 2"
        slow.go()
        while (line := slow.said()) == "checked":  # the condition runs again on the recheck
            slow.go()
        assert line.startswith("error WrongExpectedVersionError"), line
        assert slow.process.wait(timeout=60) == 0
        stream = await store.read_stream("run-race")
        assert [(e.version, e.decode().run) for e in stream] == [(1, "base"), (2, "fast")]


async def test_an_append_to_any_version_outlasts_other_processes_committing_first(postgres_url):
    # With no expected version, an append whose head went stale while it waited (twice
    # here: on the first try and on the recheck) is written after the others, without a gap.
    async with await artstore.open_store(postgres_url) as store:
        await store.append("run-any", [finished("base")], NO_STREAM)
        slow = RaceWorker(postgres_url, "run-any", "slow", "--pause")
        others = [RaceWorker(postgres_url, "run-any", name) for name in ("second", "third")]
        slow.go()
        for other in others:  # each commits while the slow one sits between head and INSERT
            assert slow.said() == "checked"
            other.go()
            assert other.finish().startswith("ok ")
            slow.go()
        while (line := slow.said()) == "checked":
            slow.go()
        assert line == "ok 4"
        assert slow.process.wait(timeout=60) == 0
        stream = await store.read_stream("run-any")
        assert [e.version for e in stream] == [1, 2, 3, 4]
        assert [e.decode().run for e in stream] == ["base", "second", "third", "slow"]


HOLD_SQLITE_WRITE_LOCK = """
import sqlite3, sys
connection = sqlite3.connect(sys.argv[1], isolation_level=None)
connection.execute("BEGIN IMMEDIATE")
print("holding", flush=True)
sys.stdin.readline()
connection.execute("COMMIT")
"""


async def append_while_another_process_holds_the_write_lock(
    store: EventStore, path: Path, stream_id: str, event: Event
) -> AppendResult:
    """Append `event` (at version 2) while another process holds the SQLite file's write
    lock: the append waits, the event loop keeps running, and it commits once released."""
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_SQLITE_WRITE_LOCK, str(path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout is not None and holder.stdout.readline().strip() == "holding"
    waiting = asyncio.create_task(store.append(stream_id, [event], expected_version=1))
    ticks = 0
    for _ in range(5):  # the loop keeps running while the append waits
        await asyncio.sleep(0.02)
        ticks += 1
    assert ticks == 5 and not waiting.done()
    assert holder.stdin is not None
    holder.stdin.write("\n")
    holder.stdin.flush()
    assert holder.wait(timeout=60) == 0
    return await waiting


async def test_sqlite_appends_wait_for_another_process_without_blocking_the_loop(tmp_path):
    # A small append runs on the event loop's thread only when the file is free at once;
    # while another process holds the write lock it waits in the writer thread.
    path = tmp_path / "held.db"
    async with await artstore.open_store(f"sqlite:///{path}") as store:
        first = await store.append("run-h", [finished("h1")], NO_STREAM)
        second = await append_while_another_process_holds_the_write_lock(
            store, path, "run-h", finished("h2")
        )
        third = await store.append("run-h", [finished("h3")], expected_version=2)
        assert (second.version, third.version) == (2, 3)
        stream = await store.read_stream("run-h")
        assert [e.decode().run for e in stream] == ["h1", "h2", "h3"]
        assert [e.position for e in stream] == [first.positions[0] + n for n in range(3)]


async def test_sqlite_appends_on_the_driver_wait_for_another_process_too(tmp_path):
    # An append with nothing to project is BEGIN IMMEDIATE, INSERT and COMMIT on the
    # driver's connection, not a SQLAlchemy transaction: it waits for the lock the same way.
    path = tmp_path / "held.db"
    async with await artstore.open_store(f"sqlite:///{path}") as store:
        first = await store.append("thing-h", [NotProjected(n=1)], NO_STREAM)
        second = await append_while_another_process_holds_the_write_lock(
            store, path, "thing-h", NotProjected(n=2)
        )
        third = await store.append("thing-h", [NotProjected(n=3)], expected_version=2)
        assert (second.version, third.version) == (2, 3)
        assert store.single_statement_transactions == 3  # each on the driver, none aside
        stream = await store.read_stream("thing-h")
        assert [e.decode().n for e in stream] == [1, 2, 3]
        assert [e.position for e in stream] == [first.positions[0] + n for n in range(3)]


@event_type("test.not_projected")
class NotProjected(Event):
    n: int


async def test_single_statement_appends_keep_every_check(database_url):
    # A batch with nothing to project, no condition, no new blob and known stream heads is
    # one INSERT that commits by itself (PostgreSQL), or one INSERT sent to the driver
    # between BEGIN IMMEDIATE and COMMIT (SQLite); what a transaction checks, it checks
    # too, and the writer's later transactions are still all or nothing.
    await (await artstore.open_store(database_url)).close()  # migrated

    def projector(connection, recorded, blobs) -> None:
        project(connection, recorded, blobs)
        if any(e.data.get("run") == "bad" for e in recorded):  # after the INSERT
            raise ValueError("this projection fails")

    def open_event_store() -> EventStore:
        database = connect(resolve_url(database_url))
        return EventStore(database, projector=projector, projected_types=projected_types())

    store, other = open_event_store(), open_event_store()
    try:
        one = NotProjected(n=1)
        first = await store.append("thing-1", [one], NO_STREAM)
        assert (first.version, first.written) == (1, True)
        assert store.single_statement_transactions == 1
        again = await store.append("thing-1", [one], NO_STREAM)  # a retry: nothing twice
        assert (again.version, again.positions, again.written) == (1, first.positions, False)
        await other.append("thing-1", [NotProjected(n=2)], expected_version=1)
        with pytest.raises(WrongExpectedVersionError):  # its cached head (1) is stale
            await store.append("thing-1", [NotProjected(n=3)], expected_version=1)
        with pytest.raises(WrongExpectedVersionError):  # a new stream that exists already
            await store.append("thing-1", [NotProjected(n=4)], NO_STREAM)
        third = await store.append("thing-1", [NotProjected(n=5)], expected_version=2)
        assert third.version == 3  # checked against the database: the head is known again
        fourth = await store.append("thing-1", [NotProjected(n=7)], expected_version=3)
        assert (fourth.version, store.single_statement_transactions) == (4, 2)
        # Queued together with a projected append: one transaction, as before.
        both = await asyncio.gather(
            store.append("thing-2", [NotProjected(n=6)], NO_STREAM),
            store.append("run-g", [finished("good")], NO_STREAM),
        )
        assert [result.version for result in both] == [1, 1]
        with pytest.raises(AppendRefusedError, match="this projection fails"):
            await store.append("run-g", [finished("bad")], expected_version=1)
        stream = await store.read_stream("thing-1")
        assert [(e.version, e.decode().n) for e in stream] == [(1, 1), (2, 2), (3, 5), (4, 7)]
        assert [e.decode().run for e in await store.read_stream("run-g")] == ["good"]
        assert await count_events(store) == 6
        assert [e.position for e in stream] == sorted(e.position for e in stream)
    finally:
        await store.close()
        await other.close()


async def test_a_reader_stops_below_a_concurrent_append_in_flight(postgres_url):
    # Appends with nothing to project run side by side on PostgreSQL and may commit out of
    # position order: a reader following positions must stop below one still in flight
    # (here a transaction holding a position, open), and read it in order once it commits.
    import psycopg

    async with await artstore.open_store(postgres_url) as store:
        before = await store.append("thing-0", [NotProjected(n=0)], NO_STREAM)
        conninfo = postgres_url.replace("postgresql+asyncpg://", "postgresql://")
        with psycopg.connect(conninfo) as held:  # a transaction, left open
            held_position = held.execute(
                "SELECT inserted_position FROM artstore_insert_events(ARRAY['held-1'], "
                "ARRAY['thing-held'], ARRAY[1], ARRAY['test.not_projected'], "
                """ARRAY['{"n": 1}'::json], ARRAY[now()])"""
            ).fetchone()[0]
            later = await store.append("thing-2", [NotProjected(n=2)], NO_STREAM)
            assert store.single_statement_transactions == 2  # not behind the open one
            assert before.positions[0] < held_position < later.positions[0]
            seen = [e.position for e in await store.read_all(after=0)]
            assert seen == before.positions  # not the later one: the held one may commit
            assert await store.last_position() == before.positions[0]
            held.commit()
        seen = [e.position for e in await store.read_all(after=before.positions[0])]
        assert seen == [held_position, later.positions[0]]
        assert await store.last_position() == later.positions[0]


async def test_a_failed_small_sqlite_transaction_leaves_nothing_and_the_writer_usable(tmp_path):
    url = f"sqlite:///{tmp_path / 'failed.db'}"
    await (await artstore.open_store(url)).close()  # migrated

    def projector(connection, recorded, blobs) -> None:
        project(connection, recorded, blobs)
        if any(e.data.get("run") == "bad" for e in recorded):  # after the INSERT
            raise ValueError("this projection fails")

    store = EventStore(connect(resolve_url(url)), projector=projector)
    try:
        good = await store.append("run-f", [finished("good")], NO_STREAM)
        with pytest.raises(AppendRefusedError, match="this projection fails"):
            await store.append("run-f", [finished("bad")], expected_version=1)
        after = await store.append("run-f", [finished("after")], expected_version=1)
        stream = await store.read_stream("run-f")
        assert [(e.version, e.decode().run) for e in stream] == [(1, "good"), (2, "after")]
        assert after.positions == [good.positions[0] + 1]  # the failed one left no position
        assert await count_events(store) == 2
    finally:
        await store.close()


async def test_the_envelope_is_stored_as_sqlalchemy_stores_it(store):
    """The SQLite writer binds values itself (not through SQLAlchemy's statement
    machinery): a timestamp reads back to the microsecond, in UTC, on both databases, and
    the text SQLite holds is the text SQLAlchemy's own bind processor makes."""
    event = finished("exact")
    result = await store.append("run-exact", [event], NO_STREAM)
    (recorded,) = await store.read_stream("run-exact")
    assert (recorded.event_id, recorded.position) == (event.event_id, result.positions[0])
    assert recorded.recorded_at.utcoffset() == timedelta(0)
    async with store.database.read() as connection:
        stored = (
            await connection.execute(
                select(events.c.recorded_at).where(events.c.event_id == event.event_id)
            )
        ).scalar_one()
        assert stored.replace(tzinfo=UTC) == recorded.recorded_at
        if store.dialect == "sqlite":
            text_stored = (
                await connection.exec_driver_sql(
                    "SELECT recorded_at FROM events WHERE event_id = ?", (event.event_id,)
                )
            ).scalar_one()
            bind = events.c.recorded_at.type._cached_bind_processor(connection.dialect)
            assert text_stored == bind(recorded.recorded_at)


def test_sqlite_timestamps_are_written_as_sqlalchemy_writes_them():
    bind = events.c.recorded_at.type._cached_bind_processor(SQLiteDialect_pysqlite())
    zones = [UTC, timezone(timedelta(hours=5, minutes=30)), timezone(timedelta(hours=-11))]
    moments = [
        datetime(2026, 12, 1, 14, 0, 0, 0, tzinfo=UTC),  # no microseconds: still written
        datetime(1, 1, 1, 0, 0, 0, 1),  # naive: taken as it is
        datetime(999, 3, 4, 5, 6, 7, 890123, tzinfo=zones[1]),
        datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=zones[1]),
        datetime.now(UTC),
    ] + [
        datetime(2026, 1, 1, tzinfo=zone) + timedelta(seconds=k * 7919.123457)
        for zone in zones
        for k in range(50)
    ]
    assert [sqlite_timestamp(moment) for moment in moments] == [bind(moment) for moment in moments]


def test_event_ids_are_time_ordered_uuids():
    ids = [new_event_id() for _ in range(1000)]
    assert len(set(ids)) == len(ids)
    parsed = [uuid.UUID(value) for value in ids]
    assert all(
        str(u) == value and u.version == 7 and u.variant == uuid.RFC_4122
        for u, value in zip(parsed, ids, strict=True)
    )
    # The first 48 bits are the time in milliseconds: ids made later never sort earlier.
    assert [u.int >> 80 for u in parsed] == sorted(u.int >> 80 for u in parsed)


async def test_an_append_after_queued_ones_is_written_after_them(store):
    """A lone `append` may commit without the writer task (SQLite), never ahead of what
    the same task queued before it, and with the same checks as any append."""
    first = store.append_nowait("run-o", [finished("o1")], NO_STREAM)
    second = await store.append("run-o", [finished("o2")], expected_version=1)
    third = await store.append("run-o", [finished("o3")], expected_version=2)
    assert ((await first).version, second.version, third.version) == (1, 2, 3)
    with pytest.raises(WrongExpectedVersionError):
        await store.append("run-o", [finished("stale")], expected_version=2)
    retried = await store.append("run-o", [finished("o4")], expected_version=3)
    again = await store.append("run-o", [finished("o4-again")], expected_version=4)
    assert (retried.version, again.version) == (4, 5)
    assert [e.decode().run for e in await store.read_stream("run-o")] == [
        "o1",
        "o2",
        "o3",
        "o4",
        "o4-again",
    ]


async def test_appends_queued_together_are_never_split_between_transactions(store, monkeypatch):
    """The writer ends a transaction at its limits, but never inside appends queued
    together: with a limit of 3 appends per transaction, 2 lone appends and 5 queued
    together take one transaction (not 3 split across two), the next append another."""
    monkeypatch.setattr(eventstore_module, "MAX_APPENDS_PER_TRANSACTION", 3)
    await store.append("run-first", [finished("first")], NO_STREAM)
    with pytest.raises(InvalidEventError):  # one invalid append: none of them is queued
        store.append_together_nowait(
            [PendingAppend("run-t0", [finished("t0")], NO_STREAM), PendingAppend("run-t1", [])]
        )
    before = store.transactions
    lone = [store.append_nowait(f"run-l{n}", [finished(f"l{n}")], NO_STREAM) for n in range(2)]
    together = store.append_together_nowait(
        [PendingAppend(f"run-t{n}", [finished(f"t{n}")], NO_STREAM) for n in range(5)]
    )
    after = store.append_nowait("run-after", [finished("after")], NO_STREAM)
    results = await asyncio.gather(*lone, *together, after)
    assert [r.version for r in results] == [1] * 8
    assert store.transactions - before == 2
    assert await count_events(store) == 9


async def test_every_way_of_appending_stores_each_payload_as_a_json_object(store):
    """Payloads reach the database as the JSON text the append encoded, whichever way the
    writer takes: one INSERT that commits by itself, a projected batch, the checked way
    (a condition, an expected version of ANY), a batch queued with others."""
    await store.append("plain", [NotProjected(n=1)], NO_STREAM)  # one statement
    await store.append("plain", [NotProjected(n=n) for n in range(2, 102)], expected_version=1)
    await store.append("run-a", [finished("a")], NO_STREAM)  # projected, not a rollout's
    await store.append("checked", [NotProjected(n=0)], condition=lambda connection: None)
    await store.append("checked", [NotProjected(n=1)])  # ANY: checked against the database
    await asyncio.gather(
        store.append("run-b", [finished("b")], NO_STREAM),
        store.append("plain-2", [NotProjected(n=2)], NO_STREAM),
    )
    json_type = "json_typeof" if store.dialect == "postgresql" else "json_type"
    async with store.database.read() as connection:
        kinds = await connection.execute(
            text(f"SELECT {json_type}(data) AS kind, count(*) FROM events GROUP BY kind")
        )
        assert dict(kinds.all()) == {"object": 106}
    assert [e.decode().n for e in await store.read_stream("plain")] == list(range(1, 102))
    assert [e.decode().run for e in await store.read_stream("run-b")] == ["b"]
