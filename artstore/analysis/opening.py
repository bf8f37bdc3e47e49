"""Opening a store to look at it, and running a user's SQL on it: the one place the viewer
(`artstore ui`) and the terminal views (`artstore trajectory`, `artstore group`) do so.

Looking never migrates nor writes: a schema older than this artstore asks for `artstore
db upgrade`, and a SQLite file that does not exist is an error, not a new database.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from artstore.errors import NotFoundError

if TYPE_CHECKING:
    from artstore.analysis.sql import QueryResult
    from artstore.store import Store


async def open_for_reading(url: str | None) -> Store:
    """The store at `url` (`$ARTSTORE_URL`, then `.artstore/artstore.db`), opened to read."""
    from artstore.schema.migrate import current_revision
    from artstore.store import open_store
    from artstore.urls import resolve_url

    database_url = resolve_url(url)
    if (
        database_url.get_backend_name() == "sqlite"
        and not Path(database_url.database or "").exists()
    ):
        raise NotFoundError(f"no artstore database at {database_url.database}")
    store = await open_store(url, migrate_schema=False)
    try:
        async with store.database.read() as connection:
            revision = await connection.run_sync(current_revision)
    except BaseException:
        await store.close()
        raise
    if revision is None:
        where = store.database.display_url
        await store.close()
        raise NotFoundError(f"no artstore schema in the database at {where}: nothing recorded yet")
    return store


async def run_sql(store: Store, sql: str) -> QueryResult:
    """One read-only statement, on the same guarded path as `artstore sql`."""
    from artstore.analysis.sql import query

    return await query(store, sql)
