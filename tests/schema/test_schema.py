"""Schema through Alembic only, the `artstore db` commands, and a quick import."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from datetime import UTC, datetime

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect, select, text
from sqlalchemy.ext.asyncio import create_async_engine
from typer.testing import CliRunner

import artstore
from artstore.cli import app
from artstore.events import RunFinished, new_event_id
from artstore.eventstore import NO_STREAM
from artstore.schema import migrate
from artstore.schema.tables import events, metadata
from artstore.urls import resolve_url


def downgrade_to(connection, revision: str) -> None:
    """Alembic's downgrade to `revision` on this (synchronous) connection."""
    config = migrate.alembic_config()
    config.attributes["connection"] = connection
    command.downgrade(config, revision)


async def test_migrations_create_exactly_the_declared_tables(store):
    def differences(connection):
        context = MigrationContext.configure(connection, opts={"compare_type": False})
        return compare_metadata(context, metadata)

    async with store.database.read() as connection:
        diff = await connection.run_sync(differences)
    assert diff == []


def test_the_head_revision_in_code_is_the_newest_migration_script():
    assert migrate.head_revision() == migrate.HEAD_REVISION


def test_opening_a_current_store_imports_no_alembic_and_reading_it_no_projections(
    empty_database_url,
):
    """The revision of a current store is read with one SELECT (Alembic is for migrating),
    and a store opened read-only has no projector to load (nor LangChain with it)."""

    def loaded_after(opening: str) -> dict[str, list[str]]:
        script = (
            "import asyncio, json, sys\n"
            "import artstore\n"
            "async def main():\n"
            f"    async with await artstore.open_store({empty_database_url!r}{opening}) as store:\n"
            "        assert await store.read_all() is not None\n"
            "asyncio.run(main())\n"
            "heavy = ('alembic', 'langchain_core', 'artstore.projections')\n"
            "print(json.dumps({h: [m for m in sys.modules if m.startswith(h)] for h in heavy}))\n"
        )
        done = subprocess.run(
            [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    first = loaded_after("")
    assert first["alembic"] and first["artstore.projections"]  # it migrated the empty database
    again = loaded_after("")
    assert again["alembic"] == [] and again["artstore.projections"]
    reading = loaded_after(", read_only=True")
    assert reading == {"alembic": [], "langchain_core": [], "artstore.projections": []}


def test_db_upgrade_and_current(empty_database_url):
    runner = CliRunner()
    before = runner.invoke(app, ["db", "current", "--url", empty_database_url])
    assert before.exit_code == 0 and "empty" in before.output

    upgraded = runner.invoke(app, ["db", "upgrade", "--url", empty_database_url])
    assert upgraded.exit_code == 0, upgraded.output
    assert migrate.head_revision() in upgraded.output

    current = runner.invoke(app, ["db", "current", "--url", empty_database_url])
    assert current.exit_code == 0
    assert current.output.startswith(migrate.head_revision()) and "up to date" in current.output


def test_db_commands_refuse_a_newer_schema(empty_database_url):
    async def stamp_a_future_revision() -> None:
        async with await artstore.open_store(empty_database_url) as store:
            async with store.database.write() as connection:
                await connection.execute(text("UPDATE alembic_version SET version_num = 'ffff'"))

    asyncio.run(stamp_a_future_revision())
    result = CliRunner().invoke(app, ["db", "upgrade", "--url", empty_database_url])
    assert result.exit_code == 1
    assert "newer artstore" in result.output and "Traceback" not in result.output


async def test_opening_without_migration_refuses_an_empty_or_old_database(empty_database_url):
    store = await artstore.open_store(empty_database_url, migrate_schema=False)
    await store.close()  # an empty database is left empty, not refused
    async with await artstore.open_store(empty_database_url) as store:
        async with store.database.write() as connection:
            await connection.execute(text("UPDATE alembic_version SET version_num = '0001'"))
    if migrate.head_revision() != "0001":
        from artstore.errors import SchemaOutdatedError

        try:
            await artstore.open_store(empty_database_url, migrate_schema=False)
        except SchemaOutdatedError as exc:
            assert "artstore db upgrade" in str(exc)
        else:
            raise AssertionError("an outdated schema was accepted")


def test_an_unreachable_database_in_the_cli_is_one_line():
    result = CliRunner().invoke(app, ["db", "current", "--url", "postgresql://x@127.0.0.1:1/y"])
    assert result.exit_code == 1
    assert "cannot reach the database" in result.output and "Traceback" not in result.output


def test_importing_artstore_and_its_help_do_not_import_art():
    code = (
        "import sys, artstore, artstore.cli; "
        "from typer.testing import CliRunner; "
        "r = CliRunner().invoke(artstore.cli.app, ['--help']); "
        "assert r.exit_code == 0; "
        "print('art' in sys.modules, 'litellm' in sys.modules)"
    )
    output = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert output.split() == ["False", "False"]


def test_the_newest_views_revision_matches_views_py():
    """Changing artstore/schema/views.py needs a revision that recreates the views."""
    import importlib
    import pkgutil

    from sqlalchemy.dialects import postgresql, sqlite

    from artstore.migrations import versions
    from artstore.schema import views

    revisions = [
        importlib.import_module(f"artstore.migrations.versions.{module.name}")
        for module in pkgutil.iter_modules(versions.__path__)
    ]
    with_views = sorted(
        (r for r in revisions if hasattr(r, "CREATE_VIEWS")), key=lambda r: r.revision
    )
    newest = with_views[-1].CREATE_VIEWS
    assert newest["sqlite"] == views.create_statements(sqlite.dialect())
    assert newest["postgresql"] == views.create_statements(postgresql.dialect())


async def test_0008_drops_the_type_index_and_keeps_every_event(empty_database_url):
    """Upgrading a store written at 0007 keeps its events; a downgrade brings the index back."""
    engine = create_async_engine(resolve_url(empty_database_url))
    stored = {
        "event_id": new_event_id(),
        "stream_id": "run-old",
        "version": 1,
        "type": "run.finished",
        "data": {"run": "old", "error": None},
        "recorded_at": datetime(2026, 11, 30, 12, 0, 0, 123456, tzinfo=UTC),
    }

    def type_indexes(connection) -> list[str]:
        found = inspect(connection).get_indexes("events")
        return [index["name"] for index in found if index["column_names"] == ["type"]]

    def read_events(connection) -> list[tuple]:
        rows = connection.execute(select(events).order_by(events.c.position)).all()
        return [(r.event_id, r.stream_id, r.version, r.type, r.data, r.recorded_at) for r in rows]

    try:
        async with engine.begin() as connection:
            await connection.run_sync(migrate.upgrade, "0007")
            assert await connection.run_sync(type_indexes) == ["ix_events_type"]
            await connection.execute(events.insert(), [stored])
            before = await connection.run_sync(read_events)
        async with engine.begin() as connection:
            await connection.run_sync(migrate.upgrade, "0008")
            assert await connection.run_sync(type_indexes) == []
            assert await connection.run_sync(read_events) == before
        async with engine.begin() as connection:
            await connection.run_sync(downgrade_to, "0007")
            assert await connection.run_sync(type_indexes) == ["ix_events_type"]
            assert await connection.run_sync(read_events) == before
    finally:
        await engine.dispose()
    assert before[0][:4] == (stored["event_id"], "run-old", 1, "run.finished")


async def test_0011_rebuilds_sqlite_events_without_autoincrement_and_keeps_every_event(
    empty_database_url,
):
    """Upgrading a store written at 0010 keeps every event byte for byte (positions, ids,
    payloads, times); on SQLite the table loses AUTOINCREMENT and keeps its keys and
    triggers, positions go on after the highest ever handed out, and a downgrade gives
    AUTOINCREMENT back. PostgreSQL is untouched."""
    engine = create_async_engine(resolve_url(empty_database_url))
    sqlite = empty_database_url.startswith("sqlite")
    payloads = [
        {"z": 1, "a": [1.5, -0.0, 1e300], "text": 'é\u0000\u2028 "quoted" 𝄞'},
        {"b": None, "a": {"nested": True}},
        {"payload": "x" * 3000},
    ]
    stored = [
        {
            "event_id": new_event_id(),
            "stream_id": f"run-{n % 2}",
            "version": n // 2 + 1,
            "type": "run.finished",
            "data": payloads[n % 3],
            "recorded_at": datetime(2026, 11, 30, 12, 0, n, 123456 + n, tzinfo=UTC),
        }
        for n in range(7)
    ]
    as_stored = (
        "SELECT position, event_id, stream_id, version, type, data, recorded_at FROM events"
        if sqlite
        else "SELECT position, event_id, stream_id, version, type, data::text, "
        "recorded_at::text FROM events"
    ) + " ORDER BY position"

    def schema(connection) -> tuple[str, list[str]]:
        table = connection.exec_driver_sql(
            "SELECT sql FROM sqlite_master WHERE type = 'table' AND name = 'events'"
        ).scalar()
        triggers = connection.exec_driver_sql(
            "SELECT name FROM sqlite_master WHERE type = 'trigger' AND tbl_name = 'events' "
            "ORDER BY name"
        ).scalars()
        return table, list(triggers)

    try:
        async with engine.begin() as connection:
            await connection.run_sync(migrate.upgrade, "0010")
            await connection.execute(events.insert(), stored)
            if sqlite:  # the counter above the highest event: events deleted by hand once
                await connection.execute(
                    text("UPDATE sqlite_sequence SET seq = seq + 5 WHERE name = 'events'")
                )
                table, triggers = await connection.run_sync(schema)
                assert "AUTOINCREMENT" in table
            before = (await connection.execute(text(as_stored))).all()
        async with engine.begin() as connection:
            await connection.run_sync(migrate.upgrade, "0011")
            assert (await connection.execute(text(as_stored))).all() == before
            if sqlite:
                upgraded_table, upgraded_triggers = await connection.run_sync(schema)
                assert "AUTOINCREMENT" not in upgraded_table
                assert upgraded_triggers == triggers
                assert {
                    index["name"]
                    for index in await connection.run_sync(
                        lambda sync: inspect(sync).get_unique_constraints("events")
                    )
                } == {"uq_events_event_id", "uq_events_stream_id_version"}
                for statement in (
                    "UPDATE events SET data = '{}'",
                    "DELETE FROM events",
                    f"REPLACE INTO events SELECT * FROM events WHERE position = {before[0][0]}",
                ):
                    with pytest.raises(Exception, match="immutable"):
                        async with connection.begin_nested():
                            await connection.execute(text(statement))
        async with await artstore.open_store(empty_database_url) as store:
            appended = await store.append("run-new", [RunFinished(run="new")], NO_STREAM)
            later = await store.read_all(after=0)
        # After the highest position ever handed out: on SQLite the counter, 5 above.
        assert appended.positions == [before[-1][0] + (6 if sqlite else 1)]
        assert [(e.position, e.event_id) for e in later[:-1]] == [(r[0], r[1]) for r in before]
        if sqlite:
            async with engine.begin() as connection:
                await connection.run_sync(downgrade_to, "0010")
                after_downgrade = (await connection.execute(text(as_stored))).all()
                assert after_downgrade[:-1] == before
                table, _ = await connection.run_sync(schema)
                assert "AUTOINCREMENT" in table
                seq = await connection.execute(
                    text("SELECT seq FROM sqlite_sequence WHERE name = 'events'")
                )
                assert seq.scalar() == appended.positions[0]
    finally:
        await engine.dispose()


async def test_0012_adds_v_runs_model_key_and_the_reader_keeps_reading_v_runs(empty_database_url):
    engine = create_async_engine(resolve_url(empty_database_url))

    def columns(connection) -> list[str]:
        return [c["name"] for c in inspect(connection).get_columns("v_runs")]

    async def reader_may_read(connection) -> bool:
        if connection.dialect.name != "postgresql":
            return True  # SQLite: the authorizer of `artstore sql` lets it read the views
        privilege = "SELECT has_table_privilege('artstore_reader', 'v_runs', 'SELECT')"
        return bool((await connection.execute(text(privilege))).scalar())

    try:
        async with engine.begin() as connection:
            await connection.run_sync(migrate.upgrade, "0012")
            at_0012 = await connection.run_sync(columns)
            assert await reader_may_read(connection)
        async with engine.begin() as connection:
            await connection.run_sync(downgrade_to, "0011")
            at_0011 = await connection.run_sync(columns)
            assert await reader_may_read(connection)
    finally:
        await engine.dispose()
    assert at_0012[:4] == ["run", "project", "model", "model_key"]
    assert at_0011 == [c for c in at_0012 if c != "model_key"]


async def test_0017_sets_lz4_on_postgresql_and_changes_nothing_on_sqlite(empty_database_url):
    """PostgreSQL with lz4: every text and JSON column compresses with it; down: pglz."""
    engine = create_async_engine(resolve_url(empty_database_url))
    compression = text(
        "SELECT c.relname || '.' || a.attname, a.attcompression::text FROM pg_attribute a "
        "JOIN pg_class c ON c.oid = a.attrelid WHERE c.relname IN ('events', 'blobs') "
        "AND a.attname IN ('data', 'body')"
    )
    lz4 = text(
        "SELECT 'lz4' = ANY(enumvals) FROM pg_settings WHERE name = 'default_toast_compression'"
    )
    try:
        async with engine.begin() as connection:
            await connection.run_sync(migrate.upgrade, "0017")
            postgres = connection.dialect.name == "postgresql"
            at_0017 = dict((await connection.execute(compression)).all()) if postgres else {}
            has_lz4 = postgres and (await connection.execute(lz4)).scalar()
        async with engine.begin() as connection:
            await connection.run_sync(downgrade_to, "0016")
            at_0016 = dict((await connection.execute(compression)).all()) if postgres else {}
            assert await connection.run_sync(migrate.current_revision) == "0016"
    finally:
        await engine.dispose()
    if postgres:
        assert set(at_0017) == {"events.data", "blobs.body"}
        assert set(at_0017.values()) == ({"l"} if has_lz4 else {""})
        assert set(at_0016.values()) == ({"p"} if has_lz4 else {""})
