"""What a write transaction of the event store does with a batch of appends.

`EventStore` (artstore.eventstore.store) decides when to commit and what to do when a
transaction fails; this module holds the SQL inside its transactions, over the database's
`Recorder`:

- `BatchSQL.rows_alone`: the batch as event rows, when nothing needs checking in its
  transaction, with its new blobs and projection rows where the writer can write them in
  the same statement (`StatementRows`): the writer may commit them in one statement;
- `BatchSQL.write_together`: the whole batch in one INSERT, with versions from the stream
  heads this process knows, then its projections;
- `BatchSQL.write_checked`: one append on its own, checked for a retry, a partial
  duplicate and its expected version (the fallback that isolates a refused append).

`BatchSQL` also remembers what this process wrote (stream heads, stored blobs), so that
most appends skip a query.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import OrderedDict
from collections.abc import Collection, Iterator
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import select
from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError, IntegrityError, InterfaceError, OperationalError

from artstore.collector import collector_paused
from artstore.errors import DatabaseUnavailableError, DuplicateEventError, WrongExpectedVersionError
from artstore.eventstore.blobs import blob_row
from artstore.eventstore.recorder import ErrorKind, Recorder
from artstore.eventstore.records import (
    NO_STREAM,
    AppendResult,
    Condition,
    InStatement,
    Projector,
    RecordedEvent,
    SideBySide,
    StatementPart,
    recorded_events,
)
from artstore.eventstore.streams import stream_heads
from artstore.schema.tables import blobs, events

# How often one append reads its stream's head again after other processes took the
# version it was about to write (each time, another append to that stream committed).
MAX_STREAM_RACES = 100


@dataclass
class Append:
    """An append waiting for its transaction, and what that transaction made of it."""

    stream_id: str
    rows: list[dict[str, Any]]  # event rows without version and position
    expected_version: int | None
    blobs: dict[str, str]
    future: asyncio.Future[AppendResult]
    condition: Condition | None = None
    result: AppendResult | None = None
    error: BaseException | None = None
    recorded: list[RecordedEvent] = field(default_factory=list)
    # Queued by `append_together_nowait` with the append after it: the writer does not
    # end a transaction between the two.
    with_next: bool = False

    def forget_attempt(self) -> None:
        """Before a transaction (again): nothing of an earlier attempt holds."""
        self.result, self.error, self.recorded = None, None, []


@dataclass
class Alone:
    """A batch as one statement that commits by itself: its event rows (versions given),
    the rows of the blobs this process has not stored, and its projection rows."""

    rows: list[dict[str, Any]]
    blobs: list[dict[str, Any]]
    projected: list[StatementPart]


class Recent(OrderedDict[str, Any]):
    """What this process wrote (stream heads, stored blobs), the newest `size` of it."""

    def __init__(self, size: int) -> None:
        super().__init__()
        self.size = size

    def remember(self, key: str, value: Any = None) -> None:
        self[key] = value
        self.move_to_end(key)
        if len(self) > self.size:
            self.popitem(last=False)


class BatchSQL:
    """The SQL of the event store's write transactions, and what this process wrote."""

    def __init__(
        self,
        recorder: Recorder,
        *,
        projector: Projector | None,
        projected_types: Collection[str] | None,
        side_by_side: SideBySide | None,
        side_by_side_offered: bool,
        in_statement: InStatement | None = None,
        in_statement_offered: bool = False,
    ) -> None:
        self.recorder = recorder
        self.projector = projector
        # The event types the projector writes anything for (None: every type). A batch
        # of other types needs no projection and may be written in one statement.
        self.projected_types = None if projected_types is None else frozenset(projected_types)
        # Without it, a batch with anything to project takes the append lock alone.
        self.side_by_side = side_by_side
        self.side_by_side_offered = side_by_side_offered  # the database's writer allows it
        # Projections written by the events' own INSERT (`StatementRows`), where the
        # database's writer can: an append is then one statement that commits by itself.
        self.in_statement = in_statement
        self.in_statement_offered = in_statement_offered and in_statement is not None
        # Heads of streams this process wrote, to skip a query per append. A stale head
        # (another process appended) fails on the unique (stream, version) key and the
        # append is then checked against the database.
        self.heads = Recent(100_000)
        self.stored_blobs = Recent(1_000_000)

    def remember(self, batch: list[Append]) -> None:
        """What a committed batch made exist: stream heads and blobs of the appends written."""
        for item in batch:
            if item.result is not None:
                self.heads.remember(item.stream_id, item.result.version)
                for digest in item.blobs:
                    self.stored_blobs.remember(digest)

    def forget_head(self, stream_id: str) -> None:
        self.heads.pop(stream_id, None)

    def rows_alone(self, batch: list[Append]) -> Alone | None:
        """The batch as event rows alone, when that is all it takes: no append has a
        condition or a stream whose head this process does not know (a new stream's is
        0), and where the writer cannot write them in the same statement, no blob to
        store and no event to project. None otherwise. A head another process moved on
        fails on the unique (stream, version) key, and the batch is then written the
        checked way (`write_checked`, append by append)."""
        heads: dict[str, int] = {}
        rows: list[dict[str, Any]] = []
        projects = False
        for item in batch:
            if item.condition is not None:
                return None
            if not self.in_statement_offered and self._new_blobs([item]):
                return None
            if self._projects_any(item):
                if not self.in_statement_offered:
                    return None
                projects = True
            head = heads.get(item.stream_id, self.heads.get(item.stream_id))
            if head is None:
                if item.expected_version != NO_STREAM:
                    return None  # ANY, or a version: only the database knows the head
                head = NO_STREAM
            if item.expected_version is not None and item.expected_version != head:
                return None  # the checked way says which version the stream is at
            rows.extend({**row, "version": head + n} for n, row in enumerate(item.rows, start=1))
            heads[item.stream_id] = head + len(item.rows)
        projected: list[StatementPart] = []
        if projects:
            types = self.projected_types
            projected_rows = [r for r in rows if types is None or r["type"] in types]
            found = self.in_statement(projected_rows) if self.in_statement is not None else None
            if found is None:
                return None
            projected = found
        new = self._new_blobs(batch)
        return Alone(rows, [blob_row(h, b) for h, b in sorted(new.items())], projected)

    def _projects_any(self, item: Append) -> bool:
        if self.projector is None:
            return False
        types = self.projected_types
        return types is None or any(row["type"] in types for row in item.rows)

    def write_together(self, connection: Connection, batch: list[Append]) -> bool:
        """The whole batch in one INSERT, with versions from the known stream heads;
        whether the transaction shares the append lock."""
        for item in batch:
            item.forget_attempt()
        # A batch's rows, recorded events and projection rows are thousands of acyclic
        # objects that live until it commits: left on, the collector ran full collections
        # of the whole process's heap during big batches (artstore.collector).
        with collector_paused():
            return self._insert_together(connection, batch)

    def _insert_together(self, connection: Connection, batch: list[Append]) -> bool:
        streams = {item.stream_id for item in batch}
        # Only this batch's heads: copying the whole cache (up to 100,000) costs milliseconds.
        heads = {stream: self.heads[stream] for stream in streams if stream in self.heads}
        heads.update(stream_heads(connection, streams - heads.keys()))
        rows: list[dict[str, Any]] = []
        for item in batch:
            head = heads.get(item.stream_id, 0)
            if item.expected_version is not None and item.expected_version != head:
                raise WrongExpectedVersionError(item.stream_id, item.expected_version, head)
            for offset, row in enumerate(item.rows, start=1):
                rows.append({**row, "version": head + offset})
            heads[item.stream_id] = head + len(item.rows)
            if item.condition is not None:
                item.condition(connection)
        side_by_side = self._may_go_side_by_side(connection, rows)
        # Blobs first: on PostgreSQL the append lock is taken by the events' INSERT and
        # held until commit, so whatever needs no order is written before it.
        self._insert_blobs(connection, batch)
        positions = self.recorder.insert_events(connection, rows, side_by_side=side_by_side)
        hand_back(batch, rows, positions, to_project=self.projector is not None)
        if self.projector is not None:
            texts = {digest: text for item in batch for digest, text in item.blobs.items()}
            self.projector(connection, [e for item in batch for e in item.recorded], texts)
        return side_by_side

    def _may_go_side_by_side(self, connection: Connection, rows: list[dict[str, Any]]) -> bool:
        """Whether this transaction may share the append lock: the writer offers it, and
        nothing it projects needs the order of appends."""
        if not self.side_by_side_offered:
            return False
        if self.projector is None:
            return True
        return self.side_by_side is not None and self.side_by_side(connection, rows)

    def write_checked(self, connection: Connection, item: Append) -> None:
        """One append, checked for a retry, a partial duplicate and its expected version."""
        ids = [row["event_id"] for row in item.rows]
        existing = connection.execute(
            select(events.c.event_id, events.c.stream_id, events.c.version, events.c.position)
            .where(events.c.event_id.in_(ids))
            .order_by(events.c.position)
        ).all()
        if existing:
            if len(existing) == len(ids) and all(r.stream_id == item.stream_id for r in existing):
                item.result = AppendResult(
                    item.stream_id, existing[-1].version, [r.position for r in existing], False
                )
                return
            raise DuplicateEventError(
                f"{len(existing)} of the {len(ids)} event ids of this append to "
                f"{item.stream_id!r} are already stored (in stream {existing[0].stream_id!r}): "
                "a retry must resend exactly the same events; nothing was written"
            )
        # On PostgreSQL the head is read before the append lock (taken by the INSERT):
        # another process may commit the stream's next version in between. Its commit is
        # then visible, so read the head again and check the expected version against it.
        for attempt in range(1, MAX_STREAM_RACES + 1):
            try:
                with savepoint(connection):
                    self._write_at_head(connection, item)
                return
            except IntegrityError as exc:
                taken = self.recorder.error_kind(exc) is ErrorKind.VERSION_TAKEN
                if attempt == MAX_STREAM_RACES or not taken:
                    raise

    def _write_at_head(self, connection: Connection, item: Append) -> None:
        head = stream_heads(connection, {item.stream_id}).get(item.stream_id, 0)
        if item.expected_version is not None and item.expected_version != head:
            raise WrongExpectedVersionError(item.stream_id, item.expected_version, head)
        if item.condition is not None:
            item.condition(connection)
        rows = [{**row, "version": head + n} for n, row in enumerate(item.rows, start=1)]
        self._insert_blobs(connection, [item])
        positions = self.recorder.insert_events(connection, rows)
        item.result = AppendResult(item.stream_id, rows[-1]["version"], positions, True)
        if self.projector is not None:
            item.recorded = recorded_events(rows, positions)
            self.projector(connection, item.recorded, item.blobs)

    def _new_blobs(self, batch: list[Append]) -> dict[str, str]:
        """The blobs of the batch this process has not stored, by hash."""
        return {
            digest: body
            for item in batch
            for digest, body in item.blobs.items()
            if digest not in self.stored_blobs
        }

    def _insert_blobs(self, connection: Connection, batch: list[Append]) -> None:
        new = self._new_blobs(batch)
        if not new:
            return
        # In one order in every process: on PostgreSQL blobs are written before the append
        # lock, and two transactions inserting the same two blobs in opposite orders would
        # each wait for the other.
        rows = [blob_row(h, b) for h, b in sorted(new.items())]
        self.recorder.insert_missing(connection, blobs, "hash", rows)


def about_the_append(exc: BaseException) -> bool:
    """Whether `exc` is about what an append holds, not about the connection."""
    if isinstance(exc, DatabaseUnavailableError):
        return False
    if isinstance(exc, DBAPIError):
        return not exc.connection_invalidated and not isinstance(
            exc, (OperationalError, InterfaceError)
        )
    return isinstance(exc, Exception)


@contextlib.contextmanager
def savepoint(connection: Connection) -> Iterator[None]:
    """`connection.begin_nested()`, whose failure is the real one: where the database
    rolled the whole transaction back (SQLite does, when the disk is full), rolling back
    to the savepoint fails too ("no such savepoint"), and that error hid the cause."""
    nested = connection.begin_nested()
    try:
        yield
    except BaseException:
        try:
            nested.rollback()
        except Exception:
            if still_in_transaction(connection):
                raise
        raise
    nested.commit()


def still_in_transaction(connection: Connection) -> bool:
    """False when the database rolled the whole transaction back (SQLite does, when full)."""
    raw = connection.connection.dbapi_connection
    return bool(getattr(raw, "in_transaction", True))


def hand_back(
    batch: list[Append], rows: list[dict[str, Any]], positions: list[int], *, to_project: bool
) -> None:
    """Give each append of a batch written as one INSERT its result, and its recorded events
    where the projector will read them (an append with nothing to project needs none)."""
    start = 0
    for item in batch:
        end = start + len(item.rows)
        mine = positions[start:end]
        if to_project:
            item.recorded = recorded_events(rows[start:end], mine)
        item.result = AppendResult(item.stream_id, rows[end - 1]["version"], mine, True)
        start = end
