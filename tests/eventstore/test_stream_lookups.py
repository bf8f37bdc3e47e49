"""Lookups of many streams at once (artstore/eventstore/streams.py), on SQLite and PostgreSQL:
what they return, and on PostgreSQL that they read `events` through its index before any
ANALYZE (an IN list of stream ids scanned the whole log then, in every batch)."""

from __future__ import annotations

from sqlalchemy import create_engine, func, select, text
from sqlalchemy.engine import make_url

import artstore
from artstore.events import CheckpointPushed, RunFinished
from artstore.eventstore.database import recorder_for, recorder_of
from artstore.eventstore.streams import events_of_streams, stream_heads
from artstore.schema.tables import events


async def test_many_streams_are_read_as_an_in_list_reads_them(store):
    for n in range(6):
        await store.append(f"s{n}", [RunFinished(run=f"r{n}.{i}") for i in range(n % 3 + 1)])
    await store.append("s4", [CheckpointPushed(run="r", model="m", step=1)])
    await store.append("s1", [CheckpointPushed(run="r", model="m", step=2)])
    wanted = ["s5", "missing", "s1", "s0", "s4", "s2"]

    def read(connection):
        recorder = recorder_of(connection)
        heads = stream_heads(connection, wanted)
        plain_heads = dict(
            connection.execute(
                select(events.c.stream_id, func.max(events.c.version))
                .where(events.c.stream_id.in_(wanted))
                .group_by(events.c.stream_id)
            ).all()
        )
        found = {}
        for event_type in (None, "run.finished", "checkpoint.pushed", "no.such.type"):
            plain = select(events).where(events.c.stream_id.in_(wanted))
            if event_type is not None:
                plain = plain.where(events.c.type == event_type)
            plain = plain.order_by(events.c.stream_id, events.c.version)
            query = events_of_streams(recorder, wanted, list(events.c), event_type)
            found[event_type] = (
                [tuple(row) for row in connection.execute(query)],
                [tuple(row) for row in connection.execute(plain)],
            )
        return heads, plain_heads, found

    async with store.database.read() as connection:
        heads, plain_heads, found = await connection.run_sync(read)
    assert heads == plain_heads == {"s5": 3, "s1": 3, "s0": 1, "s4": 3, "s2": 3}
    for event_type, (rows, plain) in found.items():
        assert rows == plain, event_type
    assert [(row[2], row[3]) for row in found["checkpoint.pushed"][0]] == [("s1", 3), ("s4", 3)]
    assert len(found[None][0]) == 13 and found["no.such.type"][0] == []


async def test_postgresql_reads_each_stream_through_the_index_before_any_analyze(postgres_url):
    """50,000 events never analyzed (a new database; autovacuum off or not round yet): an
    IN list of 500 stream ids is planned as a scan of all of `events`, the lookups are not."""
    async with await artstore.open_store(postgres_url):
        pass  # migrated
    engine = create_engine(make_url(postgres_url).set(drivername="postgresql+psycopg"))
    wanted = [f"rollout-{n}" for n in range(0, 10000, 20)]
    plans = {
        "in list": select(events).where(
            events.c.stream_id.in_(wanted), events.c.type == "llm.call"
        ),
        "events": events_of_streams(recorder_for("postgresql"), wanted, list(events.c), "llm.call"),
        "heads": recorder_for("postgresql").select_heads(wanted),
    }
    try:
        with engine.begin() as connection:
            connection.execute(
                text(
                    "INSERT INTO events (event_id, stream_id, version, type, data, recorded_at) "
                    "SELECT md5(i::text), 'rollout-' || (i / 5), i % 5 + 1, "
                    "CASE WHEN i % 5 = 0 THEN 'rollout.started' ELSE 'llm.call' END, "
                    "'{}'::json, now() FROM generate_series(0, 49999) AS i"
                )
            )
            explained = {}
            for name, query in plans.items():
                compiled = query.compile(
                    dialect=connection.dialect, compile_kwargs={"render_postcompile": True}
                )
                rows = connection.exec_driver_sql(f"EXPLAIN {compiled}", compiled.params)
                explained[name] = "\n".join(row[0] for row in rows)
            never_analyzed = connection.execute(
                text("SELECT reltuples FROM pg_class WHERE relname = 'events'")
            ).scalar()
            calls = connection.execute(
                events_of_streams(
                    recorder_for("postgresql"), wanted, [events.c.stream_id], "llm.call"
                )
            ).all()
            heads = stream_heads(connection, [*wanted, "rollout-none"])
    finally:
        engine.dispose()
    assert never_analyzed == -1
    # The state recording met: the plain IN list is planned as a scan of the whole log.
    assert "Seq Scan on events" in explained["in list"], explained["in list"]
    for name in ("events", "heads"):
        assert "Seq Scan on events" not in explained[name], explained[name]
        assert "uq_events_stream_id_version" in explained[name], explained[name]
    assert len(calls) == 500 * 4
    assert heads == dict.fromkeys(wanted, 5)
