"""Read-only SQL over a store: what `artstore sql` runs.

    columns, rows = await artstore.analysis.query(store, "SELECT * FROM v_runs")

A query is one statement that reads. Two independent guards make sure of it:

1. the text: one statement only (`;` inside strings, quoted names and comments is fine),
   starting with SELECT, WITH, VALUES or EXPLAIN, and naming no statement that writes
   (INSERT, UPDATE, DELETE, DROP, ATTACH, PRAGMA...) even inside a CTE;
2. the database: PostgreSQL runs it in a `READ ONLY` transaction; SQLite runs it with
   `PRAGMA query_only` on and an authorizer that refuses ATTACH, DETACH and turning
   `query_only` off; both drivers refuse a second statement themselves. The connection
   is discarded afterwards, so nothing the query did to its session outlives it.

This keeps an analyst from changing a store by accident; it is not a sandbox against
someone who holds the database's credentials anyway (they can run `psql`).

Values come back the same from both databases: timestamps as UTC text, booleans as 0/1,
JSON as its canonical text, PostgreSQL's numerics as int or float.
"""

from __future__ import annotations

import datetime as dt
import re
import uuid
from decimal import Decimal
from typing import Any, NamedTuple

from sqlalchemy.exc import DBAPIError

from artstore.errors import DatabaseUnavailableError, QueryError, QueryRefusedError
from artstore.eventstore.blobs import canonical_json
from artstore.eventstore.database import Database

READING_STATEMENTS = ("SELECT", "WITH", "VALUES", "EXPLAIN")
# Words that only a statement that writes (or changes the session) contains. (Statements
# that start otherwise than READING_STATEMENTS are refused anyway: this catches them
# inside a query, like PostgreSQL's `WITH gone AS (DELETE ...) SELECT ...`.)
WRITING_WORDS = frozenset(
    {
        "ALTER",
        "ATTACH",
        "CALL",
        "COPY",
        "CREATE",
        "DELETE",
        "DETACH",
        "DROP",
        "GRANT",
        "INSERT",
        "MERGE",
        "PRAGMA",
        "REINDEX",
        "REVOKE",
        "TRUNCATE",
        "UPDATE",
        "VACUUM",
    }
)


class QueryResult(NamedTuple):
    columns: list[str]
    rows: list[tuple[Any, ...]]


async def query(store: Any, sql: str) -> QueryResult:
    """Run one read-only statement on `store` (a Store, EventStore or Database).

    Raises QueryRefusedError for anything but one statement that reads, QueryError when
    the database reports an error in the query.
    """
    database: Database = getattr(store, "database", store)
    if hasattr(store, "flush"):
        await store.flush()  # see what this process appended
    statement = read_only_statement(sql, database.dialect)
    return await run_read_only(database, statement)


# --- the text -----------------------------------------------------------------------------


def read_only_statement(sql: str, dialect: str) -> str:
    """The one statement of `sql`, without its trailing `;`, if it only reads."""
    statements = _split(sql, dialect)
    if not statements:
        raise QueryRefusedError("the query is empty: give one SELECT statement")
    if len(statements) > 1:
        raise QueryRefusedError(
            f"refused: the query holds {len(statements)} statements; artstore sql runs "
            "exactly one read-only statement (no `;` between statements)"
        )
    text, code = statements[0]
    words = re.findall(r"[A-Za-z_][A-Za-z0-9_$]*", code)
    first = words[0].upper() if words else ""
    if first not in READING_STATEMENTS:
        raise QueryRefusedError(
            f"refused: artstore sql only reads, and {first or 'this'} is not a query "
            f"(start with {', '.join(READING_STATEMENTS[:-1])} or {READING_STATEMENTS[-1]})"
        )
    writing = sorted({word.upper() for word in words} & WRITING_WORDS)
    if writing:
        raise QueryRefusedError(
            f"refused: artstore sql only reads, and the query contains {writing[0]}"
        )
    return text


def _split(sql: str, dialect: str) -> list[tuple[str, str]]:
    """The statements of `sql` as (text, code without strings and comments), empty ones
    left out. Quotes and comments follow the dialect: PostgreSQL's dollar quotes, E''
    strings and nested comments; SQLite's `names` and [names]."""
    statements: list[tuple[str, str]] = []
    start, i, n = 0, 0, len(sql)
    code: list[str] = []
    postgres = dialect == "postgresql"
    while i < n:
        ch = sql[i]
        if sql.startswith("--", i):
            end = sql.find("\n", i)
            i = n if end < 0 else end + 1
            code.append(" ")
        elif sql.startswith("/*", i):
            i = _block_comment_end(sql, i, nested=postgres)
            code.append(" ")
        elif ch == "'":
            backslashes = postgres and i > 0 and sql[i - 1] in "eE" and not _word_before(sql, i - 1)
            i = _quote_end(sql, i, "'", backslashes)
            code.append(" '' ")
        elif ch == '"' or (not postgres and ch == "`"):
            i = _quote_end(sql, i, ch, False)
            code.append(' "" ')
        elif not postgres and ch == "[":
            end = sql.find("]", i + 1)
            i = n if end < 0 else end + 1
            code.append(' "" ')
        elif postgres and ch == "$" and (tag := re.match(r"\$([A-Za-z_]\w*)?\$", sql[i:])):
            if _word_before(sql, i):  # `a$b$` is a name, not a quote
                code.append(ch)
                i += 1
                continue
            end = sql.find(tag.group(0), i + len(tag.group(0)))
            i = n if end < 0 else end + len(tag.group(0))
            code.append(" '' ")
        elif ch == ";":
            _keep(statements, sql[start:i], code)
            start, i, code = i + 1, i + 1, []
        else:
            code.append(ch)
            i += 1
    _keep(statements, sql[start:], code)
    return statements


def _keep(statements: list[tuple[str, str]], text: str, code: list[str]) -> None:
    joined = "".join(code)
    if joined.strip():
        statements.append((text.strip(), joined))


def _word_before(sql: str, i: int) -> bool:
    return i > 0 and (sql[i - 1].isalnum() or sql[i - 1] in "_$")


def _quote_end(sql: str, i: int, quote: str, backslashes: bool) -> int:
    """The index after the quoted text starting at `i` (doubled quotes stay inside)."""
    j = i + 1
    while j < len(sql):
        if backslashes and sql[j] == "\\":
            j += 2
        elif sql[j] == quote:
            if sql.startswith(quote * 2, j):
                j += 2
            else:
                return j + 1
        else:
            j += 1
    return len(sql)


def _block_comment_end(sql: str, i: int, nested: bool) -> int:
    depth, j = 0, i
    while j < len(sql):
        if sql.startswith("/*", j):
            depth = depth + 1 if nested or depth == 0 else depth
            j += 2
        elif sql.startswith("*/", j):
            depth -= 1
            j += 2
            if depth == 0:
                return j
        else:
            j += 1
    return len(sql)


# --- the database -------------------------------------------------------------------------


async def run_read_only(database: Database, statement: str) -> QueryResult:
    """Run `statement` in a read-only transaction on a connection used for nothing else.

    The text is not checked here (see `read_only_statement`): the database itself refuses
    anything that writes.
    """
    async with database.read() as connection:
        try:
            await database.confine_query(connection)
            result = await connection.exec_driver_sql(statement)
            if not result.returns_rows:
                return QueryResult([], [])
            columns = list(result.keys())
            rows = [tuple(plain(value) for value in row) for row in result.fetchall()]
            return QueryResult(columns, rows)
        except DBAPIError as exc:
            raise _query_error(exc, database) from None
        finally:
            await connection.invalidate()  # its session state dies with it


_REFUSALS = (
    "read-only transaction",  # PostgreSQL: cannot execute DELETE in a read-only transaction
    "readonly database",  # SQLite: attempt to write a readonly database (query_only)
    "not authorized",  # SQLite: the authorizer
)
_SEVERAL = (
    "multiple commands",  # asyncpg: cannot insert multiple commands into a prepared statement
    "one statement at a time",  # sqlite3
)


def _query_error(exc: DBAPIError, database: Database) -> Exception:
    text = str(exc.orig or exc).strip()
    # asyncpg's errors, adapted by SQLAlchemy, read "<class '...'>: message".
    message = re.sub(r"^<class '[^']+'>:\s*", "", text.splitlines()[0] if text else "")
    lowered = message.lower()
    if any(part in lowered for part in _REFUSALS):
        return QueryRefusedError(
            f"refused: artstore sql only reads, and the database refused a write ({message})"
        )
    if any(part in lowered for part in _SEVERAL):
        return QueryRefusedError(f"refused: artstore sql runs exactly one statement ({message})")
    if exc.connection_invalidated or _is_connection_error(exc):
        return DatabaseUnavailableError(
            f"cannot use the database at {database.display_url}: {message}"
        )
    return QueryError(f"the query failed: {message or type(exc.orig).__name__}")


def _is_connection_error(exc: DBAPIError) -> bool:
    name = type(exc.orig).__name__
    return "Connection" in name or "Interface" in name or isinstance(exc.orig, OSError)


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
