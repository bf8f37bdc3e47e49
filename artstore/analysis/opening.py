"""Opening a store to look at it, and running a user's SQL on it: the one place the viewer
(`artstore ui`) and the terminal views (`artstore trajectory`, `artstore group`) do so.

Looking never migrates nor writes: a schema older than this artstore asks for `artstore
db upgrade`, and a SQLite file that does not exist is an error, not a new database.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, TypeVar

from artstore.analysis.ids import resolve_id
from artstore.analysis.sql import query
from artstore.store import open_store

if TYPE_CHECKING:
    from artstore.analysis.ids import Kind
    from artstore.analysis.sql import QueryResult
    from artstore.store import Store

T = TypeVar("T")


async def open_for_reading(url: str | None) -> Store:
    """The store at `url` (`$ARTSTORE_URL`, then `.artstore/artstore.db`), opened read-only:
    a missing or foreign database, or an older schema, is one clear error."""
    return await open_store(url, read_only=True)


async def read_one(
    url: str | None,
    kind: Kind,
    given: str,
    detail: Callable[[Store, str], Awaitable[T]],
) -> T:
    """`detail(store, id)` of the group or rollout whose id is `given` (or starts with it),
    on the store at `url` opened for reading, closed afterwards."""
    store = await open_for_reading(url)
    try:
        return await detail(store, await resolve_id(store, kind, given))
    finally:
        await store.close()


async def run_sql(store: Store, sql: str) -> QueryResult:
    """One read-only statement, on the same guarded path as `artstore sql`."""
    return await query(store, sql)
