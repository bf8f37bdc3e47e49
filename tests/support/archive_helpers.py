"""What the archive tests compare: a run's events as stored, and its rows in the views.

`stored_events(store, streams)`: every event of the streams, as stored (the payload's JSON
text, not a document), in position order, without positions; `run_views(store, run)`: every
view's rows of the run, order-free, without positions and surrogate ids (a restore gives
the events new positions, in their old order, and the projections new ids).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Text, cast, select, text

from artstore.archive.members import chunks
from artstore.schema import tables as t
from artstore.schema.views import VIEWS

RENUMBERED = {"position", "id", "train_step_id"}


async def stored_events(store: Any, streams: list[str]) -> list[tuple]:
    e = t.events
    found = []
    async with store.database.read() as connection:
        for batch in chunks(streams):
            query = select(
                e.c.position,
                e.c.event_id,
                e.c.stream_id,
                e.c.version,
                e.c.type,
                cast(e.c.data, Text),
                e.c.recorded_at,
            ).where(e.c.stream_id.in_(batch))
            found.extend((await connection.execute(query)).all())
    return [tuple(row[1:]) for row in sorted(found)]


async def run_streams(store: Any, run: str) -> list[str]:
    from artstore.archive.members import run_members

    return list((await store.database.run_read(lambda c: run_members(c, run))).streams)


async def run_views(store: Any, run: str) -> dict[str, list[str]]:
    found = {}
    async with store.database.read() as connection:
        for view in VIEWS:
            result = await connection.execute(text(f"SELECT * FROM {view.name}"))
            columns = list(result.keys())
            if "run" not in columns:
                continue
            kept = [i for i, name in enumerate(columns) if name not in RENUMBERED]
            rows = [row for row in result.all() if row[columns.index("run")] == run]
            found[view.name] = sorted(repr(tuple(row[i] for i in kept)) for row in rows)
    return found


async def event_count(store: Any, stream_prefix: str) -> int:
    async with store.database.read() as connection:
        query = text("SELECT count(*) FROM events WHERE stream_id LIKE :prefix")
        return (await connection.execute(query, {"prefix": f"{stream_prefix}%"})).scalar()
