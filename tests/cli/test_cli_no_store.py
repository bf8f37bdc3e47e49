"""Reading never writes, and a mistake creates nothing: commands given no store, or a bad
input, leave no SQLite file and no tables in an empty PostgreSQL database; and an
unreachable database is named once, as a user writes its URL."""

from __future__ import annotations

from pathlib import Path

import pytest
from trained_run import cli, one_line_error


@pytest.fixture(autouse=True)
def in_tmp(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "bad.jsonl").write_text("not JSON\n")
    (tmp_path / "empty.jsonl").write_text("")
    (tmp_path / "bad.parquet").write_bytes(b"not parquet")


def tables(url: str) -> set[str]:
    """The tables of the database at `url` (none for a SQLite file not there)."""
    from sqlalchemy import create_engine, inspect

    if url.startswith("sqlite"):
        if not Path(url.removeprefix("sqlite:///")).exists():
            return set()
        engine = create_engine(url)
    else:
        engine = create_engine(url.replace("postgresql://", "postgresql+psycopg://", 1))
    try:
        with engine.connect() as connection:
            return set(inspect(connection).get_table_names())
    finally:
        engine.dispose()


NO_STORE = ("no artstore database at", "the database is empty")
# Commands that fail before they have anything to write, and what they say.
MISTAKES = [
    (["replay", "demo-1", "--dry-run"], NO_STORE),
    (["replay", "demo-1", "--backend", "artstore.backends:check_only_backend"], NO_STORE),
    (["rescore", "demo-1", "--reward", "artstore.demo:strict_reward", "--scorer", "s"], NO_STORE),
    (["import", "nofile.jsonl"], ("no such file or directory: nofile.jsonl",)),
    (["import", "bad.jsonl"], ("bad.jsonl, line 1: not JSON",)),
    (["import", "empty.jsonl"], ("empty file, nothing to import",)),
    (["import", "bad.parquet"], ("bad.parquet",)),
    (["demo", "--resume", "nope"], NO_STORE),
    (["db", "rebuild-projections"], NO_STORE),
]


def test_mistakes_create_nothing(empty_database_url: str, tmp_path: Path) -> None:
    for args, says in MISTAKES:
        result = cli(*args, "--url", empty_database_url)
        assert result.exit_code == 1, (args, result.output)
        message = one_line_error(result)
        assert any(said in message for said in says), (args, message)
        assert tables(empty_database_url) == set(), args
    assert not (tmp_path / "artstore.db").exists()


def test_the_default_store_is_not_created(tmp_path: Path) -> None:
    for args, _ in MISTAKES:
        result = cli(*args)
        assert result.exit_code == 1, (args, result.output)
        assert not (tmp_path / ".artstore").exists(), args


def test_an_unreachable_database_is_named_once(postgres_url: str) -> None:
    from sqlalchemy.engine import make_url

    missing = make_url(postgres_url).set(database="no_such_db_for_artstore", password="s3cret")
    typed = missing.render_as_string(hide_password=False)
    result = cli("runs", "--url", typed)
    assert result.exit_code == 1
    message = one_line_error(result)
    shown = missing.render_as_string(hide_password=True)
    assert shown.startswith("postgresql://")
    assert message.startswith(f"error: cannot reach the database at {shown}: "), message
    assert message.count("cannot reach") == 1 and "asyncpg" not in message
    assert "s3cret" not in message
