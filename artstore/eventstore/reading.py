"""Reading events: one stream, several, or all of them in position order.

A reader catching up with `read_all(after=...)` sees every committed event exactly once,
in order (invariant 3): on PostgreSQL, where appends may commit out of position order, it
reads up to `Database.safe_position` only (see artstore.eventstore.postgres).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, Sequence

from sqlalchemy import func, select

from artstore.eventstore.blobs import read_blob_texts
from artstore.eventstore.database import Database
from artstore.eventstore.records import RecordedEvent, recorded_from_row
from artstore.eventstore.streams import events_of_streams, stream_heads
from artstore.names import check_name
from artstore.schema.tables import events

STREAMS_PER_QUERY = 500


class EventReader:
    """The reading half of the event store, over one database."""

    def __init__(self, database: Database) -> None:
        self.database = database
        self.recorder = database.recorder

    @property
    def dialect(self) -> str:
        return self.database.dialect

    async def read_stream(
        self, stream_id: str, from_version: int = 1, limit: int | None = None
    ) -> list[RecordedEvent]:
        """The events of one stream, from `from_version` on, in order."""
        check_name("stream_id", stream_id)
        query = (
            select(events)
            .where(events.c.stream_id == stream_id, events.c.version >= from_version)
            .order_by(events.c.version)
            .limit(limit)
        )
        async with self.database.read() as connection:
            return [recorded_from_row(row) for row in await connection.execute(query)]

    async def read_streams(self, stream_ids: Iterable[str]) -> dict[str, list[RecordedEvent]]:
        """The events of several streams at once, by stream."""
        ids = list(dict.fromkeys(stream_ids))
        for stream_id in ids:
            check_name("stream_id", stream_id)
        found: dict[str, list[RecordedEvent]] = {stream_id: [] for stream_id in ids}
        async with self.database.read() as connection:
            for start in range(0, len(ids), STREAMS_PER_QUERY):
                chunk = ids[start : start + STREAMS_PER_QUERY]
                query = events_of_streams(self.recorder, chunk, list(events.c))
                for row in await connection.execute(query):
                    found[row.stream_id].append(recorded_from_row(row))
        return found

    async def read_all(
        self, after: int = 0, limit: int = 1000, types: Sequence[str] | None = None
    ) -> list[RecordedEvent]:
        """One page of all events with a position greater than `after`, in position order."""
        query = select(events).where(events.c.position > after)
        if types:
            query = query.where(events.c.type.in_(types))
        query = query.order_by(events.c.position).limit(limit)
        async with self.database.read() as connection:
            safe = await self.database.safe_position(connection)
            if safe is not None:  # appends in flight below: read up to them only
                query = query.where(events.c.position <= safe)
            return [recorded_from_row(row) for row in await connection.execute(query)]

    async def iter_all(
        self, after: int = 0, page_size: int = 1000, types: Sequence[str] | None = None
    ) -> AsyncIterator[RecordedEvent]:
        """Every event after `after`, page by page, up to the last committed one."""
        while page := await self.read_all(after, page_size, types):
            for recorded in page:
                yield recorded
            after = page[-1].position

    async def stream_version(self, stream_id: str) -> int:
        async with self.database.read() as connection:
            heads = await connection.run_sync(stream_heads, {stream_id})
        return heads.get(stream_id, 0)

    async def last_position(self) -> int:
        """The position a reader catching up would reach now (see `read_all`)."""
        query = select(func.max(events.c.position))
        async with self.database.read() as connection:
            safe = await self.database.safe_position(connection)
            if safe is not None:
                query = query.where(events.c.position <= safe)
            return (await connection.execute(query)).scalar() or 0

    async def get_blobs(self, hashes: Iterable[str]) -> dict[str, str]:
        """Bodies of content-addressed blobs by hash (missing hashes are left out)."""
        wanted = list(hashes)
        async with self.database.read() as connection:
            return await connection.run_sync(read_blob_texts, wanted)
