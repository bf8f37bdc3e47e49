"""Read-only SQL over a store: what `artstore sql` runs.

    result = await artstore.analysis.query(store, "SELECT * FROM v_runs")
    async with artstore.analysis.stream_query(store, sql) as rows:
        print(rows.columns)
        async for row in rows:
            ...

Safe by construction, in layers that do not depend on each other:

1. the parser (sqlglot, in the store's dialect): one statement, a query (SELECT, VALUES,
   WITH ... SELECT, EXPLAIN of those) with nothing that writes anywhere in it (a
   data-modifying CTE, SELECT INTO, FOR UPDATE), and no call of a function that changes
   the session, runs SQL given as text or takes locks;
2. the database: PostgreSQL runs the query as the role `artstore_reader`, which may read
   the views and nothing else, in a READ ONLY transaction with a statement timeout;
   SQLite opens the file read-only (`mode=ro`), with an authorizer that lets the query
   read the views and nothing else, and a progress handler that stops it at the timeout;
3. rows are streamed (a server-side cursor on PostgreSQL), never all held in memory.

Values come back the same from both databases: timestamps as UTC text, booleans as 0/1,
JSON as its text, PostgreSQL's numerics as int or float.
"""

from __future__ import annotations

import datetime as dt
import functools
import re
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from decimal import Decimal
from typing import Any, NamedTuple

import sqlglot
from sqlalchemy import text
from sqlglot import exp
from sqlglot.errors import ParseError, TokenError

from artstore.errors import ArtstoreError, DatabaseUnavailableError, QueryError, QueryRefusedError
from artstore.eventstore.database import Database

DEFAULT_TIMEOUT_S = 30.0
BATCH_SIZE = 1000

# sqlglot's name for each database.
_DIALECTS = {"sqlite": "sqlite", "postgresql": "postgres"}
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
# Functions a query must not call: they change the session (set_config leaves the
# reader role), run SQL given as text (query_to_xml, dblink), or take locks that the
# store's writers and trainers use (advisory locks). The database refuses the rest.
_REFUSED_FUNCTIONS = re.compile(
    r"^(set_config|dblink\w*|\w*_to_xml\w*|pg_(try_)?advisory\w*|load_extension)$"
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


async def query(store: Any, sql: str, *, timeout: float | None = DEFAULT_TIMEOUT_S) -> QueryResult:
    """Run one read-only query on `store` (a Store, EventStore or Database); all its rows.

    Raises QueryRefusedError for anything but one query that reads the views, QueryError
    when the database reports an error in it or it runs longer than `timeout` seconds
    (None: no limit).
    """
    async with stream_query(store, sql, timeout=timeout) as rows:
        return QueryResult(rows.columns, [row async for row in rows])


@asynccontextmanager
async def stream_query(
    store: Any, sql: str, *, timeout: float | None = DEFAULT_TIMEOUT_S
) -> AsyncIterator[QueryRows]:
    """`query`, with the rows streamed as the database sends them."""
    database: Database = getattr(store, "database", store)
    statement = read_only_statement(sql, database.dialect)
    if hasattr(store, "flush"):
        await store.flush()  # see what this process appended
    async with stream_read_only(database, statement, timeout=timeout) as rows:
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
        parsed = sqlglot.parse(sql, read=_DIALECTS[dialect])
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
        if isinstance(node, exp.Func):
            name = (node.name if isinstance(node, exp.Anonymous) else node.sql_name()).lower()
            if _REFUSED_FUNCTIONS.match(name):
                raise QueryRefusedError(f"refused: artstore sql does not call {name}()")


def _strip(sql: str) -> str:
    """`sql` without the blanks and `;` after its statement (the one statement is checked)."""
    text = sql.strip()
    while text.endswith(";"):
        text = text[:-1].rstrip()
    return text


# --- the database -------------------------------------------------------------------------


@asynccontextmanager
async def stream_read_only(
    database: Database, statement: str, *, timeout: float | None = DEFAULT_TIMEOUT_S
) -> AsyncIterator[QueryRows]:
    """Run `statement` confined by the database alone (the text is not checked here)."""
    async with database.query_session(timeout) as session:
        # SQLite's clock counts the work of each batch, as PostgreSQL's statement timeout
        # counts each fetch from its cursor.
        restart_clock = session.info.get("restart_clock", lambda: None)
        try:
            # The text as given: `:name` is not a parameter to SQLAlchemy here.
            result = await session.stream(text(statement.replace(":", "\\:")))
        except Exception as exc:  # the driver's, adapted by SQLAlchemy or not (a cursor's)
            raise _query_error(exc, database, timeout) from None
        columns = list(result.keys())

        async def batches() -> AsyncIterator[list[tuple[Any, ...]]]:
            while True:
                restart_clock()
                try:
                    batch = await result.fetchmany(BATCH_SIZE)
                except Exception as exc:
                    raise _query_error(exc, database, timeout) from None
                if not batch:
                    return
                yield [tuple(row) for row in batch]

        try:
            yield QueryRows(columns, batches())
        finally:
            await result.close()  # the connection goes back to its pool without a cursor


async def run_read_only(
    database: Database, statement: str, *, timeout: float | None = DEFAULT_TIMEOUT_S
) -> QueryResult:
    """`stream_read_only`, all rows at once."""
    async with stream_read_only(database, statement, timeout=timeout) as rows:
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
)
_SEVERAL = (
    "multiple commands",  # asyncpg: cannot insert multiple commands into a prepared statement
    "one statement at a time",  # sqlite3
)
_TIMEOUTS = (
    "statement timeout",  # PostgreSQL: canceling statement due to statement timeout
    "interrupted",  # SQLite: the progress handler
)


def _query_error(exc: Exception, database: Database, timeout: float | None) -> Exception:
    if isinstance(exc, ArtstoreError):
        return exc
    text = str(getattr(exc, "orig", None) or exc).strip()
    # asyncpg's errors, adapted by SQLAlchemy, read "<class '...'>: message".
    message = re.sub(r"^<class '[^']+'>:\s*", "", text.splitlines()[0] if text else "")
    lowered = message.lower()
    if any(part in lowered for part in _TIMEOUTS):
        return QueryError(
            f"the query ran longer than its time limit ({timeout:g} s) and was stopped "
            "(artstore sql --timeout SECONDS allows more)"
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
        from artstore.eventstore.blobs import canonical_json

        return canonical_json(value)
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).hex()
    if isinstance(value, uuid.UUID):
        return str(value)
    return str(value)
