"""Engines for one database, with each dialect's settings, and driver errors mapped to ours.

SQLite: WAL, a busy timeout, `BEGIN IMMEDIATE` for writes and plain `BEGIN` for reads, so
readers never block the writer and a write never fails half-way for lack of the lock. The
store's writer has a synchronous pysqlite engine of its own (one connection, used from
one thread); reads, migrations and maintenance use aiosqlite. PostgreSQL: one asyncpg
pool for everything.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TypeVar

from sqlalchemy import event, text
from sqlalchemy.engine import URL, Connection, Engine, create_engine
from sqlalchemy.exc import DBAPIError, IntegrityError, InterfaceError, OperationalError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine
from sqlalchemy.pool import StaticPool

from artstore.errors import (
    DatabaseUnavailableError,
    GroupAlreadyConsumedError,
    ImmutableEventError,
)
from artstore.eventstore.blobs import serialize
from artstore.urls import redact

SQLITE_BUSY_TIMEOUT_S = 60.0
T = TypeVar("T")


@dataclass
class Database:
    """The engines of one store. `dialect` is "sqlite" or "postgresql"."""

    url: URL
    dialect: str
    write_engine: AsyncEngine
    read_engine: AsyncEngine
    # SQLite only: a synchronous engine for the store's writer thread, which runs each
    # write transaction in one call instead of a thread hop per statement (aiosqlite).
    sqlite_writer_engine: Engine | None = None

    @property
    def display_url(self) -> str:
        return redact(self.url)

    @asynccontextmanager
    async def write(
        self, connection: AsyncConnection | None = None
    ) -> AsyncIterator[AsyncConnection]:
        """A write transaction (BEGIN IMMEDIATE on SQLite), on `connection` or a pooled one."""
        if connection is not None:
            async with connection.begin():
                yield connection
            return
        async with self.write_engine.begin() as pooled:
            yield pooled

    @asynccontextmanager
    async def read(self) -> AsyncIterator[AsyncConnection]:
        async with self.read_engine.connect() as connection:
            yield connection

    async def run_write(
        self,
        work: Callable[[AsyncConnection], Awaitable[T]],
        connection: AsyncConnection | None = None,
    ) -> T:
        """Run `work` in one write transaction, retrying when another process holds SQLite."""
        deadline = asyncio.get_running_loop().time() + SQLITE_BUSY_TIMEOUT_S
        delay = 0.005
        while True:
            try:
                async with self.write(connection) as active:
                    return await work(active)
            except OperationalError as exc:
                if not is_busy(exc) or asyncio.get_running_loop().time() > deadline:
                    raise translate_error(exc, self) from exc
                await asyncio.sleep(delay)
                delay = min(delay * 2, 0.25)

    def run_write_sync(self, connection: Connection, work: Callable[[Connection], T]) -> T:
        """`run_write` for the SQLite writer thread: one transaction, retried while busy."""
        deadline = time.monotonic() + SQLITE_BUSY_TIMEOUT_S
        delay = 0.005
        while True:
            try:
                with connection.begin():
                    return work(connection)
            except OperationalError as exc:
                if not is_busy(exc) or time.monotonic() > deadline:
                    raise translate_error(exc, self) from exc
                time.sleep(delay)
                delay = min(delay * 2, 0.25)

    async def dispose(self) -> None:
        if self.sqlite_writer_engine is not None:
            self.sqlite_writer_engine.dispose()
        await self.write_engine.dispose()
        if self.read_engine is not self.write_engine:
            await self.read_engine.dispose()


def is_busy(exc: BaseException) -> bool:
    message = str(exc).lower()
    return "database is locked" in message or "database is busy" in message


def translate_error(exc: BaseException, database: Database | None = None) -> Exception:
    """The artstore error for a driver error (callers never see the driver's)."""
    where = f" at {database.display_url}" if database else ""
    message = (str(getattr(exc, "orig", None) or exc).strip().splitlines() or [""])[0]
    if "immutable" in message:
        return ImmutableEventError(message.removeprefix("artstore: "))
    if isinstance(exc, IntegrityError) and "group_consumptions" in message:
        return GroupAlreadyConsumedError(
            "a group in this train step was already trained into this model; "
            f"nothing was written ({message})"
        )
    if isinstance(exc, IntegrityError):
        return exc  # callers decide what other constraint violations mean
    if isinstance(exc, (OperationalError, InterfaceError, OSError, ConnectionError)) or (
        isinstance(exc, DBAPIError) and exc.connection_invalidated
    ):
        return DatabaseUnavailableError(f"cannot use the database{where}: {message}")
    return exc


def connect(url: URL) -> Database:
    """Engines for `url` (an async URL from `artstore.urls.resolve_url`)."""
    dialect = url.get_backend_name()
    if dialect == "sqlite":
        write_engine = create_async_engine(
            url,
            pool_size=2,
            max_overflow=0,
            json_serializer=serialize,
            connect_args={"timeout": SQLITE_BUSY_TIMEOUT_S},
        )
        _configure_sqlite(write_engine.sync_engine, begin="BEGIN IMMEDIATE")
        read_engine = create_async_engine(
            url,
            pool_size=4,
            max_overflow=0,
            json_serializer=serialize,
            connect_args={"timeout": SQLITE_BUSY_TIMEOUT_S},
        )
        _configure_sqlite(read_engine.sync_engine, begin="BEGIN")
        writer = create_engine(
            url.set(drivername="sqlite+pysqlite"),
            poolclass=StaticPool,  # one connection, used by the writer thread alone
            json_serializer=serialize,
            connect_args={"timeout": SQLITE_BUSY_TIMEOUT_S, "check_same_thread": False},
        )
        _configure_sqlite(writer, begin="BEGIN IMMEDIATE")
        return Database(url, dialect, write_engine, read_engine, writer)
    engine = create_async_engine(
        url,
        pool_size=8,
        max_overflow=8,
        json_serializer=serialize,
        connect_args={"timeout": 10},
    )
    return Database(url, dialect, engine, engine)


def _configure_sqlite(engine: Engine, *, begin: str) -> None:
    @event.listens_for(engine, "connect")
    def configure(dbapi_connection, _record) -> None:
        # Take transaction control from the sqlite3 module so that our BEGIN is the one used.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        # NORMAL in WAL mode survives a process crash (SIGKILL); only power loss may
        # lose the last transactions.
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute(f"PRAGMA busy_timeout={int(SQLITE_BUSY_TIMEOUT_S * 1000)}")
        _ensure_sqrt(dbapi_connection, cursor)
        cursor.close()

    @event.listens_for(engine, "begin")
    def begin_transaction(connection) -> None:
        connection.exec_driver_sql(begin)


def _ensure_sqrt(dbapi_connection, cursor) -> None:
    """The SQL views use `sqrt`: SQLite has it only when built with its math functions."""
    try:
        cursor.execute("SELECT sqrt(4.0)")
    except Exception:  # sqlite3.OperationalError: no such function, through the adapter
        dbapi_connection.create_function("sqrt", 1, _sqrt, deterministic=True)


def _sqrt(value: float | None) -> float | None:
    # As SQLite's own: NULL for NULL, a negative number or something not a number.
    if not isinstance(value, int | float) or value < 0:
        return None
    return math.sqrt(value)


async def check_reachable(database: Database) -> None:
    try:
        async with database.read() as connection:
            await connection.execute(text("SELECT 1"))
    except Exception as exc:  # any driver or socket error means the same to the user
        raise DatabaseUnavailableError(
            f"cannot reach the database at {database.display_url}: "
            f"{str(getattr(exc, 'orig', None) or exc).strip() or type(exc).__name__}"
        ) from None
