"""Append to and read from streams of events, with group commit.

`EventStore.append` hands the append to one writer task per store. The writer takes
everything queued while its previous transaction ran and commits it in one transaction
(group commit): many concurrent single-event appenders cost few commits. Each append is
still atomic (a savepoint of its own when the batch has to be taken apart), idempotent by
its client-made event ids, and checked against its expected stream version. A write
transaction (events, blobs, and the projections of the events) is synchronous SQL over
the database's `Recorder`, committed in one call by its `Writer`
(artstore.eventstore.sqlite / .postgres), which chooses how: a batch of nothing but
event rows (no condition, no new blob, nothing to project, every stream's head known) may
be one INSERT that commits by itself.

A reader catching up with `read_all(after=...)` sees every committed event exactly once,
in order (invariant 3). SQLite has one writer at a time. On PostgreSQL an appending
transaction holds one lock (on the table `append_lock`) from its INSERT into `events`
until it commits, taken by a statement trigger of the schema; everything that needs no
order (stream heads, the expected-version check, a condition, blobs) is done before that
INSERT, so that the lock is held for the INSERT, the projections and the commit only.
Appends whose projections need no order run side by side and may commit out of position
order, so readers read up to `Database.safe_position` only (see
artstore.eventstore.postgres).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import OrderedDict
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Collection,
    Iterable,
    Iterator,
    Mapping,
    Sequence,
)
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from typing import Any, TypeVar

from sqlalchemy import func, select
from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError, IntegrityError, InterfaceError, OperationalError

from artstore.collector import collector_paused
from artstore.errors import (
    AppendRefusedError,
    ArtstoreError,
    DatabaseUnavailableError,
    DuplicateEventError,
    InvalidEventError,
    LockTimeoutError,
    StoreClosedError,
    WrongExpectedVersionError,
)
from artstore.events import Event
from artstore.eventstore.blobs import (
    blob_row,
    read_blob_texts,
)
from artstore.eventstore.database import Database, WriteBatch, Writer, translate_error
from artstore.eventstore.recorder import ErrorKind
from artstore.eventstore.records import (
    ANY,
    NO_STREAM,
    AppendResult,
    Condition,
    PendingAppend,
    Projector,
    RecordedEvent,
    SideBySide,
    check_blob,
    event_row,
    recorded_events,
    recorded_from_row,
)
from artstore.eventstore.streams import events_of_streams, stream_heads
from artstore.names import check_name, unstorable_character
from artstore.redaction import Redactor
from artstore.schema.tables import blobs, events

T = TypeVar("T")

MAX_APPENDS_PER_TRANSACTION = 1000
MAX_EVENTS_PER_TRANSACTION = 5000
# Planner statistics (where the database needs them refreshed by hand: SQLite) every so
# many events, and when a store that wrote closes. PostgreSQL's autovacuum does this.
STATISTICS_EVERY_EVENTS = 10_000
# How often one append reads its stream's head again after other processes took the
# version it was about to write (each time, another append to that stream committed).
MAX_STREAM_RACES = 100
# A lone append skips the event loop's turn when nothing else is ready to run, yet gives
# the loop a turn at least this often: timers and sockets wait outside the ready queue.
TURN_EVERY_S = 0.001


@dataclass
class _Append:
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


class _Recent(OrderedDict[str, Any]):
    """What this process wrote (stream heads, stored blobs), the newest `size` of it."""

    def __init__(self, size: int) -> None:
        super().__init__()
        self.size = size

    def remember(self, key: str, value: Any = None) -> None:
        self[key] = value
        self.move_to_end(key)
        if len(self) > self.size:
            self.popitem(last=False)


@dataclass
class _BatchWrite(WriteBatch):
    """A batch of appends as its writer commits it, and how that went."""

    single_statement: bool = False  # written by one INSERT that commits by itself
    side_by_side: bool = False  # its transaction shared the append lock


@dataclass
class CommitCounts:
    """Write transactions committed: group commit at work, and how they were written."""

    transactions: int = 0
    single_statement: int = 0  # of them, those written by one INSERT that commits itself
    side_by_side: int = 0  # of them, those that shared the append lock (PostgreSQL)


class EventStore:
    """Streams of immutable events in one database, appended with group commit.

    Every append takes one route: queued for the writer task, which commits what is queued
    in one transaction (`_commit`), over the database's `Writer` and `Recorder`; an append
    alone, with the writer idle, is committed at once on the caller's turn where the
    database can do it without waiting (`Writer.commit_now`). Should the transaction fail,
    each append is written on its own (`_commit_each_alone`), so that a refused append
    fails alone.
    """

    def __init__(
        self,
        database: Database,
        *,
        projector: Projector | None = None,
        projected_types: Collection[str] | None = None,
        side_by_side: SideBySide | None = None,
    ) -> None:
        self.database = database
        self.recorder = database.recorder
        self._projector = projector
        # Without it, a batch with anything to project takes the append lock alone.
        self._side_by_side = side_by_side
        # The event types the projector writes anything for (None: every type). A batch
        # of other types needs no projection and may be written in one statement.
        self._projected_types = None if projected_types is None else frozenset(projected_types)
        # The last guard of invariant 7: every payload is checked for the credentials the
        # process knows (artstore.redaction) and rewritten before it is queued, whatever
        # layer made the event.
        self.redact = Redactor()
        self._writer: Writer | None = None if database.read_only else database.writer()
        self._queue: asyncio.Queue[_Append] | None = None
        self._writer_task: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False
        # Heads of streams this process wrote, to skip a query per append. A stale head
        # (another process appended) fails on the unique (stream, version) key and the
        # append is then checked against the database.
        self._heads = _Recent(100_000)
        self._stored_blobs = _Recent(1_000_000)
        self.commits = CommitCounts()
        self._appending = 0  # `append` calls not answered yet
        self._writing = False  # the writer task holds a batch
        self._last_turn = 0.0  # when `append` last let the event loop take a turn
        self._events_since_statistics = 0

    @property
    def dialect(self) -> str:
        return self.database.dialect

    @property
    def transactions(self) -> int:
        return self.commits.transactions

    @property
    def single_statement_transactions(self) -> int:
        return self.commits.single_statement

    @property
    def side_by_side_transactions(self) -> int:
        return self.commits.side_by_side

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The event loop the writer runs on (for appends from other threads)."""
        if self._loop is None:
            raise StoreClosedError("the store has not written anything yet")
        return self._loop

    # --- appending ----------------------------------------------------------------------

    async def append(
        self,
        stream_id: str,
        new_events: Sequence[Event],
        expected_version: int | None = ANY,
        *,
        blobs: Mapping[str, str] | None = None,
        condition: Condition | None = None,
    ) -> AppendResult:
        """Append `new_events` to `stream_id` atomically.

        `expected_version` is the stream's version the caller last saw (NO_STREAM for a new
        stream, ANY to skip the check); a mismatch raises WrongExpectedVersionError and
        writes nothing. `blobs` maps content hashes (`blob_hash(body)`, the SHA-256 of the
        body; anything else refuses the append) to JSON bodies stored in the same
        transaction (each once, ever). Retrying with the same event objects writes
        nothing twice. `condition(connection)`, when given, runs in the appending
        transaction before the events are written; an exception it raises refuses the
        append (a retry of an append already stored does not run it again).
        """
        self._appending += 1
        try:
            if self._writer is None or not self._writer.commits_inline:
                return await self.append_nowait(
                    stream_id, new_events, expected_version, blobs=blobs, condition=condition
                )
            # Let every appender that is ready to run queue its append first: when this
            # one is then alone, it is committed here and now, without the two hops
            # through the writer task; when not, the writer commits them together (group
            # commit). With nothing else ready to run, the loop's turn would let nothing
            # queue: skip it (~10 us per lone append), but not for longer than
            # TURN_EVERY_S, so that timers and sockets of a program that only appends are
            # still served.
            loop = asyncio.get_running_loop()
            now = loop.time()
            if not _nothing_else_ready(loop) or now - self._last_turn > TURN_EVERY_S:
                self._last_turn = now
                await asyncio.sleep(0)
            item = self._new_append(stream_id, new_events, expected_version, blobs, condition)
            if self._appending == 1 and self._commit_at_once(item):
                return item.result  # type: ignore[return-value]
            return await self._enqueue(item)
        finally:
            self._appending -= 1

    def append_nowait(
        self,
        stream_id: str,
        new_events: Sequence[Event],
        expected_version: int | None = ANY,
        *,
        blobs: Mapping[str, str] | None = None,
        condition: Condition | None = None,
    ) -> asyncio.Future[AppendResult]:
        """Queue an append and return at once; the future resolves when it is committed.

        Appends queued by one task are written in the order they were queued. Invalid
        events raise here, before anything is queued.
        """
        item = self._new_append(stream_id, new_events, expected_version, blobs, condition)
        return self._enqueue(item)

    def append_together_nowait(
        self, appends: Sequence[PendingAppend]
    ) -> list[asyncio.Future[AppendResult]]:
        """Queue appends that are committed in one transaction; a future for each.

        The writer may commit other appends in the same transaction, but never ends one
        between these (however many events they hold): a group's rollouts and its seal
        commit together, and a crash leaves all of them or none. Invalid events raise
        here, before any of them is queued. Should the database refuse one of them, or
        the connection be lost, the writer writes the batch again append by append, as it
        does any batch (`_commit`), and each then succeeds or fails on its own.
        """
        items = [
            self._new_append(a.stream_id, a.events, a.expected_version, a.blobs, None)
            for a in appends
        ]
        for item in items[:-1]:
            item.with_next = True
        return [self._enqueue(item) for item in items]

    def _new_append(
        self,
        stream_id: str,
        new_events: Sequence[Event],
        expected_version: int | None,
        blobs: Mapping[str, str] | None,
        condition: Condition | None,
    ) -> _Append:
        """An append checked and encoded, not queued yet (raises for invalid events)."""
        if self._closed:
            raise StoreClosedError("the store is closed")
        self.database.refuse_writes()
        if not new_events:
            raise InvalidEventError("an append needs at least one event")
        problem = unstorable_character(stream_id)  # an id, not text: stored as it is
        if problem is not None:
            raise InvalidEventError(f"a stream id cannot hold {problem}: {stream_id!r}")
        now = datetime.now(UTC)  # one time for the append: its events commit together
        rows = [event_row(stream_id, event, self.redact, now) for event in new_events]
        if len({row["event_id"] for row in rows}) != len(rows):
            raise InvalidEventError("an append holds the same event id twice")
        for digest, text in (blobs or {}).items():
            check_blob(digest, text)
        self._ensure_writer_task()
        future: asyncio.Future[AppendResult] = self.loop.create_future()
        return _Append(stream_id, rows, expected_version, dict(blobs or {}), future, condition)

    def _enqueue(self, item: _Append) -> asyncio.Future[AppendResult]:
        self._ensure_writer_task().put_nowait(item)
        return item.future

    def _commit_at_once(self, item: _Append) -> bool:
        """Commit `item` alone, here and now, if nothing queued or being written would be
        passed and the database can do it without waiting (SQLite, its write lock free).
        False, with nothing written, otherwise or when the transaction fails: the writer
        task then takes the append, and reports a refusal or a failure as it does for any."""
        assert self._writer is not None
        if (
            self._writing
            or (self._queue is not None and not self._queue.empty())
            or self._events_since_statistics >= STATISTICS_EVERY_EVENTS
        ):
            return False
        batch = self._write_batch([item])
        try:
            done = self._writer.commit_now(batch)
        except Exception:
            done = False
        if not done:
            item.forget_attempt()
            return False
        self._committed([item], batch)
        return True

    def _ensure_writer_task(self) -> asyncio.Queue[_Append]:
        if self._queue is None:
            self._loop = asyncio.get_running_loop()
            self._queue = asyncio.Queue()
            writing = self._write_forever()
            self._writer_task = self._loop.create_task(writing, name="artstore-writer")
        return self._queue

    async def flush(self) -> None:
        """Wait until every append queued so far is committed."""
        if self._queue is not None:
            await self._queue.join()

    async def write_transaction(self, work: Callable[[Connection], T]) -> T:
        """Run `work` (synchronous SQL) in one of the writer's transactions and commit,
        after every append queued so far: for work that writes events beside other rows
        (`artstore archive`, `artstore restore`)."""
        await self.flush()
        self.database.refuse_writes()
        assert self._writer is not None
        return await self._writer_call(self._writer.transaction(work))

    async def _write_forever(self) -> None:
        assert self._queue is not None
        while True:
            batch = [await self._queue.get()]
            self._writing = True  # until every append of the batch has its answer
            num_events = len(batch[0].rows)
            while not self._queue.empty() and (
                batch[-1].with_next  # the rest of appends queued together
                or (
                    len(batch) < MAX_APPENDS_PER_TRANSACTION
                    and num_events < MAX_EVENTS_PER_TRANSACTION
                )
            ):
                batch.append(self._queue.get_nowait())
                num_events += len(batch[-1].rows)
            try:
                await self._commit(batch)
            except BaseException as exc:  # the whole transaction failed: fail every append
                for item in batch:
                    item.result, item.error = None, translate_error(exc, self.database)
                if isinstance(exc, asyncio.CancelledError):
                    raise
            finally:
                for item in batch:
                    if not item.future.done():
                        if item.error is not None:
                            item.future.set_exception(item.error)
                        else:
                            item.future.set_result(item.result)  # type: ignore[arg-type]
                    self._queue.task_done()
                self._writing = False

    async def _commit(self, batch: list[_Append]) -> None:
        """Commit a batch in one transaction; if that fails, each append on its own."""
        assert self._writer is not None
        write = self._write_batch(batch)
        try:
            await self._writer_call(self._writer.commit(write))
            self._committed(batch, write)
        except LockTimeoutError:
            raise  # waiting again would only wait as long again: every append gets the error
        except Exception:
            await self._commit_each_alone(batch)
            self._committed(batch, None)
        if self._events_since_statistics >= STATISTICS_EVERY_EVENTS:
            await self._refresh_statistics()

    def _write_batch(self, batch: list[_Append]) -> _BatchWrite:
        """The batch as one write transaction for the writer (see `WriteBatch`)."""

        def write_together(connection: Connection) -> None:
            write.side_by_side = self._write_together(connection, batch)

        def inserted(positions: list[int]) -> None:
            write.single_statement = True
            _hand_back(batch, rows or [], positions, to_project=False)

        rows = self._rows_alone(batch)
        events = sum(len(item.rows) for item in batch)
        write = _BatchWrite(write_together, events, rows, inserted if rows is not None else None)
        return write

    def _committed(self, batch: list[_Append], write: _BatchWrite | None) -> None:
        """Count the transaction (`write`: the batch's own; None: the fallback counted its
        own), and remember what now exists: stream heads and blobs of the appends written."""
        if write is not None:
            self.commits.transactions += 1
            self.commits.single_statement += write.single_statement
            self.commits.side_by_side += write.side_by_side
        self._events_since_statistics += sum(len(item.rows) for item in batch)
        for item in batch:
            if item.result is not None:
                self._heads.remember(item.stream_id, item.result.version)
                for digest in item.blobs:
                    self._stored_blobs.remember(digest)

    async def _commit_each_alone(self, batch: list[_Append]) -> None:
        """The fallback that isolates a refused append.

        1. Each append in a savepoint of its own, checked against the database, in one
           transaction. A conflict, a retry, a value the database refuses fails (or
           succeeds) that append only; a lost connection is replaced.
        2. If that transaction failed as a whole (the connection died again, the disk is
           full): each append in a transaction of its own, until the database is out of
           reach, which fails what is left with the real cause.
        """
        assert self._writer is not None

        def each_in_a_savepoint(connection: Connection) -> None:
            for item in batch:
                item.forget_attempt()
                try:
                    with _savepoint(connection):
                        self._write_checked(connection, item)
                except Exception as exc:
                    if not _about_the_append(exc) or not _still_in_transaction(connection):
                        raise  # the transaction is gone, not only this append
                    self._refused(item, exc)

        try:
            await self._writer_call(self._writer.transaction(each_in_a_savepoint))
            self.commits.transactions += 1
            return
        except Exception:
            pass
        for number, item in enumerate(batch):
            item.forget_attempt()
            try:
                write_one = partial(self._write_checked, item=item)
                await self._writer_call(self._writer.transaction(write_one))
                self.commits.transactions += 1
            except Exception as exc:
                self._refused(item, exc)
                if isinstance(item.error, DatabaseUnavailableError):
                    for rest in batch[number + 1 :]:  # out of reach: the same cause for all
                        rest.result, rest.error = None, item.error
                    return

    def _refused(self, item: _Append, exc: BaseException) -> None:
        """Fail `item` alone with an artstore error that says why."""
        item.result, item.recorded = None, []
        error = translate_error(exc, self.database)
        if not isinstance(error, ArtstoreError):  # a value or constraint the database refused
            message = (str(getattr(exc, "orig", None) or exc).strip().splitlines() or [""])[0]
            error = AppendRefusedError(
                f"the database refused the append to {item.stream_id!r} "
                f"({type(exc).__name__}: {message}); nothing of it was written"
            )
            error.__cause__ = exc
        item.error = error
        self._heads.pop(item.stream_id, None)

    async def _writer_call(self, call: Awaitable[T]) -> T:
        """Await a call of the writer; after an error that is not about the appends (the
        connection), the writer replaces its connection."""
        assert self._writer is not None
        try:
            return await call
        except BaseException as exc:
            if not _about_the_append(exc):
                await self._writer.reset()
            raise

    def _rows_alone(self, batch: list[_Append]) -> list[dict[str, Any]] | None:
        """The batch's event rows when they are all of it: no append has a condition, a
        blob to store, an event to project, or a stream whose head this process does not
        know (a new stream's is 0). None otherwise. A head another process moved on
        fails on the unique (stream, version) key, and the batch is then written the
        checked way (`_commit_each_alone`)."""
        heads: dict[str, int] = {}
        rows: list[dict[str, Any]] = []
        for item in batch:
            if item.condition is not None or any(d not in self._stored_blobs for d in item.blobs):
                return None
            if self._projector is not None and (
                self._projected_types is None
                or any(row["type"] in self._projected_types for row in item.rows)
            ):
                return None
            head = heads.get(item.stream_id, self._heads.get(item.stream_id))
            if head is None:
                if item.expected_version != NO_STREAM:
                    return None  # ANY, or a version: only the database knows the head
                head = NO_STREAM
            if item.expected_version is not None and item.expected_version != head:
                return None  # the checked way says which version the stream is at
            rows.extend({**row, "version": head + n} for n, row in enumerate(item.rows, start=1))
            heads[item.stream_id] = head + len(item.rows)
        return rows

    def _write_together(self, connection: Connection, batch: list[_Append]) -> bool:
        """The whole batch in one INSERT, with versions from the cached stream heads;
        whether the transaction shares the append lock."""
        for item in batch:
            item.forget_attempt()
        # A batch's rows, recorded events and projection rows are thousands of acyclic
        # objects that live until it commits: left on, the collector ran full collections
        # of the whole process's heap during big batches (artstore.collector).
        with collector_paused():
            return self._insert_together(connection, batch)

    def _insert_together(self, connection: Connection, batch: list[_Append]) -> bool:
        streams = {item.stream_id for item in batch}
        # Only this batch's heads: copying the whole cache (up to 100,000) costs milliseconds.
        heads = {stream: self._heads[stream] for stream in streams if stream in self._heads}
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
        _hand_back(batch, rows, positions, to_project=self._projector is not None)
        if self._projector is not None:
            texts = {digest: text for item in batch for digest, text in item.blobs.items()}
            self._projector(connection, [e for item in batch for e in item.recorded], texts)
        return side_by_side

    def _may_go_side_by_side(self, connection: Connection, rows: list[dict[str, Any]]) -> bool:
        """Whether this transaction may share the append lock: the writer offers it, and
        nothing it projects needs the order of appends."""
        assert self._writer is not None
        if not self._writer.side_by_side_appends:
            return False
        if self._projector is None:
            return True
        return self._side_by_side is not None and self._side_by_side(connection, rows)

    def _write_checked(self, connection: Connection, item: _Append) -> None:
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
                with _savepoint(connection):
                    self._write_at_head(connection, item)
                return
            except IntegrityError as exc:
                taken = self.recorder.error_kind(exc) is ErrorKind.VERSION_TAKEN
                if attempt == MAX_STREAM_RACES or not taken:
                    raise

    def _write_at_head(self, connection: Connection, item: _Append) -> None:
        head = stream_heads(connection, {item.stream_id}).get(item.stream_id, 0)
        if item.expected_version is not None and item.expected_version != head:
            raise WrongExpectedVersionError(item.stream_id, item.expected_version, head)
        if item.condition is not None:
            item.condition(connection)
        rows = [{**row, "version": head + n} for n, row in enumerate(item.rows, start=1)]
        self._insert_blobs(connection, [item])
        positions = self.recorder.insert_events(connection, rows)
        item.result = AppendResult(item.stream_id, rows[-1]["version"], positions, True)
        if self._projector is not None:
            item.recorded = recorded_events(rows, positions)
            self._projector(connection, item.recorded, item.blobs)

    def _insert_blobs(self, connection: Connection, batch: list[_Append]) -> None:
        new = {}
        for item in batch:
            for digest, body in item.blobs.items():
                if digest not in self._stored_blobs:
                    new[digest] = body
        if not new:
            return
        # In one order in every process: on PostgreSQL blobs are written before the append
        # lock, and two transactions inserting the same two blobs in opposite orders would
        # each wait for the other.
        rows = [blob_row(h, b) for h, b in sorted(new.items())]
        self.recorder.insert_missing(connection, blobs, "hash", rows)

    # --- reading ------------------------------------------------------------------------

    async def read_stream(
        self, stream_id: str, from_version: int = 1, limit: int | None = None
    ) -> list[RecordedEvent]:
        """The events of one stream, from `from_version` on, in order."""
        check_name("stream_id", stream_id)
        query = (
            select(events)
            .where(events.c.stream_id == stream_id, events.c.version >= from_version)
            .order_by(events.c.version)
            .limit(limit)
        )
        async with self.database.read() as connection:
            return [recorded_from_row(row) for row in await connection.execute(query)]

    async def read_streams(self, stream_ids: Iterable[str]) -> dict[str, list[RecordedEvent]]:
        """The events of several streams at once, by stream."""
        ids = list(dict.fromkeys(stream_ids))
        for stream_id in ids:
            check_name("stream_id", stream_id)
        found: dict[str, list[RecordedEvent]] = {stream_id: [] for stream_id in ids}
        async with self.database.read() as connection:
            for start in range(0, len(ids), 500):
                query = events_of_streams(self.recorder, ids[start : start + 500], list(events.c))
                for row in await connection.execute(query):
                    found[row.stream_id].append(recorded_from_row(row))
        return found

    async def read_all(
        self, after: int = 0, limit: int = 1000, types: Sequence[str] | None = None
    ) -> list[RecordedEvent]:
        """One page of all events with a position greater than `after`, in position order."""
        query = select(events).where(events.c.position > after)
        if types:
            query = query.where(events.c.type.in_(types))
        query = query.order_by(events.c.position).limit(limit)
        async with self.database.read() as connection:
            safe = await self.database.safe_position(connection)
            if safe is not None:  # appends in flight below: read up to them only
                query = query.where(events.c.position <= safe)
            return [recorded_from_row(row) for row in await connection.execute(query)]

    async def iter_all(
        self, after: int = 0, page_size: int = 1000, types: Sequence[str] | None = None
    ) -> AsyncIterator[RecordedEvent]:
        """Every event after `after`, page by page, up to the last committed one."""
        while page := await self.read_all(after, page_size, types):
            for recorded in page:
                yield recorded
            after = page[-1].position

    async def stream_version(self, stream_id: str) -> int:
        async with self.database.read() as connection:
            heads = await connection.run_sync(stream_heads, {stream_id})
        return heads.get(stream_id, 0)

    async def last_position(self) -> int:
        """The position a reader catching up would reach now (see `read_all`)."""
        query = select(func.max(events.c.position))
        async with self.database.read() as connection:
            safe = await self.database.safe_position(connection)
            if safe is not None:
                query = query.where(events.c.position <= safe)
            return (await connection.execute(query)).scalar() or 0

    async def get_blobs(self, hashes: Iterable[str]) -> dict[str, str]:
        """Bodies of content-addressed blobs by hash (missing hashes are left out)."""
        wanted = list(hashes)
        async with self.database.read() as connection:
            return await connection.run_sync(read_blob_texts, wanted)

    # --- lifecycle ----------------------------------------------------------------------

    async def _refresh_statistics(self) -> None:
        self._events_since_statistics = 0
        if self._writer is not None:
            await self._writer.refresh_statistics()

    async def close(self) -> None:
        """Write everything queued, then release every connection."""
        if self._closed:
            return
        self._closed = True
        try:
            await self.flush()
            if self.commits.transactions:
                await self._refresh_statistics()
        finally:
            if self._writer_task is not None:
                self._writer_task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._writer_task
            if self._writer is not None:
                await self._writer.close()
            await self.database.dispose()

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()


def _nothing_else_ready(loop: asyncio.AbstractEventLoop) -> bool:
    """Whether no other callback or task waits to run in this turn of `loop`. Read from
    asyncio's own loop (its `_ready` queue, there since Python 3.4); False for a loop
    without one (uvloop), which then always takes the turn."""
    ready = getattr(loop, "_ready", None)
    return ready is not None and not ready


def _about_the_append(exc: BaseException) -> bool:
    """Whether `exc` is about what an append holds, not about the connection."""
    if isinstance(exc, DatabaseUnavailableError):
        return False
    if isinstance(exc, DBAPIError):
        return not exc.connection_invalidated and not isinstance(
            exc, (OperationalError, InterfaceError)
        )
    return isinstance(exc, Exception)


@contextlib.contextmanager
def _savepoint(connection: Connection) -> Iterator[None]:
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
            if _still_in_transaction(connection):
                raise
        raise
    nested.commit()


def _still_in_transaction(connection: Connection) -> bool:
    """False when the database rolled the whole transaction back (SQLite does, when full)."""
    raw = connection.connection.dbapi_connection
    return bool(getattr(raw, "in_transaction", True))


def _hand_back(
    batch: list[_Append], rows: list[dict[str, Any]], positions: list[int], *, to_project: bool
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
