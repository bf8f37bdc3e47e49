"""artstore on SQLite: one machine, one file, several processes.

WAL, a busy timeout, `BEGIN IMMEDIATE` for writes and plain `BEGIN` for reads, so readers
never block the writer and a write never fails half-way for lack of the lock. One writer
at a time is SQLite's own rule, so global positions are commit-ordered without more.
The store's writer has a synchronous pysqlite engine of its own (one connection, used
from one thread) and runs each write transaction in one call; reads, migrations and
maintenance use aiosqlite.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import math
import os
import sqlite3
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import Table, event
from sqlalchemy.dialects import sqlite
from sqlalchemy.engine import URL, Connection, Engine, create_engine
from sqlalchemy.exc import OperationalError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine
from sqlalchemy.pool import StaticPool
from sqlalchemy.sql.dml import Insert

from artstore.errors import ArtstoreError
from artstore.eventstore.blobs import serialize
from artstore.eventstore.database import Database, Writer, translate_error
from artstore.schema.tables import events

SQLITE_BUSY_TIMEOUT_S = 60.0
T = TypeVar("T")


class SQLiteDatabase(Database):
    dialect = "sqlite"

    def __init__(
        self, url: URL, write_engine: AsyncEngine, read_engine: AsyncEngine, writer_engine: Engine
    ) -> None:
        super().__init__(url, write_engine, read_engine)
        # A synchronous engine for the store's writer thread, which runs each write
        # transaction in one call instead of a thread hop per statement (aiosqlite).
        self.writer_engine = writer_engine

    @classmethod
    def connect(cls, url: URL) -> SQLiteDatabase:
        write_engine = create_async_engine(
            url,
            pool_size=2,
            max_overflow=0,
            json_serializer=serialize,
            connect_args={"timeout": SQLITE_BUSY_TIMEOUT_S},
        )
        _configure(write_engine.sync_engine, begin="BEGIN IMMEDIATE")
        read_engine = create_async_engine(
            url,
            pool_size=4,
            max_overflow=0,
            json_serializer=serialize,
            connect_args={"timeout": SQLITE_BUSY_TIMEOUT_S},
        )
        _configure(read_engine.sync_engine, begin="BEGIN")
        writer_engine = create_engine(
            url.set(drivername="sqlite+pysqlite"),
            poolclass=StaticPool,  # one connection, used by the writer thread alone
            json_serializer=serialize,
            connect_args={"timeout": SQLITE_BUSY_TIMEOUT_S, "check_same_thread": False},
        )
        _configure(writer_engine, begin="BEGIN IMMEDIATE")
        return cls(url, write_engine, read_engine, writer_engine)

    @property
    def path(self) -> Path:
        return Path(self.url.database or "")

    @property
    def location(self) -> str:
        return str(self.path)

    async def run_write(
        self,
        work: Callable[[AsyncConnection], Awaitable[T]],
        connection: AsyncConnection | None = None,
    ) -> T:
        """Run `work` in one write transaction, retrying while another process holds the file."""
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
        """`run_write` for the writer thread: one transaction, retried while busy."""
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
        self.writer_engine.dispose()
        await super().dispose()

    def writer(self) -> SQLiteWriter:
        return SQLiteWriter(self)

    def insert_events(self, connection: Connection, rows: list[dict[str, Any]]) -> list[int]:
        # SQLAlchemy cannot batch an ordered RETURNING on SQLite (it sends one INSERT per
        # row): insert in batched statements, unordered, and match positions by event id
        # (unique in a successful insert). The one writer numbers rows in the order given;
        # checked, since SQLite does not promise it.
        statement = events.insert().returning(events.c.event_id, events.c.position)
        by_id = dict(connection.execute(statement, rows).all())
        positions = [by_id[row["event_id"]] for row in rows]
        if positions != sorted(set(positions)):
            raise ArtstoreError("SQLite numbered a batch of events out of order; nothing written")
        return positions

    def insert_new(self, table: Table, key: list[str]) -> Insert:
        return sqlite.insert(table).on_conflict_do_nothing(index_elements=key)

    def lock_appends(self, connection: Connection) -> None:
        pass  # a write transaction (BEGIN IMMEDIATE) already excludes every other writer

    async def lock_migrations(self, connection: AsyncConnection) -> None:
        pass  # likewise: the migration runs in a write transaction

    @asynccontextmanager
    async def try_lock(self, name: str) -> AsyncIterator[bool]:
        # An exclusive flock on a file beside the database: the kernel drops it when the
        # process dies, SIGKILL included.
        digest = hashlib.sha256(name.encode()).hexdigest()[:16]
        lock_path = self.path.with_name(f"{self.path.name}.lock-{digest}")
        handle = os.open(lock_path, os.O_CREAT | os.O_RDWR, 0o644)
        try:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                yield False
                return
            yield True
        finally:
            os.close(handle)  # closing releases the lock

    async def confine_query(self, connection: AsyncConnection) -> None:
        await connection.exec_driver_sql("PRAGMA query_only = ON")
        raw = await connection.get_raw_connection()
        await raw.driver_connection.set_authorizer(_query_authorizer)  # type: ignore[union-attr]


class SQLiteWriter(Writer):
    """Write transactions in a thread of their own, on one pysqlite connection (a thread
    hop per transaction, not per statement)."""

    def __init__(self, database: SQLiteDatabase) -> None:
        self.database = database
        self._connection: Connection | None = None
        self._thread: ThreadPoolExecutor | None = None

    async def transaction(self, work: Callable[[Connection], T]) -> T:
        return await self._in_thread(lambda: self.database.run_write_sync(self._connect(), work))

    async def refresh_statistics(self) -> None:
        # The planner needs statistics to plan the analysis views well (without them one
        # view took seconds on a 10,000-rollout run instead of milliseconds).
        if self._connection is None:
            return

        def analyze(connection: Connection) -> None:
            connection.exec_driver_sql("PRAGMA analysis_limit=1000")
            connection.exec_driver_sql("ANALYZE")

        with contextlib.suppress(Exception):  # statistics help; they must never cost a write
            await self.transaction(analyze)

    async def reset(self) -> None:
        if self._connection is not None:
            connection, self._connection = self._connection, None
            with contextlib.suppress(Exception):
                await self._in_thread(connection.close)

    async def close(self) -> None:
        await self.reset()
        if self._thread is not None:
            self._thread.shutdown(wait=True)
            self._thread = None

    def _connect(self) -> Connection:
        """The writer thread's connection (opened in that thread, on first use)."""
        if self._connection is None:
            self._connection = self.database.writer_engine.connect()
        return self._connection

    async def _in_thread(self, call: Callable[[], T]) -> T:
        if self._thread is None:
            self._thread = ThreadPoolExecutor(1, thread_name_prefix="artstore-sqlite-writer")
        return await asyncio.get_running_loop().run_in_executor(self._thread, call)


def is_busy(exc: BaseException) -> bool:
    message = str(exc).lower()
    return "database is locked" in message or "database is busy" in message


def _configure(engine: Engine, *, begin: str) -> None:
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


def _query_authorizer(action: int, arg1: str | None, *_: Any) -> int:
    """Refuse what `PRAGMA query_only` lets through: ATTACH, DETACH, query_only itself."""
    if action in (sqlite3.SQLITE_ATTACH, sqlite3.SQLITE_DETACH):
        return sqlite3.SQLITE_DENY
    if action == sqlite3.SQLITE_PRAGMA and (arg1 or "").lower() == "query_only":
        return sqlite3.SQLITE_DENY
    return sqlite3.SQLITE_OK
