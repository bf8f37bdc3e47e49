"""Running the Alembic migrations from inside artstore, and refusing a schema from the future.

Opening a store whose schema is current is the common case (every command, every
`open_store`), and it needs no Alembic: the revision is read with one SELECT and compared
with `HEAD_REVISION`. Importing Alembic and reading its scripts took ~0.35 s of a 2.0 s
`artstore sql`; it is imported only to migrate, or to judge a revision that is not the head.
"""

from __future__ import annotations

from importlib.resources import files
from typing import TYPE_CHECKING

from sqlalchemy import inspect, text
from sqlalchemy.engine import Connection

from artstore.errors import NotFoundError, SchemaError, SchemaOutdatedError, SchemaTooNewError

if TYPE_CHECKING:
    from alembic.config import Config
    from alembic.script import ScriptDirectory

# The newest revision in artstore/migrations/versions (tests/schema/test_schema.py checks that
# Alembic's scripts agree): a new migration changes it too.
HEAD_REVISION = "0018"
VERSION_TABLE = "alembic_version"  # Alembic's default, in the connection's default schema


def alembic_config() -> Config:
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(files("artstore.migrations")))
    return config


def _scripts() -> ScriptDirectory:
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(alembic_config())


def head_revision() -> str:
    """The newest revision of this artstore's migration scripts (Alembic reads them)."""
    head = _scripts().get_current_head()
    assert head is not None
    return head


def current_revision(connection: Connection) -> str | None:
    """The revision the database is at (None: no schema), as Alembic stores it."""
    if not inspect(connection).has_table(VERSION_TABLE):
        return None
    revisions = connection.execute(text(f"SELECT version_num FROM {VERSION_TABLE}")).scalars()
    found = list(revisions)
    if len(found) <= 1:
        return found[0] if found else None
    from alembic.runtime.migration import MigrationContext  # several heads: Alembic says so

    return MigrationContext.configure(connection).get_current_revision()


def check_revision(connection: Connection, *, upgrade_allowed: bool) -> str | None:
    """Raise unless the schema is known; return the revision found (None: empty database)."""
    current = current_revision(connection)
    if current is None or current == HEAD_REVISION:
        return current
    scripts = _scripts()
    if not _is_known(scripts, current):
        raise SchemaTooNewError(
            f"the database is at schema revision {current!r}, which this artstore does not "
            f"know (it knows up to {scripts.get_current_head()!r}): it was written by a newer "
            "artstore. Upgrade artstore (pip install -U artstore) to use it."
        )
    if current != scripts.get_current_head() and not upgrade_allowed:
        raise SchemaOutdatedError(
            f"the database is at schema revision {current!r}, older than this artstore's "
            f"{scripts.get_current_head()!r}: run `artstore db upgrade`"
        )
    return current


def _is_known(scripts: ScriptDirectory, revision: str) -> bool:
    try:
        return scripts.get_revision(revision) is not None
    except Exception:  # alembic raises several kinds for an unknown id
        return False


def upgrade(connection: Connection, revision: str = "head") -> None:
    """Apply migrations on an open connection (inside the caller's transaction)."""
    from alembic import command

    config = alembic_config()
    config.attributes["connection"] = connection
    command.upgrade(config, revision)


def check_readable(connection: Connection, where: str) -> str:
    """The revision of a store opened read-only; raise unless it is artstore's, current.

    Nothing is created: an empty database, another application's, or one that needs
    `artstore db upgrade` is a clear error.
    """
    current = current_revision(connection)
    if current == HEAD_REVISION:
        return current
    tables = set(inspect(connection).get_table_names())
    if current is None:
        if not tables:
            raise NotFoundError(
                f"no artstore store at {where}: the database is empty (a recording command, "
                "or `artstore db upgrade`, creates one)"
            )
        raise SchemaError(_foreign(where, tables))
    if not _is_known(_scripts(), current) and "events" not in tables:
        raise SchemaError(_foreign(where, tables - {"alembic_version"}))
    check_revision(connection, upgrade_allowed=False)
    return current


def _foreign(where: str, tables: set[str]) -> str:
    names = ", ".join(sorted(tables)[:5]) + (", ..." if len(tables) > 5 else "")
    return f"{where} is not an artstore database (it holds other tables: {names})"
