"""Read-only SQL over a store: what `artstore sql` runs.

    result = await artstore.analysis.query(store, "SELECT * FROM v_runs")
    async with artstore.analysis.stream_query(store, sql) as rows:
        print(rows.columns)
        async for row in rows:
            ...

Confined by the database; the parser only explains refusals early:

1. the parser (sqlglot, in the store's dialect): one statement, a query (SELECT, VALUES,
   WITH ... SELECT, EXPLAIN of those) with nothing that writes anywhere in it (a
   data-modifying CTE, SELECT INTO, FOR UPDATE), refused in words of its own;
2. the database: PostgreSQL runs the query as the role `artstore_reader`, which may read
   the views and run the functions of an allow-list and nothing else
   (artstore/eventstore/reader_role.py), in a READ ONLY transaction; SQLite opens the file
   read-only (`mode=ro`), with an authorizer that lets the query read the views and
   nothing else;
3. bounds: one deadline for the whole query (PostgreSQL's statement timeout, SQLite's
   progress handler, and the session's own clock over every fetch), and bytes: the query
   runs wrapped so that the database flags a row, or rows of a fetch, past `Bounds`
   instead of sending them (artstore/analysis/bounded.py); rows are streamed (a
   server-side cursor on PostgreSQL), never all held in memory.

Values come back the same from both databases: timestamps as UTC text, booleans as 0/1,
JSON as its text, PostgreSQL's numerics as int or float.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import functools
import re
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from decimal import Decimal
from typing import Any, NamedTuple, TypeVar

import sqlglot
from sqlalchemy import text
from sqlalchemy.exc import ResourceClosedError
from sqlglot import exp
from sqlglot.errors import ParseError, TokenError

from artstore.analysis.bounded import Bounds, bounded_statement, first_word
from artstore.errors import (
    ArtstoreError,
    DatabaseUnavailableError,
    QueryError,
    QueryRefusedError,
    ResultTooLargeError,
)
from artstore.eventstore.blobs import canonical_json
from artstore.eventstore.database import USER_QUERY_ROW_BYTES, Database, database_class_named

DEFAULT_TIMEOUT_S = 30.0
T = TypeVar("T")

# sqlglot's name for each database.
# Nodes of statements that write or change the database or the session.
_WRITING = (
    exp.Insert,
    exp.Update,
    exp.Delete,
    exp.Merge,
    exp.Create,
    exp.Drop,
    exp.Alter,
    exp.TruncateTable,
    exp.Copy,
    exp.Command,
    exp.Pragma,
    exp.Set,
    exp.Transaction,
    exp.Commit,
    exp.Rollback,
    exp.Grant,
    exp.Attach,
    exp.Detach,
    exp.Use,
    exp.Into,
    exp.Lock,
)
_READING = (exp.Select, exp.SetOperation, exp.Values, exp.Subquery)
_EXPLAIN = re.compile(
    r"^\s*EXPLAIN\b(\s+QUERY\s+PLAN\b|\s*\([^()]*\)|(\s+(ANALY[SZ]E|VERBOSE)\b)*)",
    re.IGNORECASE,
)


class QueryResult(NamedTuple):
    columns: list[str]
    rows: list[tuple[Any, ...]]


class QueryRows:
    """The rows of a running query, as they come: `async for row in rows`."""

    def __init__(self, columns: list[str], batches: AsyncIterator[list[tuple[Any, ...]]]):
        self.columns = columns
        self._batches = batches

    async def batches(self) -> AsyncIterator[list[tuple[Any, ...]]]:
        async for batch in self._batches:
            yield [tuple(plain(value) for value in row) for row in batch]

    async def __aiter__(self) -> AsyncIterator[tuple[Any, ...]]:
        async for batch in self.batches():
            for row in batch:
                yield row


async def query(
    store: Any, sql: str, *, timeout: float | None = DEFAULT_TIMEOUT_S, bounds: Bounds = Bounds()
) -> QueryResult:
    """Run one read-only query on `store` (a Store, EventStore or Database); all its rows.

    Raises QueryRefusedError for anything but one query that reads the views, QueryError
    when the database reports an error in it or it runs longer than `timeout` seconds in
    all (None: no limit), ResultTooLargeError when its rows go past `bounds`.
    """
    async with stream_query(store, sql, timeout=timeout, bounds=bounds) as rows:
        return QueryResult(rows.columns, [row async for row in rows])


@asynccontextmanager
async def stream_query(
    store: Any, sql: str, *, timeout: float | None = DEFAULT_TIMEOUT_S, bounds: Bounds = Bounds()
) -> AsyncIterator[QueryRows]:
    """`query`, with the rows streamed as the database sends them."""
    database: Database = getattr(store, "database", store)
    statement = read_only_statement(sql, database.dialect)
    if hasattr(store, "flush"):
        await store.flush()  # see what this process appended
    async with stream_read_only(database, statement, timeout=timeout, bounds=bounds) as rows:
        yield rows


# --- the parser ---------------------------------------------------------------------------


@functools.lru_cache(maxsize=256)
def read_only_statement(sql: str, dialect: str) -> str:
    """The one statement of `sql`, without its trailing `;`, if it is a query that only reads.

    Kept for the texts checked last (a refused text raises, and is not kept): a notebook
    or dashboard runs the same queries again, and parsing one (sqlglot) takes 0.1-2 ms.
    """
    statements = _parse(sql, dialect)
    if not statements:
        raise QueryRefusedError("the query is empty: give one SELECT statement")
    if len(statements) > 1:
        raise QueryRefusedError(
            f"refused: the query holds {len(statements)} statements; artstore sql runs "
            "exactly one read-only statement (no `;` between statements)"
        )
    (statement,) = statements
    if isinstance(statement, exp.Command) and statement.name.upper() == "EXPLAIN":
        explained = _EXPLAIN.match(sql.strip().rstrip(";"))
        if explained is None:
            raise QueryRefusedError("refused: EXPLAIN with options artstore sql cannot check")
        read_only_statement(sql.strip().rstrip(";")[explained.end() :], dialect)
        return sql.strip().rstrip(";").strip()
    _check_reads_only(statement)
    return _strip(sql)


def _parse(sql: str, dialect: str) -> list[exp.Expression]:
    try:
        parsed = sqlglot.parse(sql, read=database_class_named(dialect).sql_syntax.sqlglot_dialect)
    except (ParseError, TokenError) as exc:
        raise QueryRefusedError(
            f"refused: the query does not parse: {_syntax_error(exc)}"
        ) from None
    return [statement for statement in parsed if statement is not None]


_MISSING_PART = re.compile(r"Required keyword: '\w+' missing for <class '(?:[\w.]*\.)?(\w+)'>")


def _syntax_error(exc: ParseError | TokenError) -> str:
    """What is wrong and where, in the user's words rather than the parser's internals
    (sqlglot names its own classes: "Required keyword: 'this' missing for <class ...>")."""
    errors = getattr(exc, "errors", None) or []
    if not errors:  # the tokenizer: a quote or a comment that is not closed
        return "a quote or a comment is not closed (or a character is not SQL)"
    error = errors[0]
    description = str(error.get("description") or "").strip()
    near = str(error.get("highlight") or "").strip()
    missing = _MISSING_PART.match(description)
    if missing is not None:
        what = f"{near or missing.group(1).upper()} is not complete"
    elif description.startswith("Invalid expression / Unexpected token"):
        what = f"unexpected {near!r}" if near else "unexpected end of the query"
        before = str(error.get("start_context") or "").split()
        what += f" after {before[-1]!r}" if near and before else ""
    elif description.startswith("Expecting "):
        what = f"expected {description.removeprefix('Expecting ').strip()}"
        what += f" near {near!r}" if near else ""
    else:
        what = re.sub(r"<class '(?:[\w.]*\.)?(\w+)'>", r"\1", description) or type(exc).__name__
    line, column = error.get("line"), error.get("col")
    if not isinstance(line, int) or not isinstance(column, int):
        return what
    if near:  # sqlglot points at the last character of the token; say where it starts
        column = max(1, column - len(str(error.get("highlight"))) + 1)
    return f"{what} (line {line}, column {column})"


def _check_reads_only(statement: exp.Expression) -> None:
    if not isinstance(statement, _READING):
        kind = statement.key.upper() if statement.key else type(statement).__name__
        raise QueryRefusedError(
            f"refused: artstore sql only reads, and {kind} is not a query "
            "(start with SELECT, WITH, VALUES or EXPLAIN)"
        )
    for node in statement.walk():
        if isinstance(node, _WRITING):
            raise QueryRefusedError(
                f"refused: artstore sql only reads, and the query contains {node.key.upper()}"
            )
        if isinstance(node, exp.Select) and node.args.get("locks"):
            raise QueryRefusedError("refused: artstore sql only reads (no FOR UPDATE/SHARE)")


def _strip(sql: str) -> str:
    """`sql` without the blanks and `;` after its statement (the one statement is checked)."""
    text = sql.strip()
    while text.endswith(";"):
        text = text[:-1].rstrip()
    return text


# --- the database -------------------------------------------------------------------------


@asynccontextmanager
async def stream_read_only(
    database: Database,
    statement: str,
    *,
    timeout: float | None = DEFAULT_TIMEOUT_S,
    bounds: Bounds = Bounds(),
) -> AsyncIterator[QueryRows]:
    """Run `statement` confined by the database alone (the text is not checked here),
    within `timeout` seconds in all and `bounds`."""
    statement = _strip(statement)
    deadline = _Deadline(timeout)
    async with database.query_session(timeout) as session:

        async def step(work: Callable[[], Awaitable[T]], *, bounded: bool = False) -> T:
            try:
                return await deadline.run(work, session.info["stop_query"])
            except ArtstoreError:
                raise
            except Exception as exc:  # the driver's, adapted by SQLAlchemy or not (a cursor's)
                raise _query_error(exc, database, timeout, bounded=bounded) from None

        plan = await step(lambda: _plan(database, session, statement, bounds))
        result = await step(lambda: session.stream(_text(plan.statement)), bounded=plan.flagged)
        try:
            columns = plan.columns or list(result.keys())
        except ResourceClosedError:  # a statement that returns no rows (SET, say)
            columns = []

        async def batches() -> AsyncIterator[list[tuple[Any, ...]]]:
            handed = 0
            while columns:
                batch = await step(lambda: result.fetchmany(bounds.batch_rows))
                rows, over = _unflagged(batch) if plan.flagged else ([*map(tuple, batch)], False)
                handed += len(rows)
                if rows:
                    yield rows
                if over:
                    raise ResultTooLargeError(
                        f"the query's rows are too large: artstore sql hands over "
                        f"{bounds.describe()}, and row {handed + 1} goes past that; select "
                        "fewer or shorter columns (substr, length) or fewer rows"
                    )
                if not batch:
                    return

        try:
            yield QueryRows(columns, batches())
        finally:
            if not deadline.stopped:  # else the session is dropped, its cursor with it
                await result.close()  # the connection goes back to its pool without a cursor


class _Plan(NamedTuple):
    statement: str  # what runs
    columns: list[str] | None  # the result's names, when `statement` renames them
    flagged: bool  # whether the last column flags a row past the bounds


async def _plan(database: Database, session: Any, statement: str, bounds: Bounds) -> _Plan:
    if first_word(statement, database.sql_syntax) == "EXPLAIN":
        return _Plan(statement, None, False)  # a plan: rows as long as the query at most
    columns = await database.describe_query(session, statement)
    wrapped = bounded_statement(statement, columns, bounds) if columns else None
    if wrapped is None:
        return _Plan(statement, None, False)
    return _Plan(wrapped, [column.name for column in columns or ()], True)


def _unflagged(batch: Any) -> tuple[list[tuple[Any, ...]], bool]:
    """The rows of `batch` before the first one flagged past the bounds (without the flag
    column), and whether there was one."""
    rows = []
    for row in batch:
        if row[-1]:
            return rows, True
        rows.append(tuple(row[:-1]))
    return rows, False


def _text(statement: str) -> Any:
    # The text as given: `:name` is not a parameter to SQLAlchemy here.
    return text(statement.replace(":", "\\:"))


class _Deadline:
    """One deadline for everything a query does: each step of it waits for what is left;
    past it, or when the caller gives up, the query is stopped, and the session it ran on
    is dropped.

    A step runs as a task of its own, shielded: a cancelled step makes SQLAlchemy drop the
    connection at once, which on SQLite waits for the statement under way; so the
    database is told to stop first (`stop`: SQLite's progress handler), then the step is
    cancelled (asyncpg then cancels the statement on the server) and awaited."""

    def __init__(self, timeout: float | None) -> None:
        self.timeout = timeout
        self.at = None if not timeout else time.monotonic() + timeout
        self.stopped = False

    async def run(self, step: Callable[[], Awaitable[T]], stop: Callable[[], None]) -> T:
        left = None if self.at is None else self.at - time.monotonic()
        if left is not None and left <= 0:
            self.stopped = True
            raise QueryError(_time_limit(self.timeout))
        running = asyncio.ensure_future(step())
        try:
            async with asyncio.timeout(left):
                return await asyncio.shield(running)
        except TimeoutError:
            await self._stop(running, stop)
            raise QueryError(_time_limit(self.timeout)) from None
        except asyncio.CancelledError:  # the caller gave up on the query
            await self._stop(running, stop)
            raise

    async def _stop(self, running: asyncio.Future[Any], stop: Callable[[], None]) -> None:
        self.stopped = True
        stop()
        running.cancel()
        with contextlib.suppress(Exception, asyncio.CancelledError):
            await running


def _time_limit(timeout: float | None) -> str:
    return (
        f"the query ran longer than its time limit ({timeout or 0:g} s) and was stopped "
        "(artstore sql --timeout SECONDS allows more)"
    )


async def run_read_only(
    database: Database,
    statement: str,
    *,
    timeout: float | None = DEFAULT_TIMEOUT_S,
    bounds: Bounds = Bounds(),
) -> QueryResult:
    """`stream_read_only`, all rows at once."""
    async with stream_read_only(database, statement, timeout=timeout, bounds=bounds) as rows:
        return QueryResult(rows.columns, [row async for row in rows])


_REFUSALS = (
    "read-only transaction",  # PostgreSQL: cannot execute DELETE in a read-only transaction
    "permission denied",  # PostgreSQL: the reader role may read the views only
    "must be superuser",
    "must be a superuser",
    "must be a member",
    "password is required",  # dblink: a non-superuser must give a password
    "password or gssapi",
    "readonly database",  # SQLite: attempt to write a readonly database
    "not authorized",  # SQLite: the authorizer
    "prohibited",  # SQLite: access to x is prohibited (the authorizer, for a table)
    "data-modifying statement",  # PostgreSQL: DELETE ... RETURNING in a WITH of a query
)
_SEVERAL = (
    "multiple commands",  # asyncpg: cannot insert multiple commands into a prepared statement
    "one statement at a time",  # sqlite3
)
_TIMEOUTS = (
    "statement timeout",  # PostgreSQL: canceling statement due to statement timeout
    "interrupted",  # SQLite: the progress handler
)


def _query_error(
    exc: Exception, database: Database, timeout: float | None, *, bounded: bool = False
) -> Exception:
    """`exc`, raised running a user query, as artstore's error. `bounded`: raised by the
    query wrapped in its bounds, where a syntax error means that the database takes the
    statement alone but not as a query (SHOW, FETCH...)."""
    if isinstance(exc, ArtstoreError):
        return exc
    text = str(getattr(exc, "orig", None) or exc).strip()
    # asyncpg's errors, adapted by SQLAlchemy, read "<class '...'>: message".
    message = re.sub(r"^<class '[^']+'>:\s*", "", text.splitlines()[0] if text else "")
    lowered = message.lower()
    if any(part in lowered for part in _TIMEOUTS):
        return QueryError(_time_limit(timeout))
    if "string or blob too big" in lowered:  # SQLite: a value past its length limit
        return ResultTooLargeError(
            f"a value of the query is longer than {USER_QUERY_ROW_BYTES // 2**20} MiB, the "
            f"most artstore sql hands over in a row ({message}); select less of it (substr, "
            "length)"
        )
    if bounded and "syntax error" in lowered:
        return QueryRefusedError(
            "refused: artstore sql runs one query (SELECT, WITH, VALUES or EXPLAIN), and the "
            f"database does not take this statement as one ({message})"
        )
    if any(part in lowered for part in _REFUSALS):
        return QueryRefusedError(
            f"refused: artstore sql only reads the views, and the database refused ({message})"
        )
    if any(part in lowered for part in _SEVERAL):
        return QueryRefusedError(f"refused: artstore sql runs exactly one statement ({message})")
    if getattr(exc, "connection_invalidated", False) or _is_connection_error(exc):
        return DatabaseUnavailableError(
            f"cannot use the database at {database.display_url}: {message}"
        )
    return QueryError(f"the query failed: {message or type(exc).__name__}")


def _is_connection_error(exc: Exception) -> bool:
    cause = getattr(exc, "orig", None) or exc
    name = type(cause).__name__
    return "Connection" in name or "Interface" in name or isinstance(cause, OSError)


# --- values -------------------------------------------------------------------------------


def plain(value: Any) -> Any:
    """A value as both databases give it: what SQLite returns, whatever the database."""
    if value is None or isinstance(value, str | int | float):
        return int(value) if isinstance(value, bool) else value
    if isinstance(value, dt.datetime):
        if value.tzinfo is not None:
            value = value.astimezone(dt.UTC).replace(tzinfo=None)
        return value.strftime("%Y-%m-%d %H:%M:%S.%f")
    if isinstance(value, dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, dt.timedelta):
        return value.total_seconds()
    if isinstance(value, Decimal):  # PostgreSQL's numeric: sum(bigint), avg(integer)...
        exponent = value.as_tuple().exponent
        if isinstance(exponent, int) and exponent >= 0:
            return int(value)
        return float(value)
    if isinstance(value, dict | list):
        return canonical_json(value)
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).hex()
    if isinstance(value, uuid.UUID):
        return str(value)
    return str(value)
