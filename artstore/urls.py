"""Where the store lives: resolving `--url`, `ARTSTORE_URL` and the default SQLite file."""

from __future__ import annotations

import os
import re
from pathlib import Path

from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError

from artstore.errors import ConfigurationError, DatabaseUnavailableError

URL_ENV = "ARTSTORE_URL"
DEFAULT_SQLITE_PATH = Path(".artstore") / "artstore.db"

# The async driver artstore uses for each database, whatever the user typed.
_ASYNC_DRIVERS = {"sqlite": "aiosqlite", "postgresql": "asyncpg"}
_ALIASES = {"postgres": "postgresql"}


# What starts a URL: a scheme and its colon (`postgresql:`, `sqlite+aiosqlite:`).
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


def resolve_url(url: str | None = None, *, create_folder: bool = True) -> URL:
    """The SQLAlchemy async URL for `url`, `$ARTSTORE_URL`, or `.artstore/artstore.db`.

    Accepts `sqlite:///path`, `postgresql://user@host/db` (any driver suffix) or a plain
    file path, and always returns the async driver artstore runs on. Something that starts
    like a URL but is not one (`postgresql:/user@host/db`) is refused, never taken for a
    file name. `create_folder`: make the SQLite file's folder (not when only reading).
    """
    raw = url or os.environ.get(URL_ENV) or str(Path.cwd() / DEFAULT_SQLITE_PATH)
    if "://" not in raw:
        if _SCHEME.match(raw):
            raise ConfigurationError(
                f"not a database URL: {redact(raw)!r} (a URL reads scheme://..., as in "
                "postgresql://user@host/db or sqlite:///path; to name a file whose name "
                "holds ':', write ./name)"
            )
        raw = f"sqlite:///{Path(raw).expanduser().resolve()}"
    try:
        parsed = make_url(raw)
    except ArgumentError as exc:
        raise ConfigurationError(f"not a database URL: {raw!r} ({exc})") from None
    backend = _ALIASES.get(parsed.get_backend_name(), parsed.get_backend_name())
    if backend not in _ASYNC_DRIVERS:
        raise ConfigurationError(
            f"unsupported database {backend!r} in {redact(raw)}: "
            "artstore runs on SQLite (sqlite:///path) and PostgreSQL (postgresql://...)"
        )
    parsed = parsed.set(drivername=f"{backend}+{_ASYNC_DRIVERS[backend]}")
    if backend == "sqlite":
        if not parsed.database or parsed.database == ":memory:":
            raise ConfigurationError(
                "artstore needs a SQLite file, not an in-memory database "
                "(several connections and processes share it)"
            )
        folder = Path(parsed.database).expanduser().parent
        if not create_folder:
            return parsed
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise DatabaseUnavailableError(
                f"cannot reach the database at {parsed.database}: cannot create {folder} "
                f"({exc.strerror})"
            ) from None
    return parsed


def redact(url: str | URL) -> str:
    """The URL with its password hidden, for messages and logs."""
    try:
        return make_url(str(url)).render_as_string(hide_password=True)
    except ArgumentError:  # not a URL: hide what sits where a password would
        return re.sub(r":[^:@/]+@", ":***@", str(url))
