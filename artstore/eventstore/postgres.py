"""artstore on PostgreSQL: many machines, one database.

One asyncpg pool for everything. Every appending transaction holds one advisory lock
(`EVENTS_APPEND_LOCK_KEY`) until it commits, taken here and by the position trigger of
the schema, so that global positions are handed out in commit order and a reader
catching up from a position never misses an event (PostgreSQL sequences alone are not
commit-ordered). Trainers hold a session-level advisory lock per model, which the server
releases when their connection dies.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any, TypeVar

from sqlalchemy import Table, func, select
from sqlalchemy.dialects import postgresql
from sqlalchemy.engine import URL, Connection
from sqlalchemy.ext.asyncio import AsyncConnection, create_async_engine
from sqlalchemy.sql.dml import Insert

from artstore.eventstore.blobs import serialize
from artstore.eventstore.database import Database, Writer
from artstore.schema.tables import EVENTS_APPEND_LOCK_KEY, events

# Key of the advisory lock that makes migrations wait for each other ("artstore" + 1).
MIGRATION_LOCK_KEY = 7021802808247546470
T = TypeVar("T")


class PostgresDatabase(Database):
    dialect = "postgresql"

    @classmethod
    def connect(cls, url: URL) -> PostgresDatabase:
        engine = create_async_engine(
            url,
            pool_size=8,
            max_overflow=8,
            json_serializer=serialize,
            connect_args={"timeout": 10},
        )
        return cls(url, engine, engine)

    def writer(self) -> PostgresWriter:
        return PostgresWriter(self)

    def insert_events(self, connection: Connection, rows: list[dict[str, Any]]) -> list[int]:
        statement = events.insert().returning(events.c.position, sort_by_parameter_order=True)
        return [row.position for row in connection.execute(statement, rows)]

    def insert_new(self, table: Table, key: list[str]) -> Insert:
        return postgresql.insert(table).on_conflict_do_nothing(index_elements=key)

    def lock_appends(self, connection: Connection) -> None:
        connection.execute(select(func.pg_advisory_xact_lock(EVENTS_APPEND_LOCK_KEY)))

    async def lock_migrations(self, connection: AsyncConnection) -> None:
        await connection.execute(select(func.pg_advisory_xact_lock(MIGRATION_LOCK_KEY)))

    @asynccontextmanager
    async def try_lock(self, name: str) -> AsyncIterator[bool]:
        key = lock_key(name)
        async with self.write_engine.connect() as connection:
            got = (await connection.execute(select(func.pg_try_advisory_lock(key)))).scalar()
            await connection.commit()
            if not got:
                yield False
                return
            try:
                yield True
            finally:
                try:
                    await connection.execute(select(func.pg_advisory_unlock(key)))
                    await connection.commit()
                except Exception:
                    # Never hand a connection that may still hold the lock back to the
                    # pool: closing it makes the server release the lock.
                    await connection.invalidate()

    async def confine_query(self, connection: AsyncConnection) -> None:
        await connection.exec_driver_sql("SET TRANSACTION READ ONLY")


def lock_key(name: str) -> int:
    """The advisory lock key (a positive bigint) for a lock's name."""
    digest = hashlib.sha256(name.encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1


class PostgresWriter(Writer):
    """Write transactions on a connection of the writer's own, kept for the store's life,
    each holding the append lock until it commits."""

    def __init__(self, database: PostgresDatabase) -> None:
        self.database = database
        self._connection: AsyncConnection | None = None

    async def transaction(self, work: Callable[[Connection], T]) -> T:
        def locked(connection: Connection) -> T:
            self.database.lock_appends(connection)
            return work(connection)

        if self._connection is None:
            self._connection = await self.database.write_engine.connect()
        return await self.database.run_write(
            lambda connection: connection.run_sync(locked), connection=self._connection
        )

    async def reset(self) -> None:
        if self._connection is not None:
            connection, self._connection = self._connection, None
            with contextlib.suppress(Exception):
                await connection.close()
