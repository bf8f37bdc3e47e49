"""Reading never writes: `runs`, `show`, `group`, `trajectory`, `sql`, `export` (JSONL,
OTLP, ATIF), `replay --dry-run` and `dataset list` open a store read-only.

They create no file, no folder and no table, give one clear line for a missing or foreign
database, work on read-only media, and never wait for a writer. Only the commands that
record (demo, training, import, `db upgrade`) create or migrate. URLs that are not URLs
are refused; libpq's own parameters work.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import sqlite3
import subprocess
import tempfile
from pathlib import Path

import pytest
from command_line import run_artstore
from recorded_run import RUN, record_run
from sqlalchemy import text
from sqlalchemy.engine import make_url
from typer.testing import CliRunner

import artstore
from artstore.cli import app
from artstore.errors import (
    ConfigurationError,
    DatabaseUnavailableError,
    NotFoundError,
    ReadOnlyStoreError,
    SchemaError,
)
from artstore.events import RunFinished

READ_COMMANDS = [
    ["runs"],
    ["show", RUN],
    ["group", "g0"],
    ["trajectory", "r0a"],
    ["sql", "SELECT count(*) FROM v_runs"],
    ["export", RUN, "-"],
    ["export", RUN, "-", "--format", "otlp"],
    ["export", RUN, "-", "--format", "atif"],
    ["replay", RUN, "--dry-run"],
    ["dataset", "list"],
]


def one_line(text: str) -> str:
    return " ".join(text.split())


def invoke(*args: str):
    return CliRunner().invoke(app, list(args))


def snapshot(folder: Path) -> dict[str, str]:
    """Every file under `folder` and the sha256 of its bytes."""
    return {
        str(path.relative_to(folder)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(folder.rglob("*"))
        if path.is_file()
    }


@pytest.mark.parametrize("command", READ_COMMANDS, ids=lambda c: "-".join(c[:1] + c[3:]))
def test_a_missing_database_is_one_line_and_nothing_is_created(tmp_path, command):
    path = tmp_path / "no" / "such" / "artstore.db"
    result = invoke(*command, "--url", str(path))
    assert result.exit_code == 1, result.output
    assert one_line(result.stderr) == f"error: no artstore database at {path}"
    assert not (tmp_path / "no").exists()


@pytest.mark.parametrize("command", READ_COMMANDS, ids=lambda c: "-".join(c[:1] + c[3:]))
def test_another_applications_sqlite_file_is_left_alone(tmp_path, command):
    path = tmp_path / "app.db"
    with sqlite3.connect(path) as connection:
        connection.execute("CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT)")
        connection.execute("INSERT INTO users (name) VALUES ('ada')")
    connection.close()
    before = snapshot(tmp_path)
    result = invoke(*command, "--url", f"sqlite:///{path}")
    assert result.exit_code == 1, result.output
    assert one_line(result.stderr) == (
        f"error: {path} is not an artstore database (it holds other tables: users)"
    )
    assert snapshot(tmp_path) == before  # no table added, no journal left


def test_a_file_that_is_no_database_is_one_line(tmp_path):
    path = tmp_path / "notes.db"
    path.write_text("just some text, not SQLite\n" * 100)
    result = invoke("runs", "--url", str(path))
    assert result.exit_code == 1
    assert one_line(result.stderr).startswith(f"error: cannot read the database at {path}")


async def test_an_empty_or_foreign_database_is_refused_unchanged(empty_database_url):
    with pytest.raises(NotFoundError, match=r"no artstore database|the database is empty"):
        await artstore.open_store(empty_database_url, read_only=True)
    async with await artstore.open_store(empty_database_url) as store:  # recording creates it
        async with store.database.write() as connection:
            await connection.execute(text("CREATE TABLE other_app (x INTEGER)"))
            await connection.execute(text("DROP TABLE alembic_version"))
    with pytest.raises(SchemaError, match="not an artstore database"):
        await artstore.open_store(empty_database_url, read_only=True)


async def test_a_read_only_store_reads_and_refuses_to_record(database_url):
    async with await artstore.open_store(database_url) as store:
        await record_run(store)
    async with await artstore.open_store(database_url, read_only=True) as store:
        assert len(await store.read_all(limit=10_000)) > 0
        assert (await store.trajectory("r0a")).messages_and_choices
        with pytest.raises(ReadOnlyStoreError, match="read-only"):
            await store.append("run-x", [RunFinished(run="x")])
        if store.dialect == "postgresql":  # the server itself refuses a write
            with pytest.raises(Exception, match="read-only transaction"):
                async with store.database.read() as connection:
                    await connection.execute(text("DELETE FROM runs"))


def test_read_commands_work_on_read_only_media(monkeypatch):
    """A store on media nobody may write: every read command works and changes nothing."""
    folder = Path(tempfile.mkdtemp(prefix="artstore-readonly-"))
    path = folder / "artstore.db"

    async def record() -> None:
        async with await artstore.open_store(str(path)) as store:
            await record_run(store)

    asyncio.run(record())
    media = folder
    if os.geteuid() == 0:  # root writes through permissions: mount the folder read-only
        media = Path(tempfile.mkdtemp(prefix="artstore-media-"))
        subprocess.run(["mount", "--bind", folder, media], check=True)
        subprocess.run(["mount", "-o", "remount,bind,ro", media], check=True)
    else:
        path.chmod(0o444)
        folder.chmod(0o555)
    before = snapshot(folder)
    monkeypatch.chdir("/")
    try:
        for command in READ_COMMANDS:
            done = run_artstore(*command, env={"ARTSTORE_URL": str(media / "artstore.db")})
            assert done.exit_code == 0, (command, done.stderr)
            assert done.stdout_bytes.strip()
        assert snapshot(folder) == before
        assert sorted(p.name for p in folder.iterdir()) == ["artstore.db"]  # no -wal, -shm
    finally:
        if media != folder:
            subprocess.run(["umount", media], check=False)
            media.rmdir()
        folder.chmod(0o755)
        path.chmod(0o644)
        for child in folder.iterdir():
            child.unlink()
        folder.rmdir()


def test_a_reader_does_not_wait_for_a_writer(tmp_path):
    path = tmp_path / "artstore.db"

    async def record() -> None:
        async with await artstore.open_store(str(path)) as store:
            await record_run(store)

    asyncio.run(record())
    writer = sqlite3.connect(path, isolation_level=None, timeout=0)
    writer.execute("BEGIN IMMEDIATE")  # a writer in the middle of its transaction
    writer.execute("UPDATE runs SET status = 'running'")
    try:
        for command in READ_COMMANDS:
            result = invoke(*command, "--url", str(path))
            assert result.exit_code == 0, (command, result.output)
        assert "finished" in invoke("runs", "--url", str(path), "--format", "csv").stdout
    finally:
        writer.execute("ROLLBACK")
        writer.close()


def test_db_current_creates_nothing(tmp_path):
    path = tmp_path / "later" / "artstore.db"
    result = invoke("db", "current", "--url", str(path))
    assert result.exit_code == 0 and "empty" in result.stdout
    assert not (tmp_path / "later").exists()


# --- URLs -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    ["postgresql:/user@host/db", "postgres:user@host/db", "sqlite:relative.db", "mysql:x"],
)
def test_a_url_that_is_not_one_is_refused(tmp_path, monkeypatch, url):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigurationError, match="not a database URL"):
        artstore.urls.resolve_url(url)
    for command in (["runs"], ["demo"], ["db", "upgrade"]):
        result = invoke(*command, "--url", url)
        assert result.exit_code == 1 and "not a database URL" in result.stderr
        assert result.stderr.count("\n") == 1
    assert list(tmp_path.iterdir()) == []  # no file named after it


def test_a_password_in_a_malformed_url_is_not_printed(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = invoke("runs", "--url", "postgresql:/ada:s3cret-pw@host/db")
    assert result.exit_code == 1 and "s3cret-pw" not in result.output


async def test_libpq_parameters_work(postgres_url):
    url = f"{postgres_url}?sslmode=disable&connect_timeout=5&application_name=artstore-test"
    async with await artstore.open_store(url) as store:
        async with store.database.read() as connection:
            name = await connection.execute(text("SHOW application_name"))
            assert name.scalar() == "artstore-test"
    async with await artstore.open_store(f"{postgres_url}?sslmode=prefer") as store:
        assert await store.last_position() == 0
    # This test server speaks no SSL: `require` is refused by it, in one clear line.
    with pytest.raises(DatabaseUnavailableError, match="cannot reach the database"):
        await artstore.open_store(f"{postgres_url}?sslmode=require")
    for bad in ("sslmode=sometimes", "connect_timeout=soon", "pool=big"):
        with pytest.raises(ConfigurationError):
            await artstore.open_store(f"{postgres_url}?{bad}")


async def test_connect_timeout_bounds_an_unreachable_server():
    # A non-routable address: the TCP connection never completes, the timeout ends it.
    url = "postgresql://artstore@10.255.255.1:5432/x?connect_timeout=1"
    with pytest.raises(DatabaseUnavailableError, match="cannot reach the database"):
        await artstore.open_store(url)


def test_postgres_url_shapes_parse():
    url = artstore.urls.resolve_url("postgres://u:p@h:5433/d?sslmode=verify-full")
    assert (url.drivername, url.host, url.port, url.database) == (
        "postgresql+asyncpg",
        "h",
        5433,
        "d",
    )
    assert make_url(str(url)).query == {"sslmode": "verify-full"}
