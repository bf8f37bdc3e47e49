"""`open_store`: the one entry point of the library."""

from __future__ import annotations

from sqlalchemy import text

from artstore.errors import DatabaseUnavailableError
from artstore.eventstore.database import Database, check_reachable, connect, translate_error
from artstore.eventstore.store import EventStore
from artstore.projections import project
from artstore.schema import migrate
from artstore.urls import resolve_url


class Store(EventStore):
    """The artstore: the event store, its projections, and what is built on them.

    Open one with `await artstore.open_store(url)`; use it with `async with`.
    """

    async def rebuild_projections(self) -> int:
        """Recompute every projection table from the event log; returns the events replayed."""
        from artstore.projections import rebuild

        await self.flush()
        return await self.database.run_write(rebuild)


async def open_store(url: str | None = None, *, migrate_schema: bool = True) -> Store:
    """Open the store at `url`, `$ARTSTORE_URL`, or `.artstore/artstore.db` here.

    The schema is brought up to date unless `migrate_schema` is False; a database written
    by a newer artstore is refused (SchemaTooNewError), and an unreachable one raises
    DatabaseUnavailableError.
    """
    database = connect(resolve_url(url))
    try:
        await check_reachable(database)
        await prepare_schema(database, upgrade=migrate_schema)
    except BaseException:
        await database.dispose()
        raise
    return Store(database, projector=project)


async def prepare_schema(database: Database, *, upgrade: bool) -> str | None:
    """Check the schema revision and migrate to head when allowed; returns the revision."""

    async def work(connection) -> str | None:
        if database.dialect == "postgresql":
            # One migrator at a time when several workers open a fresh database together.
            await connection.execute(text("SELECT pg_advisory_xact_lock(7021802808247546470)"))
        found = await connection.run_sync(migrate.check_revision, upgrade_allowed=upgrade)
        if upgrade and found != migrate.head_revision():
            await connection.run_sync(migrate.upgrade)
        return await connection.run_sync(migrate.current_revision)

    try:
        return await database.run_write(work)
    except (DatabaseUnavailableError, OSError) as exc:
        raise translate_error(exc, database) from None
