"""Alembic environment for artstore.

artstore runs migrations itself (`artstore db upgrade`, or on opening a store) and hands
Alembic an open connection in `config.attributes["connection"]`. Running `alembic -c
migrations/alembic.ini ...` by hand also works (to write a new revision): the URL then
comes from `sqlalchemy.url`, `$ARTSTORE_URL`, or the default SQLite file.
"""

from __future__ import annotations

import asyncio

from alembic import context
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import create_async_engine

from artstore.schema.tables import metadata
from artstore.urls import resolve_url

config = context.config


def run_with_connection(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=metadata,
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


async def run_with_new_engine() -> None:
    engine = create_async_engine(resolve_url(config.get_main_option("sqlalchemy.url")))
    async with engine.begin() as connection:
        await connection.run_sync(run_with_connection)
    await engine.dispose()


connection = config.attributes.get("connection")
if context.is_offline_mode():
    context.configure(
        url=str(resolve_url(config.get_main_option("sqlalchemy.url"))),
        target_metadata=metadata,
        literal_binds=True,
    )
    with context.begin_transaction():
        context.run_migrations()
elif connection is not None:
    run_with_connection(connection)
else:
    asyncio.run(run_with_new_engine())
