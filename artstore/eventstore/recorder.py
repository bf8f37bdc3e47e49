"""The recorder: what the event store, the projections and the workers ask of a database.

As in the `eventsourcing` library's persistence layer, each database artstore runs on
implements one short interface in a module of its own (`SQLiteRecorder` in
`artstore.eventstore.sqlite`, `PostgresRecorder` in `artstore.eventstore.postgres`), and
nothing outside those two modules says which database it runs on: code above asks the
recorder of its connection (`recorder_of`) for the statement, the lock or the meaning of
an error. A recorder holds no state; the engines, the writer's connection and what a
database learns while it runs (which migration it has) belong to its `Database`.

`recorder_of(connection)` (`artstore.eventstore.database`) finds the recorder through the
registry of databases there (`DATABASES`), by SQLAlchemy's name for the connection's
database: the one lookup by that name outside the two modules
(`tests/codebase/test_dialect_containment.py`).
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import Enum
from typing import Any, Protocol

from sqlalchemy import Table
from sqlalchemy.engine import Connection
from sqlalchemy.sql import Insert, Select


class ErrorKind(Enum):
    """What a driver error means to artstore, told by SQLSTATE, SQLite's error code or
    the name of the constraint, never by the wording of a message."""

    VERSION_TAKEN = "the unique (stream, version) key refused an event"
    EVENT_ID_TAKEN = "an event id is stored already"
    GROUP_CONSUMED = "a group was trained into this model already"
    IMMUTABLE = "the schema refused to change or remove a stored event or blob"
    BUSY = "another process holds the write lock (SQLite)"
    LOCK_TIMEOUT = "a lock was not granted within lock_timeout"
    DISK_FULL = "the database has no space left"
    UNDEFINED_FUNCTION = "a function the statement calls is missing or may not be run"
    CONFLICT_RETRY = "the server ended the transaction to break a deadlock or conflict"


class Recorder(Protocol):
    """One database's SQL: events in and out, the upserts and locks above them, errors."""

    # --- events ---------------------------------------------------------------------

    def insert_events(
        self, connection: Connection, rows: list[dict[str, Any]], *, side_by_side: bool = False
    ) -> list[int]:
        """Insert event rows (versions included) in the order given, in the caller's
        transaction; their global positions, in that order. `side_by_side`: what the
        transaction projects needs no order across appends, so it may share the append
        lock with other such transactions where the database can."""
        ...

    def insert_missing(
        self, connection: Connection, table: Table, key: str, rows: list[dict[str, Any]]
    ) -> None:
        """Insert the rows whose `key` is not stored yet (content-addressed blobs)."""
        ...

    def select_heads(self, stream_ids: Sequence[str]) -> Select:
        """(stream id, version) of these streams, through the (stream, version) index; a
        stream without events has no row or a NULL version."""
        ...

    def select_streams(
        self, stream_ids: Sequence[str], columns: Sequence[Any], event_type: str | None = None
    ) -> Select:
        """`columns` of these streams' events (of `event_type` only, when given), by
        stream id and version, through the index (each id at most once)."""
        ...

    # --- projections and workers ----------------------------------------------------

    def insert(self, table: Table) -> Insert:
        """An INSERT into `table` that takes `.on_conflict_do_nothing()` and
        `.on_conflict_do_update(...)` (SQLAlchemy's construct for this database)."""
        ...

    def lock_keys(self, connection: Connection, namespace: int, keys: Sequence[int]) -> None:
        """Hold these keys (integers after `namespace`) until the transaction ends, taken
        in the order given, so that concurrent transactions on the same keys serialise."""
        ...

    def lock_appends(self, connection: Connection) -> None:
        """Hold appenders off until this transaction ends (a rebuild of the projections)."""
        ...

    def lock_for_removal(self, connection: Connection) -> None:
        """Hold appenders off until this transaction ends, those that write blobs first
        included (`artstore archive` removes blobs nothing else names: none may be named
        by an append that found it stored before the removal)."""
        ...

    # --- errors ---------------------------------------------------------------------

    def error_kind(self, exc: BaseException) -> ErrorKind | None:
        """What a driver error of this database means (None: nothing artstore names, or
        not this database's error)."""
        ...


def causes(exc: BaseException | None) -> list[BaseException]:
    """`exc` and the exceptions behind it (SQLAlchemy's `orig`, causes, contexts): where a
    driver's SQLSTATE or error code is found, however the error was wrapped."""
    found: list[BaseException] = []
    pending = [exc]
    while pending and len(found) < 20:
        current = pending.pop()
        if current is None or any(current is seen for seen in found):
            continue
        found.append(current)
        pending += [current.__context__, current.__cause__, getattr(current, "orig", None)]
    return found
