"""artstore on PostgreSQL: many machines, one database.

An appending transaction holds an EXCLUSIVE lock on the table `append_lock` from its
INSERT into `events` until it commits, taken by a statement trigger of the schema (the
writer does what needs no order first), so that global positions are handed out in
commit order and a reader catching up from a position never misses an event
(PostgreSQL sequences alone are not commit-ordered). Appends with nothing to project
(one statement that commits by itself, `artstore_insert_events` of migration 0010) run
side by side instead: they share the lock and hold an advisory key below their positions,
and readers read up to `artstore_safe_position()` only, which stays below every such
append in flight. Trainers hold a session-level advisory lock per model, which the server
releases when their connection dies.

Every session has timeouts, so that a stuck or stopped process cannot freeze the others:
a session left idle inside a transaction (a process stopped while it held the append
lock) is ended by the server, which releases its locks, and a peer gone from the network
is noticed by TCP keepalives. Nothing else has a deadline: a lock held by a session that
works (a rebuild of the projections, a migration) is waited for as long as it works, and
a pooled connection as long as this process's other work holds them all, so that a slow
machine makes a command slow, never makes it fail. The URL's
standard libpq parameters (`sslmode`, `connect_timeout`, `application_name`, `options`)
are translated for asyncpg; `options=-c name=value` also overrides artstore's defaults.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import shlex
import ssl
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any, TypeVar

from sqlalchemy import (
    ARRAY,
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Float,
    Integer,
    String,
    Table,
    Text,
    TextClause,
    bindparam,
    cast,
    column,
    func,
    literal,
    select,
    table,
    text,
    true,
)
from sqlalchemy.dialects import postgresql
from sqlalchemy.engine import URL, Connection
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine
from sqlalchemy.pool import NullPool
from sqlalchemy.sql import Insert, Select
from sqlalchemy.types import TypeDecorator

from artstore.errors import ConfigurationError, QueryError
from artstore.eventstore import reader_role
from artstore.eventstore.blobs import serialize
from artstore.eventstore.database import (
    Database,
    ResultColumn,
    SQLSyntax,
    WriteBatch,
    Writer,
    translate_error,
)
from artstore.eventstore.reader_role import READER_ROLE
from artstore.eventstore.recorder import ErrorKind, causes
from artstore.eventstore.records import StatementAdds, StatementPart, StatementRows
from artstore.schema.tables import blobs as t_blobs
from artstore.schema.tables import events

# Key of the advisory lock that makes migrations wait for each other ("artstore" + 1).
MIGRATION_LOCK_KEY = 7021802808247546470
T = TypeVar("T")
READ_COMMITTED = "READ COMMITTED"

# Every session's defaults (the URL's `options=-c name=value` wins over them).
SESSION_SETTINGS = {
    # No `lock_timeout`: a lock (the append lock, a row) is waited for while its holder
    # works, however slowly; a holder that stopped is ended by the idle timeout below,
    # one gone from the network by the keepalives. (The URL may still set one.)
    # A session idle inside a transaction (its process stopped, or stuck) is ended by
    # the server, which releases its locks.
    "idle_in_transaction_session_timeout": "10min",
    # A dead peer on a real network is noticed within about two minutes.
    "tcp_keepalives_idle": "60",
    "tcp_keepalives_interval": "10",
    "tcp_keepalives_count": "6",
}
# The store's writer: its transactions are machine-driven, so its idle timeout is tighter:
# a writer stopped while it holds the append lock (and, for a worker's rollout, the rows
# of its claim) holds up every writer until the server ends its session. A session ended
# so under a writer that was only slow costs a retry, not an append: the writer writes
# the batch again, append by append, on a new connection. No `statement_timeout`: a
# statement waiting for the append lock behind a long rebuild is not stuck.
WRITER_SETTINGS = {
    **SESSION_SETTINGS,
    "idle_in_transaction_session_timeout": "15s",
    # JIT compiling takes 40-140 ms a statement once the planner's estimate passes
    # jit_above_cost, which a batch's lookups of hundreds of streams do before ANALYZE has
    # run (artstore/eventstore/streams.py); it never pays for these short statements.
    "jit": "off",
}

# libpq's URL parameters that artstore understands, besides host, port, user, password.
_SSL_FILES = ("sslrootcert", "sslcert", "sslkey")
LIBPQ_PARAMETERS = (
    "sslmode",
    *_SSL_FILES,
    "connect_timeout",
    "application_name",
    "options",
    "target_session_attrs",
)


class PostgresRecorder:
    """The recorder (artstore.eventstore.recorder) of PostgreSQL: appends take the append
    lock at their INSERT (or share it, side by side, through `artstore_insert_events`),
    keys are transaction-level advisory locks, stream ids are looked up one by one."""

    def insert_events(
        self, connection: Connection, rows: list[dict[str, Any]], *, side_by_side: bool = False
    ) -> list[int]:
        if side_by_side:
            # Through the function of migration 0010, inside this transaction: the INSERT
            # shares the append lock and holds its advisory key until the commit.
            result = connection.execute(_INSERT_SIDE_BY_SIDE, _insert_parameters(rows))
            found = {row.inserted_event_id: row.inserted_position for row in result}
            return [found[row["event_id"]] for row in rows]
        return [row.position for row in connection.execute(_INSERT_EVENTS, rows)]

    def insert_missing(
        self, connection: Connection, table: Table, key: str, rows: list[dict[str, Any]]
    ) -> None:
        statement = postgresql.insert(table).on_conflict_do_nothing(index_elements=[key])
        connection.execute(statement, rows)

    def select_heads(self, stream_ids: Sequence[str]) -> Select:
        # max() of one stream is the last entry of the index: a backward index scan.
        wanted = _wanted(stream_ids)
        head = (
            select(func.max(events.c.version))
            .where(events.c.stream_id == wanted.c.stream_id)
            .scalar_subquery()
        )
        return select(wanted.c.stream_id, head).select_from(wanted)

    def select_streams(
        self, stream_ids: Sequence[str], columns: Sequence[Any], event_type: str | None = None
    ) -> Select:
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

    def insert(self, table: Table) -> Insert:
        return postgresql.insert(table)

    def lock_keys(self, connection: Connection, namespace: int, keys: Sequence[int]) -> None:
        if keys:
            connection.execute(_LOCK_KEYS, {"namespace": namespace, "keys": list(keys)})

    def lock_appends(self, connection: Connection) -> None:
        connection.exec_driver_sql("LOCK TABLE append_lock IN EXCLUSIVE MODE")

    def lock_for_removal(self, connection: Connection) -> None:
        # An appender writes its blobs (ROW EXCLUSIVE on `blobs`) before it takes the
        # append lock: taking the two in the same order waits for every append in flight,
        # also one that found a blob stored and will name it, and never in a cycle.
        connection.exec_driver_sql("LOCK TABLE blobs IN EXCLUSIVE MODE")
        connection.exec_driver_sql("LOCK TABLE append_lock IN EXCLUSIVE MODE")

    def error_kind(self, exc: BaseException) -> ErrorKind | None:
        for cause in causes(exc):
            state = getattr(cause, "sqlstate", None)
            if state == _UNIQUE_VIOLATION:
                return _CONSTRAINT_KINDS.get(_constraint_name(cause))
            if state in _SQLSTATE_KINDS:
                return _SQLSTATE_KINDS[state]
        return None


def _constraint_name(error: BaseException) -> str | None:
    """The constraint asyncpg names for a violation (on the driver's own exception, which
    SQLAlchemy's adapter keeps as the cause)."""
    for cause in causes(error):
        name = getattr(cause, "constraint_name", None)
        if name:
            return name
    return None


def _wanted(stream_ids: Sequence[str]) -> Any:
    """The ids as rows of one column `stream_id`: an array, unnested. An IN list of
    hundreds of ids is planned from the statistics of `stream_id`, and before ANALYZE has
    run each id is taken to match 0.5% of the rows, the list the whole table: a scan of
    all of `events` per batch (tools/bench_queries.py). Unnested, each id is looked up on
    its own through the (stream, version) index, whatever the statistics say."""
    ids = bindparam("wanted_stream_ids", list(stream_ids), type_=ARRAY(String))
    return func.unnest(ids).table_valued("stream_id").render_derived(name="wanted")


# Taken in the keys' order (the caller sorts them), so two transactions never wait in a circle.
_LOCK_KEYS = text(
    "SELECT pg_advisory_xact_lock(CAST(:namespace AS bigint) + key) "
    "FROM unnest(CAST(:keys AS bigint[])) AS key"
)
_UNIQUE_VIOLATION = "23505"
# Unique keys by their names (the schema's naming convention, artstore.schema.tables).
_CONSTRAINT_KINDS = {
    "uq_events_stream_id_version": ErrorKind.VERSION_TAKEN,
    "uq_events_event_id": ErrorKind.EVENT_ID_TAKEN,
    "pk_group_consumptions": ErrorKind.GROUP_CONSUMED,
}
_SQLSTATE_KINDS = {
    # integrity_constraint_violation itself: raised by the schema's triggers alone, which
    # refuse to change stored rows (the database's own constraints raise its subclasses:
    # 23502 not null, 23503 foreign key, 23505 unique, 23514 check).
    "23000": ErrorKind.IMMUTABLE,
    "55P03": ErrorKind.LOCK_TIMEOUT,  # lock_not_available
    "53100": ErrorKind.DISK_FULL,  # disk_full, "could not extend file" included
    "42883": ErrorKind.UNDEFINED_FUNCTION,  # undefined_function
    "42501": ErrorKind.UNDEFINED_FUNCTION,  # insufficient_privilege (set_config revoked)
    "40P01": ErrorKind.CONFLICT_RETRY,  # deadlock_detected: one side is rolled back
    "40001": ErrorKind.CONFLICT_RETRY,  # serialization_failure
}

RECORDER = PostgresRecorder()


class PostgresDatabase(Database):
    dialect = "postgresql"
    recorder = RECORDER
    many_machines = True
    # A `--` comment ends at a line feed or a carriage return; /* */ comments nest.
    sql_syntax = SQLSyntax("postgres", " \t\n\r\f\v", "\n\r", nested_comments=True)

    def __init__(
        self,
        url: URL,
        engine: AsyncEngine,
        writer_engine: AsyncEngine,
        query_engine: AsyncEngine,
        *,
        read_only: bool = False,
    ) -> None:
        super().__init__(url, engine, engine, read_only=read_only)
        self.writer_engine = writer_engine  # the store's writer, with tighter timeouts
        # Connections for user queries (analysis.sql) alone, never handed to the store's
        # own work: a user query may leave session state (an advisory lock) that the
        # session's reset takes away, but nothing else ever sees it.
        self.query_engine = query_engine
        self._has_watermark = False  # whether artstore_safe_position() exists (0010)
        # One pooled connection kept for `run_lookup`, between lookups too (see there).
        self._lookup_connection: AsyncConnection | None = None
        self._lookup_lock = asyncio.Lock()
        self._reader_confined = False  # whether the reader role was found confined

    @classmethod
    def connect(cls, url: URL, *, read_only: bool = False) -> PostgresDatabase:
        connect_args, overrides = connection_options(url)
        settings = {**SESSION_SETTINGS, **overrides}
        if read_only:  # the server refuses any write of this store's sessions
            settings["default_transaction_read_only"] = "on"
        bare = url.set(query={})
        engine = create_async_engine(
            bare,
            # Whatever the server's default: a read up to `safe_position` needs a snapshot
            # taken after it, and the writer's head re-read needs the other's commit.
            isolation_level=READ_COMMITTED,
            pool_size=8,
            max_overflow=8,
            # A connection is waited for as long as this process's other work holds them
            # all (SQLAlchemy's default gives up after 30 s): the pool bounds how many
            # connections a process opens on a shared server, not how long work may take.
            pool_timeout=None,
            # A pooled connection the server dropped (a restart, a network cut, a session
            # ended by a timeout) is replaced when taken, rather than failing a read.
            pool_pre_ping=True,
            json_serializer=serialize,
            connect_args={**connect_args, "server_settings": settings},
        )
        writer_engine = create_async_engine(
            bare,
            isolation_level=READ_COMMITTED,
            poolclass=NullPool,  # one connection, kept by the writer for the store's life
            json_serializer=serialize,
            connect_args={
                **connect_args,
                "server_settings": {**WRITER_SETTINGS, **overrides},
            },
        )
        query_engine = create_async_engine(
            bare,
            pool_size=4,
            max_overflow=4,
            pool_timeout=None,  # as above
            pool_pre_ping=True,
            json_serializer=serialize,
            connect_args={**connect_args, "server_settings": settings},
        )
        for pooled in (engine, query_engine):
            pooled.dialect.do_ping = _ping_outside_a_transaction  # type: ignore[method-assign]
        return cls(url, engine, writer_engine, query_engine, read_only=read_only)

    async def dispose(self) -> None:
        await self._drop_lookup_connection()
        await self.writer_engine.dispose()
        await self.query_engine.dispose()
        await super().dispose()

    def writer(self) -> PostgresWriter:
        self.refuse_writes()
        return PostgresWriter(self)

    async def run_lookup(self, work: Callable[[Connection], T]) -> T:
        # A one-statement lookup is one round trip: outside a transaction (no BEGIN, no
        # ROLLBACK), on a connection kept between lookups, so the pool does not ping it
        # first. A kept connection the server has dropped since fails its statement
        # instead, and the lookup runs again as the pool hands connections out (pinged):
        # a lookup only reads rows that never change, so running it twice is harmless.
        # Lookups at once beyond the first take pooled connections as other reads do.
        if not self._lookup_lock.locked():
            async with self._lookup_lock:
                try:
                    connection = await self._kept_lookup_connection()
                    return await connection.run_sync(work)
                except DBAPIError as exc:
                    await self._drop_lookup_connection()
                    if not exc.connection_invalidated:
                        raise
                except BaseException:  # cancelled mid-statement: its state is unknown
                    await self._drop_lookup_connection()
                    raise
        async with self.read() as connection:
            await connection.execution_options(isolation_level="AUTOCOMMIT")
            return await connection.run_sync(work)

    async def _kept_lookup_connection(self) -> AsyncConnection:
        if self._lookup_connection is None:
            connection = await self.open_connection(self.read_engine)
            await connection.execution_options(isolation_level="AUTOCOMMIT")
            self._lookup_connection = connection
        return self._lookup_connection

    async def _drop_lookup_connection(self) -> None:
        """Back to the pool, which resets it (or discards it, when it is broken)."""
        connection, self._lookup_connection = self._lookup_connection, None
        if connection is not None:
            with contextlib.suppress(Exception):
                await connection.close()

    async def safe_position(self, connection: AsyncConnection) -> int | None:
        if not self._has_watermark:
            # A store not upgraded to 0010 (read-only) has no concurrent appends yet;
            # asked again each time, so that a reader sees the upgrade when it comes.
            found = await connection.execute(
                select(func.to_regprocedure("artstore_safe_position()").is_not(None))
            )
            self._has_watermark = bool(found.scalar())
            if not self._has_watermark:
                return None
        return (await connection.execute(select(func.artstore_safe_position()))).scalar()

    async def lock_migrations(self, connection: AsyncConnection) -> None:
        await connection.execute(select(func.pg_advisory_xact_lock(MIGRATION_LOCK_KEY)))

    @asynccontextmanager
    async def try_lock(self, name: str) -> AsyncIterator[bool]:
        key = lock_key(name)
        connection = await self.open_connection(self.write_engine)
        try:
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
        finally:
            await connection.close()

    async def lock_held(self, name: str) -> bool:
        # A bigint advisory lock shows in pg_locks as its high and low 32 bits.
        key = lock_key(name)
        locks = table(
            "pg_locks",
            column("locktype"),
            column("classid"),
            column("objid"),
            column("objsubid"),
            column("granted"),
        )
        query = select(literal(1)).where(
            locks.c.locktype == "advisory",
            locks.c.objsubid == 1,
            locks.c.granted,
            cast(locks.c.classid, BigInteger) == key >> 32,
            cast(locks.c.objid, BigInteger) == key & 0xFFFFFFFF,
        )
        async with self.read() as connection:
            return (await connection.execute(query)).first() is not None

    @asynccontextmanager
    async def query_session(self, timeout: float | None) -> AsyncIterator[AsyncConnection]:
        connection = await self.open_connection(self.query_engine)
        clean = False
        try:
            await connection.exec_driver_sql("SET TRANSACTION READ ONLY")  # (begins it)
            limit = 0 if not timeout else max(1, round(timeout * 1000))
            # A client that stops reading (stopped, or killed on a network that does not
            # say so) does not keep a snapshot and a connection for long; from 14 on, a
            # killed client's query stops within a second, not at its next row.
            idle = max(60_000, 2 * limit)
            settings = [
                f"SET LOCAL statement_timeout = {limit}",
                f"SET LOCAL idle_in_transaction_session_timeout = {idle}",
            ]
            if (connection.dialect.server_version_info or (0,)) >= (14,):
                settings.append("SET LOCAL client_connection_check_interval = 1000")
            driver = (await connection.get_raw_connection()).driver_connection
            # One round trip for all of them (asyncpg's simple protocol takes several).
            await driver.execute("; ".join(settings))  # type: ignore[union-attr]
            await self._check_reader(connection)
            await connection.exec_driver_sql(f"SET LOCAL ROLE {READER_ROLE}")
            connection.info["stop_query"] = _nothing  # asyncpg cancels an awaited query
            yield connection
            await connection.rollback()
            # What a query may have left in the session beyond its transaction (a
            # session-level advisory lock, a setting, a LISTEN, a cursor WITH HOLD) goes.
            await driver.execute(_RESET_SESSION)  # type: ignore[union-attr]
            clean = True
        finally:
            if clean:
                await connection.close()  # back to the query pool
            else:
                await connection.invalidate()  # its session state dies with it

    async def _check_reader(self, connection: AsyncConnection) -> None:
        """Refuse to run a user query unless the reader role exists, this user may act
        as it, and it is confined to its functions (checked once per store)."""
        role = (
            await connection.execute(
                text(
                    "SELECT to_regrole(:role) IS NOT NULL, "
                    "to_regrole(:role) IS NOT NULL AND pg_has_role(current_user, :role, 'MEMBER')"
                ),
                {"role": READER_ROLE},
            )
        ).one()
        if not role[0]:
            raise QueryError(
                f"this database has no role {READER_ROLE}, as whom artstore sql runs "
                "queries: run `artstore db upgrade` as a user who may create roles"
            )
        if not role[1]:
            raise QueryError(
                f"the store's user may not act as {READER_ROLE}, as whom artstore sql "
                f"runs queries: GRANT {READER_ROLE} TO <the store's user>"
            )
        if self._reader_confined:
            return
        found = await connection.execute(
            reader_role.FIRST_UNCONFINED, reader_role.first_unconfined_parameters()
        )
        unconfined = found.scalar()
        if unconfined is not None:
            raise QueryError(
                f"artstore sql does not run queries here: the role {READER_ROLE} may run "
                f"{unconfined} and other functions outside artstore's allow-list; "
                + reader_role.UNCONFINED_HINT
            )
        self._reader_confined = True

    async def describe_query(
        self, connection: AsyncConnection, statement: str
    ) -> list[ResultColumn] | None:
        driver = (await connection.get_raw_connection()).driver_connection
        prepared = await driver.prepare(statement)  # type: ignore[union-attr]
        columns = [
            ResultColumn(
                attribute.name,
                None if attribute.type.name in _FEW_BYTES else _SIZE_AS_TEXT,
            )
            for attribute in prepared.get_attributes()
        ]
        return columns or None

    async def listen(
        self, channel: str, on_notification: Callable[..., None], on_lost: Callable[..., None]
    ) -> Any:
        # asyncpg's own connection, outside the pools: it listens for the store's life.
        import asyncpg

        dsn = self.url.set(drivername="postgresql").render_as_string(hide_password=False)
        connection = await asyncpg.connect(dsn, timeout=10)
        try:
            await connection.add_listener(channel, on_notification)
        except BaseException:
            await connection.close()
            raise
        connection.add_termination_listener(on_lost)
        return connection

    async def confine_reader(self) -> list[str]:
        async def confine(connection: AsyncConnection) -> list[str]:
            return await connection.run_sync(reader_role.confine)

        left = await self.run_write(confine)
        self._reader_confined = not left
        return left


def _nothing() -> None:
    pass


def _ping_outside_a_transaction(dbapi_connection: Any) -> bool:
    """The pool's check of a connection it hands out, in one round trip: SQLAlchemy's
    asyncpg adapter pings inside BEGIN and ROLLBACK (for pgbouncer's transaction mode,
    which artstore's sessions cannot use anyway: session settings, advisory locks, LISTEN),
    three round trips before every read. A connection that fails it is replaced, as
    before."""
    autocommit = dbapi_connection.autocommit
    dbapi_connection.autocommit = True
    try:
        dbapi_connection.ping()
    finally:
        dbapi_connection.autocommit = autocommit
    return True


# Types whose values take a few bytes as text at most: a row of them needs no measuring.
_FEW_BYTES = frozenset(
    [
        "bool",
        "int2",
        "int4",
        "int8",
        "float4",
        "float8",
        "oid",
        "date",
        "time",
        "timetz",
        "timestamp",
        "timestamptz",
        "interval",
        "uuid",
        "money",
        "char",
        "void",
    ]
)
_SIZE_AS_TEXT = "coalesce(octet_length(CAST({column} AS text)), 0)"


# DISCARD ALL without DEALLOCATE ALL, which would drop the prepared statements that
# SQLAlchemy's asyncpg driver keeps for this connection.
_RESET_SESSION = (
    "CLOSE ALL; SET SESSION AUTHORIZATION DEFAULT; RESET ALL; UNLISTEN *; "
    "SELECT pg_advisory_unlock_all(); DISCARD TEMP"
)


def lock_key(name: str) -> int:
    """The advisory lock key (a positive bigint) for a lock's name."""
    digest = hashlib.sha256(name.encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1


def connection_options(url: URL) -> tuple[dict[str, Any], dict[str, str]]:
    """asyncpg's connect arguments and the server settings that the URL's libpq
    parameters ask for; a parameter artstore does not know is a ConfigurationError."""
    query = {
        name: value if isinstance(value, str) else value[-1] for name, value in url.query.items()
    }
    unknown = sorted(set(query) - set(LIBPQ_PARAMETERS))
    if unknown:
        raise ConfigurationError(
            f"unsupported parameter {unknown[0]!r} in the database URL; artstore understands "
            f"{', '.join(LIBPQ_PARAMETERS)}"
        )
    connect_args: dict[str, Any] = {}
    settings: dict[str, str] = {}
    if "connect_timeout" in query:
        try:
            seconds = float(query["connect_timeout"])
        except ValueError:
            seconds = -1.0
        if seconds <= 0:
            raise ConfigurationError(
                f"connect_timeout={query['connect_timeout']!r} in the database URL is not a "
                "positive number of seconds"
            )
        connect_args["timeout"] = seconds
    else:
        connect_args["timeout"] = 10.0
    mode = query.get("sslmode")
    if mode is not None:
        modes = ("disable", "allow", "prefer", "require", "verify-ca", "verify-full")
        if mode not in modes:
            raise ConfigurationError(
                f"sslmode={mode!r} in the database URL is not one of {', '.join(modes)}"
            )
        connect_args["ssl"] = _ssl_context(mode, query) if _has_ssl_files(query) else mode
    elif _has_ssl_files(query):
        connect_args["ssl"] = _ssl_context("verify-full", query)
    if "application_name" in query:
        settings["application_name"] = query["application_name"]
    if "target_session_attrs" in query:
        connect_args["target_session_attrs"] = query["target_session_attrs"]
    if "options" in query:
        settings.update(_server_options(query["options"]))
    return connect_args, settings


def _has_ssl_files(query: dict[str, str]) -> bool:
    return any(name in query for name in _SSL_FILES)


def _ssl_context(mode: str, query: dict[str, str]) -> ssl.SSLContext | str:
    if mode in ("disable", "allow", "prefer"):
        return mode
    context = ssl.create_default_context(cafile=query.get("sslrootcert"))
    if "sslcert" in query:
        context.load_cert_chain(query["sslcert"], query.get("sslkey"))
    # libpq: `require` with a root certificate verifies it as verify-ca does.
    context.check_hostname = mode == "verify-full"
    if mode == "require" and "sslrootcert" not in query:
        context.verify_mode = ssl.CERT_NONE
    return context


def _server_options(options: str) -> dict[str, str]:
    """libpq's `options`: `-c name=value` (or `--name=value`), space-separated."""
    words = shlex.split(options)
    found: dict[str, str] = {}
    index = 0
    while index < len(words):
        word = words[index]
        if word == "-c" and index + 1 < len(words):
            setting, index = words[index + 1], index + 2
        elif (word.startswith("-c") and len(word) > 2) or word.startswith("--"):
            setting, index = word[2:], index + 1
        else:
            raise ConfigurationError(
                f"options={options!r} in the database URL: expected -c name=value, not {word!r}"
            )
        name, equals, value = setting.partition("=")
        if not equals or not name:
            raise ConfigurationError(f"options={options!r}: {setting!r} is not name=value")
        found[name.replace("-", "_")] = value
    return found


# Events inserted by one statement that commits by itself (autocommit): one round trip.
# The function (migration 0010) makes the INSERT concurrent: it shares the append lock
# with other such appends and holds an advisory key below its positions, which readers
# stop at (`safe_position`). The arrays keep the rows' order, so positions follow it.
# Inside a transaction (an append whose projections need no order), the same.
_INSERT_SIDE_BY_SIDE = text(
    "SELECT inserted_event_id, inserted_position FROM artstore_insert_events("
    "CAST(:event_ids AS varchar[]), CAST(:stream_ids AS varchar[]), "
    "CAST(:versions AS integer[]), CAST(:types AS varchar[]), CAST(:data AS json[]), "
    "CAST(:recorded_at AS timestamptz[]))"
)


# The payloads are JSON texts already (`payload_json`): bound as text and cast by the
# server, never through the JSON column's serializer, which would encode a text again.
_INSERT_EVENTS = (
    events.insert()
    .values(data=cast(bindparam("data", type_=Text()), events.c["data"].type))
    .returning(events.c.position, sort_by_parameter_order=True)
)


def _insert_parameters(rows: list[dict[str, Any]]) -> dict[str, list[Any]]:
    """The event rows as the function's arrays (one per column, in the rows' order)."""
    return {
        "event_ids": [row["event_id"] for row in rows],
        "stream_ids": [row["stream_id"] for row in rows],
        "versions": [row["version"] for row in rows],
        "types": [row["type"] for row in rows],
        "data": [row["data"] for row in rows],  # the payloads' JSON texts
        "recorded_at": [row["recorded_at"] for row in rows],
    }


def _insert_statement(
    rows: list[dict[str, Any]], blobs: list[dict[str, Any]], projected: list[StatementPart]
) -> tuple[Any, dict[str, Any]]:
    """The statement that inserts `rows` through `artstore_insert_events`, the `blobs`
    rows before them and the `projected` rows after, and its parameters.

    Blobs come first, as in a transaction (artstore.eventstore.batch): the function's
    arguments wait for them (a scalar subquery over their INSERT is evaluated before the
    function runs), so that the append lock is never held while a blob another appender
    inserts is waited for. Each projection is an INSERT (or an UPDATE that adds to stored
    rows) of its own in the statement, joined to the events' positions by event id, run
    once the events are in: the rows it changes are locked after the append lock, as in a
    transaction."""
    if not blobs and not projected:
        return _INSERT_SIDE_BY_SIDE, _insert_parameters(rows)
    parameters = _insert_parameters(rows)
    parts = []
    event_ids = "CAST(:event_ids AS varchar[])"
    if blobs:
        columns, selected = _unnested(t_blobs, ["hash", "body", "size", "codec"], "b", blobs)
        parameters.update(columns)
        parts.append(
            f"new_blobs AS (INSERT INTO blobs (hash, body, size, codec) {selected} "
            "ON CONFLICT (hash) DO NOTHING RETURNING 1)"
        )
        event_ids = f"(SELECT {event_ids} FROM (SELECT count(*) FROM new_blobs) AS stored)"
    parts.append(
        "inserted AS (SELECT inserted_event_id, inserted_position FROM artstore_insert_events("
        f"{event_ids}, CAST(:stream_ids AS varchar[]), CAST(:versions AS integer[]), "
        "CAST(:types AS varchar[]), CAST(:data AS json[]), "
        "CAST(:recorded_at AS timestamptz[])))"
    )
    for number, part in enumerate(projected):
        if isinstance(part, StatementAdds):
            parts.append(_addition(number, part, parameters))
        else:
            parts.append(_projection(number, part, parameters))
    sql = "WITH " + ", ".join(parts) + " SELECT inserted_event_id, inserted_position FROM inserted"
    return _statement(sql), parameters


@functools.lru_cache(maxsize=256)
def _statement(sql: str) -> TextClause:
    """`text(sql)`, made once per shape of statement: parsing its dozens of parameters
    cost more than the rest of building it."""
    return text(sql)


def _projection(number: int, part: StatementRows, parameters: dict[str, Any]) -> str:
    """One `StatementRows` as a CTE of the statement (its parameters added)."""
    names = [c.name for c in part.table.columns if c.name != "position"]
    rows = _deduplicated(part)
    columns, selected = _unnested(part.table, [*names, "event_id"], f"p{number}", rows)
    parameters.update(columns)
    listed = ", ".join(names)
    picked = ", ".join(f"r.{name}" for name in names)
    keys = ", ".join(part.keys)
    action = "UPDATE SET position = excluded.position" if part.replace else "NOTHING"
    on_conflict = f" ON CONFLICT ({keys}) DO {action}" if part.keys else ""
    return (
        f"projected_{number} AS (INSERT INTO {part.table.name} ({listed}, position) "
        f"SELECT {picked}, inserted.inserted_position FROM ({selected}) AS r "
        f"JOIN inserted ON inserted.inserted_event_id = r.event_id{on_conflict})"
    )


def _addition(number: int, part: StatementAdds, parameters: dict[str, Any]) -> str:
    """One `StatementAdds` as a CTE of the statement (its parameters added): an UPDATE
    whose sums are those of the projector's (`coalesce(total + value, total, value)`)."""
    names = [part.key, *part.counts, *part.sums]
    columns, selected = _unnested(part.table, [*names, "event_id"], f"a{number}", part.rows)
    parameters.update(columns)
    table = part.table.name
    sets = [f"{c} = {table}.{c} + r.{c}" for c in part.counts]
    sets += [f"{c} = coalesce({table}.{c} + r.{c}, {table}.{c}, r.{c})" for c in part.sums]
    return (
        f"added_{number} AS (UPDATE {table} SET {', '.join(sets)} FROM ({selected}) AS r "
        "JOIN inserted ON inserted.inserted_event_id = r.event_id "
        f"WHERE {table}.{part.key} = r.{part.key})"
    )


def _deduplicated(part: StatementRows) -> list[dict[str, Any]]:
    """One row per key, as rows written one after the other leave it (the last where it
    replaces, the first where it keeps): a statement may not touch a row twice. Rows
    without keys are inserted as they are."""
    if not part.keys:
        return part.rows
    by_key: dict[tuple, dict[str, Any]] = {}
    for row in part.rows:
        key = tuple(row[name] for name in part.keys)
        if part.replace or key not in by_key:
            by_key[key] = row
    return list(by_key.values())


def _unnested(
    table: Table, names: list[str], prefix: str, rows: list[dict[str, Any]]
) -> tuple[dict[str, list[Any]], str]:
    """The rows' columns `names` as one array parameter each (bound through the column's
    type, as an INSERT binds it: a projected text's NUL becomes U+FFFD), and the SELECT
    that unnests them back into rows."""
    parameters: dict[str, list[Any]] = {}
    casts = []
    for name in names:
        process, array_type = _binding(table, name)
        values = [row[name] for row in rows]
        parameters[f"{prefix}_{name}"] = [process(v) for v in values] if process else values
        casts.append(f"CAST(:{prefix}_{name} AS {array_type})")
    selected = f"SELECT * FROM unnest({', '.join(casts)}) AS u({', '.join(names)})"
    return parameters, selected


@functools.cache
def _binding(table: Table, name: str) -> tuple[Callable[[Any], Any] | None, str]:
    """The bind processor and SQL array type of a column of `table` (`event_id`, not a
    column: text), once: making a processor costs more than binding one call's rows."""
    column = table.columns.get(name)
    kind = column.type if column is not None else String()
    return kind.bind_processor(_DIALECT), _array_type(kind)


def _array_type(kind: Any) -> str:
    """The SQL array type of a column's values (the types projection tables use)."""
    base = kind.impl if isinstance(kind, TypeDecorator) else kind
    if isinstance(base, Integer):
        return "bigint[]"
    if isinstance(base, String):
        return "text[]"
    if isinstance(base, Float):
        return "float8[]"
    if isinstance(base, Boolean):
        return "boolean[]"
    if isinstance(base, DateTime):
        return "timestamptz[]" if base.timezone else "timestamp[]"
    if isinstance(base, JSON):
        return "json[]"
    raise TypeError(f"no array type for {kind!r}")


# Binds as the engines do: their JSON serializer is artstore's (`serialize`).
_DIALECT = postgresql.asyncpg.dialect(json_serializer=serialize)


def _function_not_offered(exc: BaseException | None) -> bool:
    """Whether `exc` (a driver error, also wrapped in artstore's) says that the function of
    migration 0010 is missing (a schema before 0010) or may not be run (set_config
    revoked), rather than anything else going wrong: the SQLSTATE says which error, and
    the function's name in the message which function (PostgreSQL has no field for it)."""
    if exc is None or RECORDER.error_kind(exc) is not ErrorKind.UNDEFINED_FUNCTION:
        return False
    said = " ".join(str(cause) for cause in causes(exc))
    return "artstore_insert_events" in said or "set_config" in said


class PostgresWriter(Writer):
    """Write transactions on a connection of the writer's own, kept for the store's life,
    each holding the append lock from its INSERT into `events` until it commits."""

    def __init__(self, database: PostgresDatabase) -> None:
        self.database = database
        self._connection: AsyncConnection | None = None
        # Whether `artstore_insert_events` (migration 0010) may be run: appends with
        # nothing to project then commit in one statement, and transactions whose
        # projections need no order share the append lock.
        self.side_by_side_appends = True

    async def _writer_connection(self) -> AsyncConnection:
        if self._connection is None:
            self._connection = await self.database.open_connection(self.database.writer_engine)
        return self._connection

    # New blobs and projection rows go into the statement (`_insert_statement`).
    projects_in_statement = True

    async def commit(self, batch: WriteBatch) -> None:
        if batch.rows is not None and batch.inserted is not None and self.side_by_side_appends:
            batch.inserted(await self._insert_and_commit(batch))
        else:
            await self.transaction(batch.write)

    async def transaction(self, work: Callable[[Connection], T]) -> T:
        # No LOCK here: the statement trigger on `events` takes the append lock at the
        # INSERT, so that the round trips before it (stream heads, blobs, a condition)
        # run without it and appenders of other processes overlap there.
        connection = await self._writer_connection()
        try:
            return await self.database.run_write(
                lambda active: active.run_sync(work), connection=connection
            )
        except Exception as exc:
            if _function_not_offered(exc):
                self.side_by_side_appends = False  # the lock alone, from now on
            raise

    async def _insert_and_commit(self, batch: WriteBatch) -> list[int]:
        """The batch's rows in one statement that commits by itself, through the function
        of migration 0010 (it shares the append lock), with its new blobs and projection
        rows; their positions, in the rows' order."""
        connection = await self._writer_connection()
        rows = batch.rows or []
        statement, parameters = _insert_statement(rows, batch.blobs, batch.projected)
        # Autocommit for this statement alone (no BEGIN, no COMMIT of the client's):
        # switching costs no round trip, and the connection is back to its transactions
        # afterwards whatever happened.
        await connection.execution_options(isolation_level="AUTOCOMMIT")
        try:
            result = await connection.execute(statement, parameters)
            found = {row.inserted_event_id: row.inserted_position for row in result}
            await connection.commit()  # SQLAlchemy's own bookkeeping: the server committed
        except DBAPIError as exc:
            with contextlib.suppress(Exception):
                await connection.rollback()
            if _function_not_offered(exc):
                self.side_by_side_appends = False  # transactions from now on
            translated = translate_error(exc, self.database)
            if translated is exc:
                raise
            raise translated from exc
        except BaseException:
            with contextlib.suppress(Exception):
                await connection.rollback()
            raise
        finally:
            try:
                await connection.execution_options(isolation_level=READ_COMMITTED)
            except Exception:
                await self.reset()  # never run a later transaction in autocommit
        return [found[row["event_id"]] for row in rows]

    async def reset(self) -> None:
        if self._connection is not None:
            connection, self._connection = self._connection, None
            with contextlib.suppress(Exception):
                await connection.close()
