"""Fixtures shared by every test: each store test runs on SQLite and on PostgreSQL.

PostgreSQL comes from `ARTSTORE_TEST_POSTGRES_URL` (a server where the user may create
databases); every test gets a fresh database of its own. Without the variable the
PostgreSQL half is skipped, unless `ARTSTORE_REQUIRE_POSTGRES` is set (as `.ci/run`
does), where a missing server fails the test instead.

A test's database comes migrated: a copy of one that each test process migrated once (a
SQLite file copied, a PostgreSQL database created from it as a template), because running
the migrations took 0.35 s per SQLite store and 0.7 s per PostgreSQL one, a sixth of the
suite's time. Tests of the migrations themselves, and of what happens to a database
artstore never touched, take `empty_database_url` or `empty_postgres_url`.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import sqlite3
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.engine import make_url
from xdist.scheduler import LoadScopeScheduling

# The helpers shared by tests (tests/support) import as top-level modules:
# `from recorded_run import record_run` (forkserver processes inherit this sys.path).
sys.path.insert(0, str(Path(__file__).parent / "support"))
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


def _create_postgres_database(admin_url: str, template: str | None = None) -> tuple[str, str]:
    import psycopg

    name = f"artstore_test_{uuid.uuid4().hex[:12]}"
    admin = make_url(admin_url).set(drivername="postgresql")
    conninfo = admin.render_as_string(hide_password=False)
    from_template = f' TEMPLATE "{template}"' if template else ""
    try:
        with psycopg.connect(conninfo, autocommit=True) as connection:
            connection.execute(f'CREATE DATABASE "{name}"{from_template}')
    except psycopg.OperationalError as exc:
        message = f"PostgreSQL at {admin.render_as_string()} is unreachable: {exc}"
        if os.environ.get(REQUIRE_POSTGRES_ENV):
            pytest.fail(message)
        pytest.skip(message)
    return conninfo, admin.set(database=name).render_as_string(hide_password=False)


def _drop_postgres_database(conninfo: str, url: str) -> None:
    import psycopg

    name = make_url(url).database
    with psycopg.connect(conninfo, autocommit=True) as connection:
        connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The long tests (marked `slow`: crash storms, the README's blocks) first, the rest in
    their order: the workers, handed a unit of work at a time (SharedFixtureUnits), share
    them out first and fill in with the short ones, so that no worker is left running a
    two-minute test after the others are done."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """xdist hands out work a unit at a time, in the order above (see SharedFixtureUnits)."""
    return SharedFixtureUnits(config, log)


class SharedFixtureUnits(LoadScopeScheduling):
    """Units of work for xdist: one test, or all the tests of a module that defines a
    module-scoped fixture (a recorded store and a browser, a process server that imported
    ART), one unit per database. Handed out test by test, each of the four workers built
    such a fixture again: a viewer's store took 25-30 s to fill on a loaded machine, up to
    eight times per run. (xdist's own `loadgroup` marks cannot do this under pytest 9.2:
    xdist renames node ids through an attribute pytest no longer reads.)"""

    def _split_scope(self, nodeid: str) -> str:
        path = nodeid.split("::", 1)[0]
        if path not in modules_with_shared_fixtures(str(self.config.rootpath)):
            return nodeid
        params = nodeid.rpartition("[")[2].rstrip("]").split("-")
        databases = [p for p in ("sqlite", "postgresql") if p in params]
        return f"{path}[{','.join(databases)}]"


@cache
def modules_with_shared_fixtures(root: str) -> frozenset[str]:
    """The test modules (paths from the root) that define a module-scoped fixture."""
    return frozenset(
        path.relative_to(root).as_posix()
        for path in Path(root, "tests").rglob("test_*.py")
        if 'scope="module"' in path.read_text()
    )


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(
    request: pytest.FixtureRequest, tmp_path: Path, migrated_templates: MigratedTemplates
) -> Iterator[str]:
    """A URL of a fresh database at artstore's current schema, holding nothing: a SQLite
    file, or a PostgreSQL database of its own."""
    if request.param == "sqlite":
        yield migrated_templates.sqlite_copy(tmp_path / "artstore.db")
        return
    yield from migrated_templates.postgres_copy()


@pytest.fixture(params=["postgresql"])
def postgres_url(migrated_templates: MigratedTemplates) -> Iterator[str]:
    """A fresh PostgreSQL database at the current schema, for what only PostgreSQL has
    (connections, roles)."""
    yield from migrated_templates.postgres_copy()


@pytest.fixture(params=["sqlite", "postgresql"])
def empty_database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A URL of a database artstore never touched: no SQLite file yet, or an empty
    PostgreSQL database."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'artstore.db'}"
        return
    yield from _fresh_postgres_database()


@pytest.fixture
def other_database_url(database_url: str, tmp_path: Path) -> Iterator[str]:
    """A second database of the kind `database_url` is, that artstore never touched."""
    if database_url.startswith("sqlite"):
        yield f"sqlite:///{tmp_path / 'other.db'}"
        return
    yield from _fresh_postgres_database()


@pytest.fixture(params=["postgresql"])
def empty_postgres_url() -> Iterator[str]:
    """An empty PostgreSQL database that artstore never touched."""
    yield from _fresh_postgres_database()


def _fresh_postgres_database(template: str | None = None) -> Iterator[str]:
    admin_url = _postgres_admin_url()
    assert admin_url is not None
    conninfo, url = _create_postgres_database(admin_url, template)
    try:
        yield url
    finally:
        _dropped_later(conninfo, url)


# A test's PostgreSQL database is dropped by a thread of its process while the next tests
# run: DROP DATABASE waits on a checkpoint of what the copies wrote, about a second each
# on this machine's disk, which the test's process spent waiting after every test.
_drops: list[Future[None]] = []
_dropper = ThreadPoolExecutor(max_workers=1, thread_name_prefix="drop-database")


def _dropped_later(conninfo: str, url: str) -> None:
    _drops.append(_dropper.submit(_drop_postgres_database, conninfo, url))


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Every database dropped before the process ends; a drop that failed is said."""
    _dropper.shutdown(wait=True)
    for drop in _drops:
        if drop.exception() is not None:
            print(f"a test database was not dropped: {drop.exception()}", file=sys.stderr)


class MigratedTemplates:
    """One migrated database per test process and database kind, made on first use, and
    the copies of it that tests get."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._sqlite: Path | None = None
        self._postgres: tuple[str, str] | None = None  # (admin conninfo, template url)

    def sqlite_copy(self, path: Path) -> str:
        if self._sqlite is None:
            template = self.folder / "template.db"
            _migrate(f"sqlite:///{template}")
            with sqlite3.connect(template) as connection:  # everything in the main file
                connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            self._sqlite = template
        shutil.copyfile(self._sqlite, path)
        return f"sqlite:///{path}"

    def postgres_copy(self) -> Iterator[str]:
        if self._postgres is None:
            admin_url = _postgres_admin_url()
            assert admin_url is not None
            conninfo, url = _create_postgres_database(admin_url)
            self._postgres = (conninfo, url)
            _migrate(url)  # and closed: a template must have no session
        yield from _fresh_postgres_database(template=make_url(self._postgres[1]).database)

    def drop(self) -> None:
        if self._postgres is not None:
            _drop_postgres_database(*self._postgres)


@pytest.fixture(scope="session")
def migrated_templates(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MigratedTemplates]:
    templates = MigratedTemplates(tmp_path_factory.mktemp("templates"))
    try:
        yield templates
    finally:
        templates.drop()


def _migrate(url: str) -> None:
    import artstore

    async def migrate() -> None:
        store = await artstore.open_store(url)
        await store.close()

    asyncio.run(migrate())


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
