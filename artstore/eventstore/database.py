"""One database under a store: what every database offers, and driver errors mapped to ours.

`Database` is the small interface the rest of artstore uses; each database implements
it in a module of its own, so that changing how artstore uses a database touches one
file:

- `artstore.eventstore.sqlite`: one machine, a file; WAL, `BEGIN IMMEDIATE`, a writer
  thread with its own connection;
- `artstore.eventstore.postgres`: many machines; an asyncpg pool, a table lock that
  orders appends (from the INSERT into `events` to commit; appends with nothing to
  project share it and readers stop below those in flight), session locks for trainers.

`connect(url)` picks the module from the URL.
"""

from __future__ import annotations

import errno
import functools
import importlib
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

from sqlalchemy import text
from sqlalchemy.engine import URL, Connection
from sqlalchemy.exc import DBAPIError, IntegrityError, InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from artstore.errors import (
    ArtstoreError,
    ConfigurationError,
    DatabaseUnavailableError,
    GroupAlreadyConsumedError,
    ImmutableEventError,
    LockTimeoutError,
    PoolTimeoutError,
    ReadOnlyStoreError,
    StorageFullError,
)
from artstore.eventstore.recorder import ErrorKind, Recorder, causes
from artstore.eventstore.records import StatementPart
from artstore.urls import redact

T = TypeVar("T")

# The module and class of each database artstore runs on, by SQLAlchemy backend name.
DATABASES = {
    "sqlite": "artstore.eventstore.sqlite:SQLiteDatabase",
    "postgresql": "artstore.eventstore.postgres:PostgresDatabase",
}

# The most one row of a user query's result may hold (its values as text), in bytes: the
# databases refuse to hand over more (SQLite cannot even make a longer value for it).
USER_QUERY_ROW_BYTES = 16 * 2**20


@dataclass(frozen=True)
class ResultColumn:
    """A column of a user query's result, as the database describes it before running it."""

    name: str
    # SQL for the size in bytes of the column's value as text, `{column}` standing for the
    # column; None for a type of a few bytes at most.
    size: str | None


@dataclass(frozen=True)
class SQLSyntax:
    """What a database's parser does with the start of a statement: sqlglot's name for
    its dialect; the characters it skips as blanks; what ends a `--` comment; whether
    `/* */` comments nest."""

    sqlglot_dialect: str
    blanks: str
    line_ends: str
    nested_comments: bool


@dataclass
class WriteBatch:
    """One write transaction of the event store, as its writer commits it.

    `write(connection)` does all of it: stream heads, checks, blobs, events, projections.
    `rows`, when not None, says that the batch is nothing but these event rows (versions
    included: no condition), the `blobs` rows not stored yet and the projection rows
    `projected` (empty unless the writer `projects_in_statement`): a database may then
    insert them in one statement that commits by itself, and calls `inserted(positions)`
    instead of `write`. Where it cannot, `write` does the same."""

    write: Callable[[Connection], None]
    events: int
    rows: list[dict[str, Any]] | None = None
    inserted: Callable[[list[int]], None] | None = None
    blobs: list[dict[str, Any]] = field(default_factory=list)
    projected: list[StatementPart] = field(default_factory=list)


class Writer:
    """Commits the event store's write transactions: synchronous SQL, one call each.

    The store has one writer; each database runs it its own way (a thread with its own
    connection, a dedicated connection), and chooses how a `WriteBatch` is committed.
    """

    # Whether `commit_now` may commit on the caller's thread at all (SQLite, whose write
    # lock is often free at once). Elsewhere an append goes straight to the writer task:
    # trying first would only cost a loop turn and a batch built twice.
    commits_inline = False

    def commit_now(self, batch: WriteBatch) -> bool:
        """Commit `batch` here and now, on the caller's thread, if the database can without
        waiting for anything (True once committed; False, with nothing written, when it
        cannot). An error is raised as it is."""
        return False

    async def commit(self, batch: WriteBatch) -> None:
        """Commit `batch`, waiting for the database as long as it takes."""
        raise NotImplementedError

    async def transaction(self, work: Callable[[Connection], T]) -> T:
        """Run `work` in one write transaction and commit (the per-append fallback)."""
        raise NotImplementedError

    # Whether `Recorder.insert_events(..., side_by_side=True)` shares the append lock with
    # other such transactions on this database now (PostgreSQL from migration 0010).
    side_by_side_appends: bool = False
    # Whether a batch's `rows` may come with new blobs and projection rows (`StatementRows`),
    # all written by the statement that commits by itself (PostgreSQL).
    projects_in_statement: bool = False

    async def refresh_statistics(self) -> None:
        """Help the query planner after many appends (where the database needs it)."""

    async def reset(self) -> None:
        """Forget the connection after an error that may have broken it."""

    async def close(self) -> None:
        await self.reset()


class Database:
    """The engines of one store, and what differs between the databases it runs on."""

    dialect: ClassVar[str]  # SQLAlchemy's name for it, for people and messages
    recorder: ClassVar[Recorder]  # its SQL (artstore.eventstore.recorder)
    # Whether processes on many hosts may share it: rollout workers coordinate through its
    # row locks and notifications (`listen`).
    many_machines: ClassVar[bool] = False
    # How its SQL reads: sqlglot's name for its dialect, and what it skips before a
    # statement's first word (artstore.analysis.bounded.first_word).
    sql_syntax: ClassVar[SQLSyntax]

    def __init__(
        self,
        url: URL,
        write_engine: AsyncEngine,
        read_engine: AsyncEngine,
        *,
        read_only: bool = False,
    ) -> None:
        self.url = url
        self.write_engine = write_engine
        self.read_engine = read_engine
        self.read_only = read_only

    @classmethod
    def connect(cls, url: URL, *, read_only: bool = False) -> Database:
        """Engines for `url` (an async URL from `artstore.urls.resolve_url`).

        `read_only`: every session is read-only, and nothing on disk is created or
        changed (no schema, no journal mode), so that a store on read-only media, or
        one that another process writes, can be read without waiting.
        """
        raise NotImplementedError

    @classmethod
    def check_exists(cls, url: URL) -> None:
        """Refuse a URL that names no database yet, where connecting would create one."""

    def refuse_writes(self) -> None:
        if self.read_only:
            raise ReadOnlyStoreError(
                f"the store at {self.display_url} was opened read-only: it cannot record"
            )

    @property
    def display_url(self) -> str:
        """The URL with its password hidden, for messages: without the async driver artstore
        picked (postgresql://..., as a user writes it, not postgresql+asyncpg://...)."""
        return redact(self.url.set(drivername=self.url.get_backend_name()))

    @property
    def location(self) -> str:
        """Where the data lives, for people: a file path, or the URL."""
        return self.display_url

    # --- transactions -------------------------------------------------------------------

    @asynccontextmanager
    async def write(
        self, connection: AsyncConnection | None = None
    ) -> AsyncIterator[AsyncConnection]:
        """A write transaction, on `connection` or a pooled one."""
        self.refuse_writes()
        if connection is not None:
            async with connection.begin():
                yield connection
            return
        async with self.write_engine.begin() as pooled:
            yield pooled

    @asynccontextmanager
    async def read(self) -> AsyncIterator[AsyncConnection]:
        connection = await self.open_connection(self.read_engine)
        try:
            yield connection
        finally:
            await connection.close()

    async def run_read(self, work: Callable[[Connection], T]) -> T:
        """Run `work` (synchronous SQL) in one read transaction and return what it returns.

        For reads of several statements that must be quick: where the driver hops to a
        thread of its own for every call (aiosqlite: four hops a statement, each a wait for
        the scheduler on a busy machine), the whole of `work` is one hop."""
        async with self.read() as connection:
            return await connection.run_sync(work)

    async def run_lookup(self, work: Callable[[Connection], T]) -> T:
        """`run_read` for a read whose statements need no snapshot in common (each reads
        rows that, once there, never change): where the database can, outside a
        transaction, which saves its BEGIN and ROLLBACK."""
        return await self.run_read(work)

    async def open_connection(self, engine: AsyncEngine) -> AsyncConnection:
        """A connection of `engine`; not getting one is DatabaseUnavailableError."""
        try:
            return await engine.connect()
        except Exception as exc:  # a refused login, a server gone, a socket error
            raise self.connection_error(exc, engine) from exc

    def connection_error(self, exc: Exception, engine: AsyncEngine) -> Exception:
        """What not getting a connection of `engine` means, by the exception's type: a
        pool that had none free in time is not a database out of reach."""
        if isinstance(exc, PoolTimeout):  # only a QueuePool raises it
            pool: Any = engine.pool
            return PoolTimeoutError(
                f"waited {pool.timeout():g} s for one of this process's {pool.size()} "
                f"connections to the database at {self.display_url}: all were in use by "
                "its other work (the database answered)"
            )
        if isinstance(exc, DatabaseUnavailableError):
            return exc
        message = str(getattr(exc, "orig", None) or exc).strip() or type(exc).__name__
        return DatabaseUnavailableError(
            f"cannot reach the database at {self.display_url}: {message.splitlines()[0]}"
        )

    async def run_write(
        self,
        work: Callable[[AsyncConnection], Awaitable[T]],
        connection: AsyncConnection | None = None,
    ) -> T:
        """Run `work` in one write transaction; driver errors come out as artstore's."""
        try:
            async with self.write(connection) as active:
                return await work(active)
        except PoolTimeout as exc:
            raise self.connection_error(exc, self.write_engine) from exc
        except DBAPIError as exc:
            translated = translate_error(exc, self)
            if translated is exc:
                raise
            raise translated from exc

    async def check_reachable(self) -> None:
        try:
            async with self.read() as connection:
                await connection.execute(text("SELECT 1"))
        except DatabaseUnavailableError:  # said already, by open_connection
            raise
        except Exception as exc:  # any driver or socket error means the same to the user
            raise self.connection_error(exc, self.read_engine) from None

    async def dispose(self) -> None:
        await self.write_engine.dispose()
        if self.read_engine is not self.write_engine:
            await self.read_engine.dispose()

    # --- what each database does its own way --------------------------------------------

    def writer(self) -> Writer:
        """The event store's writer (one per store)."""
        raise NotImplementedError

    async def safe_position(self, connection: AsyncConnection) -> int | None:
        """The highest position a reader may read up to now: every committed event at or
        below it is visible, and no event at or below it commits later (None: any, where
        positions are handed out in commit order). Ask in a statement of its own, before
        the statement that reads the events, in a READ COMMITTED transaction (the events'
        snapshot is then taken after it)."""
        return None

    def lock_appends(self, connection: Connection) -> None:
        """Hold appenders off until this transaction ends (a rebuild of the projections)."""
        self.recorder.lock_appends(connection)

    async def lock_migrations(self, connection: AsyncConnection) -> None:
        """One migrator at a time, when several processes open a fresh database together."""
        raise NotImplementedError

    def try_lock(self, name: str) -> AbstractAsyncContextManager[bool]:
        """Hold the lock `name` across processes while the block runs; yields False, at
        once, when another process holds it. Released when the process dies."""
        raise NotImplementedError

    async def lock_held(self, name: str) -> bool | None:
        """Whether a process holds the lock `name` of `try_lock` now (None: this database
        cannot tell). Only a look: it takes no lock, so it never refuses a `try_lock`."""
        return None

    def query_session(self, timeout: float | None) -> AbstractAsyncContextManager[AsyncConnection]:
        """A connection for one user query, confined by the database itself: it may read
        the views and nothing else, for `timeout` seconds from now (None: no limit), and
        makes no value longer than USER_QUERY_ROW_BYTES where the database can refuse to.
        `connection.info["stop_query"]()` stops what the query is doing at once (the
        caller gave up on it). Discarded afterwards, so that nothing the query did
        outlives it."""
        raise NotImplementedError

    async def describe_query(
        self, connection: AsyncConnection, statement: str
    ) -> list[ResultColumn] | None:
        """The columns of `statement`'s rows, found on a query session without running
        it; None when it has no column. Raises the database's own error for a statement
        it refuses, and QueryRefusedError for one it takes, but not as a query."""
        raise NotImplementedError

    async def listen(
        self, channel: str, on_notification: Callable[..., None], on_lost: Callable[..., None]
    ) -> Any:
        """A connection of its own that calls `on_notification(connection, pid, channel,
        payload)` for each notification on `channel`, and `on_lost(connection)` when it is
        lost; close it with `await connection.close()` (where `many_machines`)."""
        raise NotImplementedError

    async def confine_reader(self) -> list[str]:
        """Confine the role user queries run as, where the database has one; returns what
        this user could not confine (empty: confined)."""
        return []


def database_class(url: URL) -> type[Database]:
    """The `Database` class for `url` (an async URL from `artstore.urls.resolve_url`)."""
    return database_class_named(url.get_backend_name())


def database_class_named(backend: str) -> type[Database]:
    """The `Database` class for SQLAlchemy's backend name `backend`."""
    where = DATABASES.get(backend)
    if where is None:
        raise ConfigurationError(f"artstore does not run on {backend!r}")
    module, _, name = where.partition(":")
    return getattr(importlib.import_module(module), name)


@functools.cache  # asked by each projection batch
def recorder_for(backend: str) -> Recorder:
    """The recorder of SQLAlchemy's backend `backend` (the registry is `DATABASES`)."""
    return database_class_named(backend).recorder


def recorder_of(connection: Connection) -> Recorder:
    """The recorder of the database `connection` is connected to."""
    return recorder_for(connection.dialect.name)


def error_kind(exc: BaseException) -> ErrorKind | None:
    """What a driver error means, asked of every recorder (each knows only its own)."""
    for backend in DATABASES:
        kind = recorder_for(backend).error_kind(exc)
        if kind is not None:
            return kind
    return None


def connect(url: URL, *, read_only: bool = False) -> Database:
    """The `Database` for `url` (an async URL from `artstore.urls.resolve_url`)."""
    return database_class(url).connect(url, read_only=read_only)


def translate_error(exc: BaseException, database: Database | None = None) -> Exception:
    """The artstore error for a driver error (callers never see the driver's).

    What the error means is told by SQLSTATE, SQLite's error code or the constraint's
    name (`Recorder.error_kind`). An artstore error comes back as it is: it was translated
    where it was raised (the writer's thread, a retry), and saying it again would say its
    prefix twice."""
    if isinstance(exc, ArtstoreError):
        return exc  # type: ignore[return-value]
    where = f" at {database.display_url}" if database else ""
    message = (str(getattr(exc, "orig", None) or exc).strip().splitlines() or [""])[0]
    kind = database.recorder.error_kind(exc) if database else error_kind(exc)
    if kind is ErrorKind.IMMUTABLE:
        return ImmutableEventError(message.removeprefix("artstore: "))
    if kind is ErrorKind.GROUP_CONSUMED:
        return GroupAlreadyConsumedError(
            "a group in this train step was already trained into this model; "
            f"nothing was written ({message})"
        )
    if isinstance(exc, IntegrityError):
        return exc  # callers decide what other constraint violations mean
    if kind is ErrorKind.LOCK_TIMEOUT:
        return LockTimeoutError(
            f"gave up waiting for a lock that another session holds{where} ({message}); "
            "the URL's options=-c lock_timeout=... sets how long to wait"
        )
    if kind is ErrorKind.DISK_FULL or _no_space_left(exc):
        return StorageFullError(f"the database{where} has no space left: {message}")
    if isinstance(exc, (OperationalError, InterfaceError, OSError, ConnectionError)) or (
        isinstance(exc, DBAPIError) and exc.connection_invalidated
    ):
        return DatabaseUnavailableError(f"cannot use the database{where}: {message}")
    return exc


def _no_space_left(exc: BaseException) -> bool:
    """The system's ENOSPC under a driver's error (a file the database could not write)."""
    return any(getattr(cause, "errno", None) == errno.ENOSPC for cause in causes(exc))
