"""Fixtures shared by every test: each store test runs on SQLite and on PostgreSQL.

PostgreSQL comes from `ARTSTORE_TEST_POSTGRES_URL` (a server where the user may create
databases); every test gets a fresh database of its own. Without the variable the
PostgreSQL half is skipped, unless `ARTSTORE_REQUIRE_POSTGRES` is set (as `.ci/run`
does), where a missing server fails the test instead.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.pop("ARTSTORE_URL", None)  # tests never touch a user's store

POSTGRES_ENV = "ARTSTORE_TEST_POSTGRES_URL"
REQUIRE_POSTGRES_ENV = "ARTSTORE_REQUIRE_POSTGRES"


def _postgres_admin_url() -> str | None:
    url = os.environ.get(POSTGRES_ENV)
    if url:
        return url
    if os.environ.get(REQUIRE_POSTGRES_ENV):
        pytest.fail(f"{REQUIRE_POSTGRES_ENV} is set but {POSTGRES_ENV} is not")
    pytest.skip(f"PostgreSQL tests need {POSTGRES_ENV}")


def _create_postgres_database(admin_url: str) -> tuple[str, str]:
    import psycopg
    from sqlalchemy.engine import make_url

    name = f"artstore_test_{uuid.uuid4().hex[:12]}"
    admin = make_url(admin_url).set(drivername="postgresql")
    conninfo = admin.render_as_string(hide_password=False)
    try:
        with psycopg.connect(conninfo, autocommit=True) as connection:
            connection.execute(f'CREATE DATABASE "{name}"')
    except psycopg.OperationalError as exc:
        message = f"PostgreSQL at {admin.render_as_string()} is unreachable: {exc}"
        if os.environ.get(REQUIRE_POSTGRES_ENV):
            pytest.fail(message)
        pytest.skip(message)
    return conninfo, admin.set(database=name).render_as_string(hide_password=False)


def _drop_postgres_database(conninfo: str, url: str) -> None:
    import psycopg
    from sqlalchemy.engine import make_url

    name = make_url(url).database
    with psycopg.connect(conninfo, autocommit=True) as connection:
        connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The long tests (marked `slow`: crash storms, the README's blocks) first, the rest in
    their order: the workers share them out first and fill in with the short ones, so
    that no worker is left running a two-minute test after the others are done."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A URL of an empty database: a SQLite file, or a fresh PostgreSQL database."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'artstore.db'}"
        return
    yield from _fresh_postgres_database()


@pytest.fixture(params=["postgresql"])
def postgres_url(request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh PostgreSQL database, for what only PostgreSQL has (connections, roles)."""
    yield from _fresh_postgres_database()


def _fresh_postgres_database() -> Iterator[str]:
    admin_url = _postgres_admin_url()
    assert admin_url is not None
    conninfo, url = _create_postgres_database(admin_url)
    try:
        yield url
    finally:
        _drop_postgres_database(conninfo, url)


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def module_database_url(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """`database_url` shared by the tests of one module (for tests that share a browser)."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path_factory.mktemp('store') / 'artstore.db'}"
        return
    yield from _fresh_postgres_database()


@pytest.fixture
async def store(database_url: str) -> AsyncIterator:
    """An open, migrated store on each database."""
    import artstore

    opened = await artstore.open_store(database_url)
    try:
        yield opened
    finally:
        await opened.close()


@pytest.fixture
def recorded_url(database_url: str) -> str:
    """A database holding the recorded run (written, then closed: the CLI opens its own)."""
    from recorded_run import record_run

    import artstore

    async def record() -> None:
        async with await artstore.open_store(database_url) as store:
            await record_run(store)

    asyncio.run(record())
    return database_url
