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

import importlib
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

from sqlalchemy import Table, text
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


class Writer:
    """Runs the event store's write transactions: synchronous SQL, one call per transaction.

    The store has one writer; each database runs it its own way (a thread with its own
    connection, a dedicated pooled connection).
    """

    async def transaction(self, work: Callable[[Connection], T], *, events: int = 0) -> T:
        """Run `work` in one write transaction that holds the append lock, and commit.

        `events`: how many events it appends (0: unknown), so that a database may run a
        small transaction without a hop to another thread."""
        raise NotImplementedError

    # Whether `insert_and_commit` is offered (a database where a transaction that only
    # inserts events is cheaper as one statement that commits by itself).
    single_statement_appends: bool = False

    async def insert_and_commit(self, rows: list[dict[str, Any]]) -> list[int]:
        """Insert event rows (with their versions) in one statement that commits by itself,
        holding the append lock as a transaction does; their positions, in that order."""
        raise NotImplementedError

    # Whether `insert_events(..., side_by_side=True)` shares the append lock with other
    # such transactions (PostgreSQL from migration 0010); elsewhere it is a plain INSERT.
    side_by_side_appends: bool = False

    def insert_now(self, rows: list[dict[str, Any]]) -> tuple[bool, list[int] | None]:
        """`insert_and_commit` here and now, if the database can do that without waiting:
        (True, the positions) once committed, (False, None) when it cannot. An error is
        raised as it is."""
        return False, None

    # Whether `write_now` may commit a small transaction on the caller's thread (SQLite).
    writes_now = False

    def write_now(self, work: Callable[[Connection], T], *, events: int) -> tuple[bool, T | None]:
        """Run `work` in one write transaction here and now, if the database can do that
        without waiting: (True, its result) once committed, (False, None) when it cannot
        (the lock is held elsewhere, too many events). An error is raised as it is."""
        return False, None

    async def refresh_statistics(self) -> None:
        """Help the query planner after many appends (where the database needs it)."""

    async def reset(self) -> None:
        """Forget the connection after an error that may have broken it."""

    async def close(self) -> None:
        await self.reset()


class Database:
    """The engines of one store, and what differs between the databases it runs on."""

    dialect: ClassVar[str]

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

    def insert_events(
        self, connection: Connection, rows: list[dict[str, Any]], *, side_by_side: bool = False
    ) -> list[int]:
        """Insert event rows in the order given; their global positions, in that order.

        `side_by_side`: what the transaction projects needs no order across appends
        (`artstore.projections.side_by_side`), so it may share the append lock with other
        such transactions where the writer offers that (`Writer.side_by_side_appends`).
        """
        raise NotImplementedError

    def insert_missing(
        self, connection: Connection, table: Table, key: str, rows: list[dict[str, Any]]
    ) -> None:
        """Insert the rows whose `key` is not stored yet (content-addressed blobs)."""
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
        raise NotImplementedError

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

    async def confine_reader(self) -> list[str]:
        """Confine the role user queries run as, where the database has one; returns what
        this user could not confine (empty: confined)."""
        return []


def connect(url: URL, *, read_only: bool = False) -> Database:
    """The `Database` for `url` (an async URL from `artstore.urls.resolve_url`)."""
    backend = url.get_backend_name()
    where = DATABASES.get(backend)
    if where is None:
        raise ConfigurationError(f"artstore does not run on {backend!r}")
    module, _, name = where.partition(":")
    database_class: type[Database] = getattr(importlib.import_module(module), name)
    return database_class.connect(url, read_only=read_only)


def translate_error(exc: BaseException, database: Database | None = None) -> Exception:
    """The artstore error for a driver error (callers never see the driver's).

    An artstore error comes back as it is: it was translated where it was raised (the
    writer's thread, a retry), and saying it again would say its prefix twice."""
    if isinstance(exc, ArtstoreError):
        return exc  # type: ignore[return-value]
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
    if _sqlstate(exc) == "55P03" or "lock timeout" in message:
        return LockTimeoutError(
            f"gave up waiting for a lock that another session holds{where} ({message}); "
            "the URL's options=-c lock_timeout=... sets how long to wait"
        )
    if _is_disk_full(exc, message):
        return StorageFullError(f"the database{where} has no space left: {message}")
    if isinstance(exc, (OperationalError, InterfaceError, OSError, ConnectionError)) or (
        isinstance(exc, DBAPIError) and exc.connection_invalidated
    ):
        return DatabaseUnavailableError(f"cannot use the database{where}: {message}")
    return exc


def _sqlstate(exc: BaseException) -> str | None:
    return getattr(getattr(exc, "orig", None), "sqlstate", None)


def _is_disk_full(exc: BaseException, message: str) -> bool:
    # SQLite: SQLITE_FULL; PostgreSQL: SQLSTATE 53100 (disk_full), "could not extend file".
    lowered = message.lower()
    return (
        _sqlstate(exc) == "53100"
        or "database or disk is full" in lowered
        or "no space left on device" in lowered
        or "could not extend file" in lowered
    )
