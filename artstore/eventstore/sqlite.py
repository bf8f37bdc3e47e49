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
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import quote

from sqlalchemy import Table, TextClause, event, func, select, text
from sqlalchemy.dialects import sqlite
from sqlalchemy.engine import URL, Connection, Engine, create_engine
from sqlalchemy.exc import DBAPIError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine
from sqlalchemy.pool import StaticPool
from sqlalchemy.sql import Insert, Select

from artstore.errors import DatabaseUnavailableError, NotFoundError, QueryRefusedError
from artstore.eventstore.blobs import serialize
from artstore.eventstore.database import (
    USER_QUERY_ROW_BYTES,
    Database,
    ResultColumn,
    SQLSyntax,
    WriteBatch,
    Writer,
    translate_error,
)
from artstore.eventstore.recorder import ErrorKind, causes
from artstore.schema.tables import events

# How long SQLite itself waits for another process's write lock before it says "busy";
# a write then tries again, for as long as it takes: the lock's holder is a live process
# at work (the kernel releases a dead one's locks), so a slow one makes us slow, never
# failed.
SQLITE_BUSY_TIMEOUT_S = 60.0
# A write transaction of at most this many events runs on the event loop's thread when
# the file's write lock is free at once: a hop to the writer thread and back costs more
# than writing a few events. Bigger ones, and any that would wait, run in the thread.
INLINE_MAX_EVENTS = 500
# Threads (and synchronous connections) for reads of several statements (`run_read`).
READERS = 4
T = TypeVar("T")


class SQLiteRecorder:
    """The recorder (artstore.eventstore.recorder) of SQLite: one writer at a time holds
    the file's write lock (`BEGIN IMMEDIATE`), so positions are commit-ordered, keys need
    no lock of their own, and an IN list of stream ids is always read through the index."""

    def insert_events(
        self, connection: Connection, rows: list[dict[str, Any]], *, side_by_side: bool = False
    ) -> list[int]:
        # One writer at a time is the file's own rule: `side_by_side` changes nothing.
        # The writer holds the file's write lock (BEGIN IMMEDIATE), so it numbers the rows
        # itself, after the highest position ever handed out, in the order given: one
        # plain executemany on the driver's connection, without RETURNING (SQLAlchemy
        # would send it row by row) and without SQLAlchemy's statement machinery, which
        # cost more than SQLite's work for a single event. The payloads are the JSON texts the
        # append encoded (`payload_json`), stored as they are.
        # A client that leaves the position to SQLite gets the highest rowid plus one:
        # after ours. The table has no AUTOINCREMENT (migration 0011: one page less per
        # commit): it only kept a position from being handed out again after the highest
        # event was deleted, which the triggers refuse, and positions of a transaction
        # that rolled back were never seen by a reader.
        values = []
        last_time, stamp = None, ""
        for row in rows:
            if row["recorded_at"] is not last_time:  # an append's events share one time
                last_time = row["recorded_at"]
                stamp = sqlite_timestamp(last_time)
            values.append(
                (row["event_id"], row["stream_id"], row["version"], row["type"], row["data"], stamp)
            )
        if len(values) == 1:  # numbered by the INSERT itself: one statement less
            return [_on_driver(connection, _INSERT_NEXT_EVENT, values[0]).lastrowid]
        (last,) = _on_driver(connection, _LAST_POSITION).fetchone()
        numbered = [(last + offset, *value) for offset, value in enumerate(values, start=1)]
        _on_driver(connection, _INSERT_EVENTS, numbered, many=True)
        return list(range(last + 1, last + 1 + len(rows)))

    def insert_missing(self, connection: Connection, table: Table, key: str, rows: list[dict]):
        # Not ON CONFLICT DO NOTHING: the schema refuses any insert over a stored blob or
        # event (that is how it refuses REPLACE), so leave out what is stored. The writer
        # holds the database's write lock: nothing is stored meanwhile.
        if not rows:
            return
        names = list(rows[0])
        plain = _plain_columns(connection, table, tuple(names))
        if plain and all(len(row) == len(names) for row in rows):
            # On the driver's connection, as the events' INSERT: SQLAlchemy's statement
            # machinery (a SELECT and an INSERT built, compiled and bound) cost more than
            # SQLite's work for the few blobs of one call (~0.4 ms of a ~1.3 ms commit).
            _insert_missing_on_driver(connection, table.name, key, names, rows)
            return
        column = table.c[key]
        wanted = [row[key] for row in rows]
        stored: set[Any] = set()
        for start in range(0, len(wanted), 500):
            chunk = wanted[start : start + 500]
            stored.update(connection.execute(select(column).where(column.in_(chunk))).scalars())
        missing = [row for row in rows if row[key] not in stored]
        if missing:
            connection.execute(table.insert(), missing)

    def select_heads(self, stream_ids: Sequence[str]) -> Select:
        return (
            select(events.c.stream_id, func.max(events.c.version))
            .where(events.c.stream_id.in_(stream_ids))
            .group_by(events.c.stream_id)
        )

    def select_streams(
        self, stream_ids: Sequence[str], columns: Sequence[Any], event_type: str | None = None
    ) -> Select:
        query = select(*columns).where(events.c.stream_id.in_(stream_ids))
        if event_type is not None:
            query = query.where(events.c.type == event_type)
        return query.order_by(events.c.stream_id, events.c.version)

    def insert(self, table: Table) -> Insert:
        return sqlite.insert(table)

    def lock_keys(self, connection: Connection, namespace: int, keys: Sequence[int]) -> None:
        pass  # a write transaction (BEGIN IMMEDIATE) already excludes every other writer

    def lock_appends(self, connection: Connection) -> None:
        pass  # likewise

    def lock_for_removal(self, connection: Connection) -> None:
        pass  # likewise: the transaction holds the file's one write lock

    def error_kind(self, exc: BaseException) -> ErrorKind | None:
        for cause in causes(exc):
            code = getattr(cause, "sqlite_errorcode", None)
            if code is not None:
                return (
                    _ERROR_KINDS.get(code)
                    or _ERROR_KINDS.get(code & 0xFF)
                    or (_unique_key_kind(str(cause)) if code in _UNIQUE_CODES else None)
                )
        return None


# SQLite's result codes (sqlite3 has their names from Python 3.11 on): an extended code
# first, then its primary code (the low byte).
_ERROR_KINDS = {
    sqlite3.SQLITE_BUSY: ErrorKind.BUSY,  # and BUSY_RECOVERY, BUSY_SNAPSHOT, BUSY_TIMEOUT
    sqlite3.SQLITE_LOCKED: ErrorKind.BUSY,
    sqlite3.SQLITE_FULL: ErrorKind.DISK_FULL,
    # Only the schema's triggers raise (RAISE(ABORT)): they refuse changing stored rows.
    sqlite3.SQLITE_CONSTRAINT_TRIGGER: ErrorKind.IMMUTABLE,
}
_UNIQUE_CODES = (sqlite3.SQLITE_CONSTRAINT_UNIQUE, sqlite3.SQLITE_CONSTRAINT_PRIMARYKEY)
# SQLite names a unique key by its columns ("UNIQUE constraint failed: events.stream_id,
# events.version"): the one way it says which key refused a row.
_UNIQUE_KEYS = {
    "events.stream_id, events.version": ErrorKind.VERSION_TAKEN,
    "events.event_id": ErrorKind.EVENT_ID_TAKEN,
    "group_consumptions.group_id, group_consumptions.model": ErrorKind.GROUP_CONSUMED,
}


def _unique_key_kind(message: str) -> ErrorKind | None:
    _, _, columns = message.partition("constraint failed: ")
    return _UNIQUE_KEYS.get(columns.strip())


RECORDER = SQLiteRecorder()


class SQLiteDatabase(Database):
    dialect = "sqlite"
    recorder = RECORDER
    # A `--` comment ends at a line feed; /* */ comments do not nest.
    sql_syntax = SQLSyntax("sqlite", " \t\n\f\r", "\n", nested_comments=False)

    def __init__(
        self,
        url: URL,
        write_engine: AsyncEngine,
        read_engine: AsyncEngine,
        writer_engine: Engine | None,
        *,
        read_only: bool = False,
    ) -> None:
        super().__init__(url, write_engine, read_engine, read_only=read_only)
        # A synchronous engine for the store's writer thread, which runs each write
        # transaction in one call instead of a thread hop per statement (aiosqlite).
        self.writer_engine = writer_engine
        # Connections for user queries (analysis.sql), opened read-only on first use.
        self._query_engine: AsyncEngine | None = None
        # Reads of several statements (`run_read`): synchronous connections used in a
        # thread of their own, one hop per read instead of four per statement.
        self._reader_engine: Engine | None = None
        self._readers: ThreadPoolExecutor | None = None
        # One connection for lookups on the event loop's thread (`run_lookup`).
        self._lookup_engine: Engine | None = None

    @classmethod
    def connect(cls, url: URL, *, read_only: bool = False) -> SQLiteDatabase:
        if read_only:
            cls.check_exists(url)
            engine = _read_only_engine(url)
            return cls(url, engine, engine, None, read_only=True)
        write_engine = _pooled_engine(url, pool_size=2, begin="BEGIN IMMEDIATE")
        read_engine = _pooled_engine(url, pool_size=4, begin="BEGIN")
        writer_engine = create_engine(
            url.set(drivername="sqlite+pysqlite"),
            poolclass=StaticPool,  # one connection, used by the writer thread alone
            json_serializer=serialize,
            connect_args={"timeout": SQLITE_BUSY_TIMEOUT_S, "check_same_thread": False},
        )
        _configure(writer_engine, begin="BEGIN IMMEDIATE", on_driver=True)
        return cls(url, write_engine, read_engine, writer_engine)

    @classmethod
    def check_exists(cls, url: URL) -> None:
        path = Path(url.database or "")
        if not path.is_file():
            folder = " (it is a folder)" if path.is_dir() else ""
            raise NotFoundError(f"no artstore database at {path}{folder}")

    @property
    def path(self) -> Path:
        return Path(self.url.database or "")

    async def check_reachable(self) -> None:
        # The file is opened here first, as SQLite will open it: what the system refuses
        # (a read-only file system, a folder under /proc, permissions) is said in its
        # words, instead of SQLite's "unable to open database file", and no aiosqlite
        # connection fails (its thread then outlives the command and prints a traceback).
        problem = _cannot_open(self.path, write=not self.read_only)
        if problem is not None:
            raise DatabaseUnavailableError(f"cannot {problem}")
        await super().check_reachable()

    @property
    def location(self) -> str:
        return str(self.path)

    async def run_write(
        self,
        work: Callable[[AsyncConnection], Awaitable[T]],
        connection: AsyncConnection | None = None,
    ) -> T:
        """Run `work` in one write transaction, retrying while another process holds the file."""
        delay = 0.005
        while True:
            try:
                async with self.write(connection) as active:
                    return await work(active)
            except PoolTimeout as exc:
                raise self.connection_error(exc, self.write_engine) from exc
            except OperationalError as exc:
                if not is_busy(exc):
                    raise translate_error(exc, self) from exc
                await asyncio.sleep(delay)
                delay = min(delay * 2, 0.25)

    async def run_read(self, work: Callable[[Connection], T]) -> T:
        if self.read_only:  # its file is opened read-only, through the read engine only
            return await super().run_read(work)
        if self._reader_engine is None or self._readers is None:
            self._reader_engine = create_engine(
                self.url.set(drivername="sqlite+pysqlite"),
                pool_size=READERS,
                max_overflow=0,
                pool_timeout=None,  # as `_pooled_engine`
                json_serializer=serialize,
                connect_args={"timeout": SQLITE_BUSY_TIMEOUT_S, "check_same_thread": False},
            )
            _configure(self._reader_engine, begin="BEGIN")
            self._readers = ThreadPoolExecutor(READERS, thread_name_prefix="artstore-sqlite-read")
        engine = self._reader_engine

        def read() -> T:
            with engine.connect() as connection:
                return work(connection)

        try:
            return await asyncio.get_running_loop().run_in_executor(self._readers, read)
        except OperationalError as exc:
            raise translate_error(exc, self) from exc

    async def run_lookup(self, work: Callable[[Connection], T]) -> T:
        # A lookup (one indexed statement or two) costs less than the hop to a reader
        # thread and back, so it runs on the event loop's thread when the file can be
        # read at once, as a small write does: readers of a WAL file wait for no writer,
        # and with no busy timeout a read that would wait (another process recovering
        # the file) gives up at once and runs in a reader thread instead. A lookup only
        # reads, so running it again there is harmless.
        if not self.read_only:
            engine = self._lookup_engine or self._open_lookup_engine()
            try:
                with engine.connect() as connection:
                    return work(connection)
            except OperationalError as exc:
                if not is_busy(exc):
                    raise translate_error(exc, self) from exc
        return await self.run_read(work)

    def _open_lookup_engine(self) -> Engine:
        self._lookup_engine = create_engine(
            self.url.set(drivername="sqlite+pysqlite"),
            poolclass=StaticPool,  # one connection, used by the event loop's thread alone
            json_serializer=serialize,
            connect_args={"timeout": 0, "check_same_thread": False},
        )
        _configure(self._lookup_engine, begin="BEGIN", busy_timeout_s=0)
        return self._lookup_engine

    async def dispose(self) -> None:
        if self._lookup_engine is not None:
            self._lookup_engine.dispose()
        if self._readers is not None:
            self._readers.shutdown(wait=True)
            self._readers = None
        if self._reader_engine is not None:
            self._reader_engine.dispose()
        if self.writer_engine is not None:
            self.writer_engine.dispose()
        if self._query_engine is not None:
            await self._query_engine.dispose()
        await super().dispose()

    def writer(self) -> SQLiteWriter:
        self.refuse_writes()
        return SQLiteWriter(self)

    async def lock_migrations(self, connection: AsyncConnection) -> None:
        pass  # a write transaction (BEGIN IMMEDIATE) already excludes every other writer

    def _lock_path(self, name: str) -> Path:
        digest = hashlib.sha256(name.encode()).hexdigest()[:16]
        return self.path.with_name(f"{self.path.name}.lock-{digest}")

    @asynccontextmanager
    async def try_lock(self, name: str) -> AsyncIterator[bool]:
        # An exclusive flock on a file beside the database: the kernel drops it when the
        # process dies, SIGKILL included.
        handle = os.open(self._lock_path(name), os.O_CREAT | os.O_RDWR, 0o644)
        try:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                yield False
                return
            yield True
        finally:
            os.close(handle)  # closing releases the lock

    async def lock_held(self, name: str) -> bool | None:
        # Linux lists every flock in /proc/locks by device and inode ("fe:00:2147282"):
        # reading it takes no lock. Elsewhere (or on a file system that reports other
        # device numbers) the answer is None or a lock not seen.
        try:
            found = os.stat(self._lock_path(name))
        except FileNotFoundError:
            return False  # never locked here
        try:
            listed = Path("/proc/locks").read_text()
        except OSError:
            return None
        where = f"{os.major(found.st_dev):02x}:{os.minor(found.st_dev):02x}:{found.st_ino}"
        return any(
            fields[1] == "FLOCK" and fields[5] == where
            for fields in (line.split() for line in listed.splitlines())
            if len(fields) > 5
        )

    @asynccontextmanager
    async def query_session(self, timeout: float | None) -> AsyncIterator[AsyncConnection]:
        # The file opened read-only (mode=ro), whatever this store was opened for, on
        # connections kept for user queries alone: each carries its authorizer, progress
        # handler and length limit for its life, so a query does not pay for arming one.
        if self._query_engine is None:
            self._query_engine = _read_only_engine(self.url, for_user_queries=True)
        connection = await self.open_connection(self._query_engine)
        clean = False
        try:
            tables = await connection.exec_driver_sql(
                "SELECT name FROM sqlite_master WHERE type = 'table'"
            )  # (this also begins the transaction)
            names = {name.lower() for (name,) in tables}
            guard: _QueryGuard | None = connection.info.get("query_guard")
            if guard is None:
                raw = (await connection.get_raw_connection()).driver_connection
                guard = _QueryGuard(names)
                await raw.set_authorizer(guard.authorizer)  # type: ignore[union-attr]
                await raw.set_progress_handler(  # type: ignore[union-attr]
                    guard.clock.expired, PROGRESS_INSTRUCTIONS
                )
                connection.info["query_guard"] = guard
            guard.authorizer.new_query(names)  # a migration may have added tables
            guard.clock.start(timeout)
            connection.info["stop_query"] = guard.clock.stop
            yield connection
            clean = True
        finally:
            if clean:
                await connection.close()  # back to the pool; the pool rolls back
            else:
                await connection.invalidate()  # after an error, a fresh connection next time

    async def describe_query(
        self, connection: AsyncConnection, statement: str
    ) -> list[ResultColumn] | None:
        try:
            # Compiled, not run: SQLite stops a LIMIT 0 before its first row.
            result = await connection.execute(_text(f"SELECT * FROM (\n{statement}\n) LIMIT 0"))
        except DBAPIError as as_a_query:
            # The statement alone: the database's own error for it (a write the authorizer
            # refuses, two statements, a typo), else it is no query (BEGIN, say).
            await connection.execute(_text(f"EXPLAIN {statement}"))
            raise QueryRefusedError(
                "refused: artstore sql runs one query (SELECT, WITH, VALUES or EXPLAIN), and "
                f"the database does not take this statement as one ({_first_line(as_a_query)})"
            ) from None
        names = list(result.keys())
        result.close()
        # Every value's size as text, whatever its type (SQLite's types are the values').
        size = "coalesce(length(CAST({column} AS BLOB)), 0)"
        return [ResultColumn(name, size) for name in names] or None


def _text(statement: str) -> TextClause:
    """`statement` as SQLAlchemy text, `:name` in it not taken for a parameter."""
    return text(statement.replace(":", "\\:"))


def _first_line(exc: BaseException) -> str:
    said = str(getattr(exc, "orig", None) or exc).strip()
    return said.splitlines()[0] if said else type(exc).__name__


class SQLiteWriter(Writer):
    """Write transactions in a thread of their own, on one pysqlite connection (a thread
    hop per transaction, not per statement)."""

    def __init__(self, database: SQLiteDatabase) -> None:
        self.database = database
        self._connection: Connection | None = None
        self._thread: ThreadPoolExecutor | None = None
        self._busy_timeout_s = SQLITE_BUSY_TIMEOUT_S  # as the connection is opened

    commits_inline = True

    def commit_now(self, batch: WriteBatch) -> bool:
        # A small transaction runs on the event loop's thread when the file's write lock
        # is free at once: a hop to the writer thread and back costs more than writing a
        # few events. Bigger ones, and any that would wait, run in the thread.
        if not 0 < batch.events <= INLINE_MAX_EVENTS:
            return False
        connection = self._connect()
        self._busy_timeout(connection, 0)  # never block the event loop on another process
        try:
            self._committing(batch)(connection)
            return True
        except OperationalError as exc:
            if is_busy(exc) and not _in_transaction(connection):
                return False  # another process writes: wait for it in the thread
            raise translate_error(exc, self.database) from exc

    async def commit(self, batch: WriteBatch) -> None:
        if not self.commit_now(batch):
            await self._in_thread(lambda: self._waiting(self._committing(batch)))

    async def transaction(self, work: Callable[[Connection], T]) -> T:
        return await self._in_thread(lambda: self._waiting(partial(_one_transaction, work=work)))

    def _committing(self, batch: WriteBatch) -> Callable[[Connection], None]:
        """What commits `batch`. A batch of nothing but event rows is BEGIN IMMEDIATE, the
        position query, one INSERT and COMMIT, sent to the driver as they are:
        SQLAlchemy's transaction bookkeeping (its begin and commit events) cost more than
        SQLite's work for a single event. Any other batch is its transaction."""
        rows, inserted = batch.rows, batch.inserted
        if rows is None or inserted is None:
            return partial(_one_transaction, work=batch.write)
        return lambda connection: inserted(self._insert_committed(connection, rows))

    def _insert_committed(self, connection: Connection, rows: list[dict[str, Any]]) -> list[int]:
        """One write transaction on the driver's connection: the rows, numbered, committed.

        SQLAlchemy's connection is between transactions here and is left so: whatever
        fails, the driver's transaction is rolled back before the error goes up."""
        if len(rows) == 1 and not _in_transaction(connection):
            # One INSERT that numbers its row is a transaction by itself (the driver is
            # in autocommit): SQLite takes the write lock when the statement starts,
            # before it reads the highest position. BEGIN and COMMIT of their own cost
            # ~10 us of CPU per event.
            return RECORDER.insert_events(connection, rows)
        _on_driver(connection, "BEGIN IMMEDIATE")
        try:
            positions = RECORDER.insert_events(connection, rows)
            _on_driver(connection, "COMMIT")
        except BaseException:
            if _in_transaction(connection):
                with contextlib.suppress(Exception):
                    _on_driver(connection, "ROLLBACK")
            raise
        return positions

    def _waiting(self, step: Callable[[Connection], T]) -> T:
        """Run `step` (a whole transaction) in the writer thread, again and again while
        another process holds the file's write lock."""
        connection = self._connect()
        self._busy_timeout(connection, SQLITE_BUSY_TIMEOUT_S)
        delay = 0.005
        while True:
            try:
                return step(connection)
            except OperationalError as exc:
                if not is_busy(exc):
                    raise translate_error(exc, self.database) from exc
                time.sleep(delay)
                delay = min(delay * 2, 0.25)

    def _busy_timeout(self, connection: Connection, seconds: float) -> None:
        if self._busy_timeout_s != seconds:
            # On the driver's connection: through SQLAlchemy it would begin a transaction.
            raw = connection.connection.dbapi_connection
            raw.execute(f"PRAGMA busy_timeout={int(seconds * 1000)}")  # type: ignore[union-attr]
            self._busy_timeout_s = seconds

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
            self._busy_timeout_s = SQLITE_BUSY_TIMEOUT_S
        return self._connection

    async def _in_thread(self, call: Callable[[], T]) -> T:
        if self._thread is None:
            self._thread = ThreadPoolExecutor(1, thread_name_prefix="artstore-sqlite-writer")
        return await asyncio.get_running_loop().run_in_executor(self._thread, call)


def _pooled_engine(url: URL, *, pool_size: int, begin: str) -> AsyncEngine:
    """An aiosqlite engine whose transactions start with `begin`."""
    engine = create_async_engine(
        url,
        pool_size=pool_size,
        max_overflow=0,
        # A connection is waited for as long as this process's other work holds them all
        # (SQLAlchemy's default gives up after 30 s, which a loaded machine reached).
        pool_timeout=None,
        json_serializer=serialize,
        connect_args={"timeout": SQLITE_BUSY_TIMEOUT_S},
    )
    _configure(engine.sync_engine, begin=begin)
    return engine


# The highest position ever handed out: a stored event's, or the counter migration 0011
# keeps in `sqlite_sequence` for a store whose highest events were deleted by hand.
_LAST_POSITION = (
    "SELECT max(coalesce((SELECT max(position) FROM events), 0), "
    "coalesce((SELECT seq FROM sqlite_sequence WHERE name = 'events'), 0))"
)
_INSERT_EVENTS = (
    "INSERT INTO events (position, event_id, stream_id, version, type, data, recorded_at) "
    "VALUES (?, ?, ?, ?, ?, ?, ?)"
)
_INSERT_NEXT_EVENT = (
    "INSERT INTO events (position, event_id, stream_id, version, type, data, recorded_at) "
    f"VALUES (({_LAST_POSITION}) + 1, ?, ?, ?, ?, ?, ?)"
)


def _one_transaction(connection: Connection, work: Callable[[Connection], T]) -> T:
    with connection.begin():
        return work(connection)


def _plain_columns(connection: Connection, table: Table, names: tuple[str, ...]) -> bool:
    """Whether these columns of `table` bind their values as they are (text and integers:
    no bind processor), so that the driver may be given the rows themselves."""
    found = _PLAIN.get((table.name, names))
    if found is None:
        columns = [table.columns.get(name) for name in names]
        found = all(
            c is not None and c.type.bind_processor(connection.dialect) is None for c in columns
        )
        _PLAIN[table.name, names] = found
    return found


_PLAIN: dict[tuple[str, tuple[str, ...]], bool] = {}


def _insert_missing_on_driver(
    connection: Connection, table: str, key: str, names: list[str], rows: list[dict]
) -> None:
    """The rows whose `key` is not stored yet, inserted with one executemany."""
    stored: set[Any] = set()
    wanted = [row[key] for row in rows]
    for start in range(0, len(wanted), 500):
        chunk = wanted[start : start + 500]
        marks = ", ".join("?" * len(chunk))
        found = _on_driver(connection, f"SELECT {key} FROM {table} WHERE {key} IN ({marks})", chunk)
        stored.update(value for (value,) in found.fetchall())
    missing = [tuple(row[name] for name in names) for row in rows if row[key] not in stored]
    if missing:
        columns, marks = ", ".join(names), ", ".join("?" * len(names))
        statement = f"INSERT INTO {table} ({columns}) VALUES ({marks})"
        _on_driver(connection, statement, missing, many=True)


def _in_transaction(connection: Connection) -> bool:
    """Whether the driver's connection is inside a transaction (SQLite may have ended it)."""
    return bool(connection.connection.dbapi_connection.in_transaction)  # type: ignore[union-attr]


def _on_driver(
    connection: Connection, statement: str, parameters: Any = (), *, many: bool = False
) -> sqlite3.Cursor:
    """`statement` on the driver's own connection, in the transaction SQLAlchemy began.

    A driver error comes out as SQLAlchemy's (IntegrityError, OperationalError, ...), as
    it would through the engine: the store tells a refused append from a lost connection
    by those classes.
    """
    raw = connection.connection.dbapi_connection
    try:
        if many:
            return raw.executemany(statement, parameters)  # type: ignore[union-attr]
        return raw.execute(statement, parameters)  # type: ignore[union-attr]
    except sqlite3.Error as exc:
        raise DBAPIError.instance(statement, None, exc, sqlite3.Error) from exc


def _cannot_open(path: Path, *, write: bool) -> str | None:
    """What the system says to opening the file at `path` as SQLite does (for writing,
    made when missing, as SQLite makes it: an empty file is an empty database); None
    when it opens."""
    try:
        if write:
            os.close(os.open(path, os.O_RDWR | os.O_CREAT, 0o644))
        else:
            os.close(os.open(path, os.O_RDONLY))
    except OSError as exc:
        doing = "open" if path.exists() else "create"
        how = " for writing" if write and doing == "open" else ""
        return f"{doing} the database at {path}{how}: {exc.strerror or exc}"
    return None


def sqlite_timestamp(value: datetime) -> str:
    """A `Timestamp` as SQLAlchemy's SQLite dialect stores it (in UTC, without the zone,
    always with microseconds), at a fraction of the cost of its bind processors."""
    if value.tzinfo is UTC:  # the store's own times: no conversion needed
        value = value.replace(tzinfo=None)
    elif value.tzinfo is not None:
        value = value.astimezone(UTC).replace(tzinfo=None)
    return value.isoformat(" ", "microseconds")


def is_busy(exc: BaseException) -> bool:
    """Whether another process holds the file's write lock (SQLITE_BUSY, SQLITE_LOCKED)."""
    return RECORDER.error_kind(exc) is ErrorKind.BUSY


def _read_only_engine(url: URL, *, for_user_queries: bool = False) -> AsyncEngine:
    """An engine that opens the file read-only: nothing is created, nothing waits.

    On read-only media a WAL database opens only if its -shm file is there or can be
    made; when neither is possible nobody can be writing it: open it as immutable.
    `for_user_queries`: its connections make no value longer than USER_QUERY_ROW_BYTES.
    """
    path = Path(url.database or "")
    parameters = {"mode": "ro"}
    shm = path.with_name(path.name + "-shm")
    if not os.access(path.parent, os.W_OK) and not shm.exists():
        parameters["immutable"] = "1"
    uri = URL.create(
        "sqlite+aiosqlite",
        database=f"file:{quote(str(path.absolute()))}",
        query={**parameters, "uri": "true"},
    )
    engine = create_async_engine(
        uri,
        pool_size=4,
        max_overflow=0,
        pool_timeout=None,  # as `_pooled_engine`
        json_serializer=serialize,
        connect_args={
            "timeout": SQLITE_BUSY_TIMEOUT_S,
            **({"factory": _UserQueryConnection} if for_user_queries else {}),
        },
    )
    _configure(engine.sync_engine, begin="BEGIN", read_only=True)
    return engine


class _UserQueryConnection(sqlite3.Connection):
    """A connection that makes no string or blob longer than USER_QUERY_ROW_BYTES:
    `zeroblob(300e6)` or `printf('%.*c', 3e8, 'x')` fail inside SQLite ("string or blob
    too big") before anything is made, where checking the result would come too late.
    Set where the connection is opened (aiosqlite's thread, which alone may use it)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, USER_QUERY_ROW_BYTES)


# SQLite calls the progress handler every this many virtual machine instructions: often
# enough to stop a query within milliseconds of its deadline, rarely enough that the call
# into Python costs nothing measurable (every 1,000 cost a query ~10% of its time).
PROGRESS_INSTRUCTIONS = 20_000


class _Clock:
    """Stops a query (SQLite's progress handler) `timeout` seconds after it started, or
    at once when told to (`stop`): one deadline for the whole query, rows handed over or
    not, as PostgreSQL's statement timeout is, with the session's own deadline above it."""

    def __init__(self) -> None:
        self.deadline = math.inf

    def start(self, timeout: float | None) -> None:
        self.deadline = math.inf if not timeout else time.monotonic() + timeout

    def stop(self) -> None:
        self.deadline = -math.inf

    def expired(self) -> int:
        return int(time.monotonic() > self.deadline)


class _QueryGuard:
    """What a connection for user queries carries: its authorizer and its clock."""

    def __init__(self, tables: set[str]) -> None:
        self.authorizer = _QueryAuthorizer(tables)
        self.clock = _Clock()


def _configure(
    engine: Engine,
    *,
    begin: str,
    read_only: bool = False,
    on_driver: bool = False,
    busy_timeout_s: float = SQLITE_BUSY_TIMEOUT_S,
) -> None:
    @event.listens_for(engine, "connect")
    def configure(dbapi_connection, _record) -> None:
        # Take transaction control from the sqlite3 module so that our BEGIN is the one used.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        if read_only:  # changing the journal mode writes the file: leave it as it is
            cursor.execute("PRAGMA query_only = ON")
            cursor.execute(f"PRAGMA busy_timeout={int(SQLITE_BUSY_TIMEOUT_S * 1000)}")
            _ensure_sqrt(dbapi_connection, cursor)
            cursor.close()
            return
        cursor.execute("PRAGMA journal_mode=WAL")
        # NORMAL in WAL mode survives a process crash (SIGKILL); only power loss may
        # lose the last transactions.
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute(f"PRAGMA busy_timeout={int(busy_timeout_s * 1000)}")
        _ensure_sqrt(dbapi_connection, cursor)
        cursor.close()

    @event.listens_for(engine, "begin")
    def begin_transaction(connection) -> None:
        if on_driver:  # pysqlite (the writer's engine): straight to the driver, as cheap as it gets
            _on_driver(connection, begin)
        else:
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


# What a user query may do: read (the views only), call functions, recurse; nothing else
# (no PRAGMA, ATTACH, DETACH, nor any statement that writes).
_QUERY_ACTIONS = {
    sqlite3.SQLITE_SELECT,
    sqlite3.SQLITE_READ,
    sqlite3.SQLITE_FUNCTION,
    sqlite3.SQLITE_RECURSIVE,
    sqlite3.SQLITE_TRANSACTION,  # the connection's own BEGIN and ROLLBACK
}
# Tables a query may read besides the views: the schema's own.
_READABLE = {"sqlite_master", "sqlite_schema", "sqlite_temp_master"}


class _QueryAuthorizer:
    """Lets a user query read the views (`v_*`) and nothing else, as artstore_reader on
    PostgreSQL may: no table of the store, no PRAGMA, ATTACH, nor any write."""

    def __init__(self, tables: set[str]) -> None:
        self.new_query(tables)

    def new_query(self, tables: set[str]) -> None:
        self.tables = tables - _READABLE  # the store's tables (a CTE is none of them)
        self.read_by_views: set[str] = set()  # tables a view of this query has read

    def __call__(
        self, action: int, arg1: str | None, arg2: str | None, _db: str | None, source: str | None
    ) -> int:
        if action not in _QUERY_ACTIONS:
            return sqlite3.SQLITE_DENY
        if action == sqlite3.SQLITE_READ and (arg1 or "").lower() in self.tables:
            table = (arg1 or "").lower()
            # A view reads its tables with `source` set to the view's name; a query that
            # names a table itself reads it with no source.
            if (source or "").lower().startswith("v_"):
                self.read_by_views.add(table)
            # SQLite also asks about a table it takes no value from (count(*)), as column
            # "", after it has merged a view into the query: then without the view's name.
            # That read shows no value; it is a view's when a view of this query read the
            # table (`SELECT count(*) FROM v_train_steps`), and the query's own otherwise.
            elif not (arg2 == "" and table in self.read_by_views):
                return sqlite3.SQLITE_DENY
        if action == sqlite3.SQLITE_FUNCTION and (arg2 or "").lower() == "load_extension":
            return sqlite3.SQLITE_DENY
        return sqlite3.SQLITE_OK
