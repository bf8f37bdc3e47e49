"""A fresh database for each matrix case: a copy of the migrated template, SQLite or
PostgreSQL (tests/conftest.py's `migrated_templates`), dropped after the case."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


@contextmanager
def fresh_database(templates: Any, database: str, folder: Path) -> Iterator[str]:
    """The URL of an empty database at the current schema, for one case."""
    if database == "sqlite":
        yield templates.sqlite_copy(folder / "artstore.db")
        return
    copies = templates.postgres_copy()
    url = next(copies)
    try:
        yield url
    finally:
        copies.close()  # the generator's `finally` drops the database
