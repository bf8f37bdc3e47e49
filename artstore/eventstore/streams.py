"""Queries of many streams at once that read each stream through its index.

`WHERE stream_id IN (...)` with hundreds of ids is what a batch asks of `events` (the
heads of the streams it appends to, the calls and trajectories of the rollouts it
finishes). PostgreSQL plans such a list from its statistics of `stream_id`; before
ANALYZE has run on the table (a new database, autovacuum off or not yet round) it takes
each id to match 0.5% of the rows, the list the whole table, and scans all of `events`:
0.15 s per 500 ids at 500,000 events, growing with the log, so that recording slowed down
with the square of the run (tools/bench_queries.py). Here each id is looked up on its own
(`unnest` of an array, one lookup per element in a nested loop), which uses the (stream,
version) index whatever the statistics say. SQLite always looks an IN list up through
the index, and keeps it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from sqlalchemy import ARRAY, String, bindparam, func, select, true
from sqlalchemy.engine import Connection
from sqlalchemy.sql import Select

from artstore.schema.tables import events


def _wanted(stream_ids: Sequence[str]) -> Any:
    """The ids as rows of one column `stream_id` (PostgreSQL: an array, unnested)."""
    ids = bindparam("wanted_stream_ids", list(stream_ids), type_=ARRAY(String))
    return func.unnest(ids).table_valued("stream_id").render_derived(name="wanted")


def heads_of_streams(dialect: str, stream_ids: Sequence[str]) -> Select:
    """(stream id, its version) of these streams; NULL (PostgreSQL) or no row (SQLite)
    for a stream without events."""
    if dialect != "postgresql":
        return (
            select(events.c.stream_id, func.max(events.c.version))
            .where(events.c.stream_id.in_(stream_ids))
            .group_by(events.c.stream_id)
        )
    # max() of one stream is the last entry of the index: a backward index scan.
    wanted = _wanted(stream_ids)
    head = (
        select(func.max(events.c.version))
        .where(events.c.stream_id == wanted.c.stream_id)
        .scalar_subquery()
    )
    return select(wanted.c.stream_id, head).select_from(wanted)


def stream_heads(connection: Connection, stream_ids: Iterable[str]) -> dict[str, int]:
    """The version of each of these streams that has events (streams without are left out)."""
    ids = sorted(set(stream_ids))
    if not ids:
        return {}
    query = heads_of_streams(connection.dialect.name, ids)
    return {stream_id: version for stream_id, version in connection.execute(query) if version}


def events_of_streams(
    dialect: str, stream_ids: Sequence[str], columns: Sequence[Any], event_type: str | None = None
) -> Select:
    """`columns` of the events in these streams (of type `event_type` only, when given),
    by stream id and version (each id at most once in `stream_ids`)."""
    if dialect != "postgresql":
        query = select(*columns).where(events.c.stream_id.in_(stream_ids))
        if event_type is not None:
            query = query.where(events.c.type == event_type)
        return query.order_by(events.c.stream_id, events.c.version)
    wanted = _wanted(stream_ids)
    # LATERAL with OFFSET 0: the planner may not flatten it into a join (which it could
    # hash over all of `events`); it runs once per id, through the index.
    inner = select(events).where(events.c.stream_id == wanted.c.stream_id)
    if event_type is not None:
        inner = inner.where(events.c.type == event_type)
    found = inner.offset(0).lateral("found")
    picked = [found.c[column.name] for column in columns]
    return (
        select(*picked)
        .select_from(wanted)
        .join(found, true())
        .order_by(found.c.stream_id, found.c.version)
    )
