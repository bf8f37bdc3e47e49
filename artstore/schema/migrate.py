"""Running the Alembic migrations from inside artstore, and refusing a schema from the future."""

from __future__ import annotations

from importlib.resources import files

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy.engine import Connection

from artstore.errors import SchemaOutdatedError, SchemaTooNewError


def alembic_config() -> Config:
    config = Config()
    config.set_main_option("script_location", str(files("artstore.migrations")))
    return config


def head_revision() -> str:
    """The newest revision this artstore knows."""
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert head is not None
    return head


def current_revision(connection: Connection) -> str | None:
    return MigrationContext.configure(connection).get_current_revision()


def check_revision(connection: Connection, *, upgrade_allowed: bool) -> str | None:
    """Raise unless the schema is known; return the revision found (None: empty database)."""
    current = current_revision(connection)
    if current is None:
        return None
    scripts = ScriptDirectory.from_config(alembic_config())
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
    config = alembic_config()
    config.attributes["connection"] = connection
    command.upgrade(config, revision)
