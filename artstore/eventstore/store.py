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

The SQL inside those transactions is artstore.eventstore.batch's; reading is
artstore.eventstore.reading's. SQLite has one writer at a time. On PostgreSQL an appending
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
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from typing import TypeVar

from sqlalchemy.engine import Connection

from artstore.errors import (
    AppendRefusedError,
    ArtstoreError,
    DatabaseUnavailableError,
    InvalidEventError,
    LockTimeoutError,
    StoreClosedError,
)
from artstore.events import Event
from artstore.eventstore.batch import (
    Append,
    BatchSQL,
    about_the_append,
    hand_back,
    savepoint,
    still_in_transaction,
)
from artstore.eventstore.database import Database, WriteBatch, Writer, translate_error
from artstore.eventstore.reading import EventReader
from artstore.eventstore.records import (
    ANY,
    AppendResult,
    Condition,
    InStatement,
    PendingAppend,
    Projector,
    SideBySide,
    check_blob,
    event_row,
)
from artstore.names import unstorable_character
from artstore.redaction import Redactor

T = TypeVar("T")

MAX_APPENDS_PER_TRANSACTION = 1000
MAX_EVENTS_PER_TRANSACTION = 5000
# Planner statistics (where the database needs them refreshed by hand: SQLite) every so
# many events, and when a store that wrote closes. PostgreSQL's autovacuum does this.
STATISTICS_EVERY_EVENTS = 10_000
# A lone append skips the event loop's turn when nothing else is ready to run, yet gives
# the loop a turn at least this often: timers and sockets wait outside the ready queue.
TURN_EVERY_S = 0.001


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


class EventStore(EventReader):
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
        in_statement: InStatement | None = None,
    ) -> None:
        super().__init__(database)
        # The last guard of invariant 7: every payload is checked for the credentials the
        # process knows (artstore.redaction) and rewritten before it is queued, whatever
        # layer made the event.
        self.redact = Redactor()
        self._writer: Writer | None = None if database.read_only else database.writer()
        self.sql = BatchSQL(
            self.recorder,
            projector=projector,
            projected_types=projected_types,
            side_by_side=side_by_side,
            side_by_side_offered=self._writer is not None and self._writer.side_by_side_appends,
            in_statement=in_statement,
            in_statement_offered=self._writer is not None and self._writer.projects_in_statement,
        )
        self._queue: asyncio.Queue[Append] | None = None
        self._writer_task: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False
        self.commits = CommitCounts()
        self._appending = 0  # `append` calls not answered yet
        self._writing = False  # the writer task holds a batch
        self._last_turn = 0.0  # when `append` last let the event loop take a turn
        self._events_since_statistics = 0

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
    ) -> Append:
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
        return Append(stream_id, rows, expected_version, dict(blobs or {}), future, condition)

    def _enqueue(self, item: Append) -> asyncio.Future[AppendResult]:
        self._ensure_writer_task().put_nowait(item)
        return item.future

    def _commit_at_once(self, item: Append) -> bool:
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

    def _ensure_writer_task(self) -> asyncio.Queue[Append]:
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

    async def _commit(self, batch: list[Append]) -> None:
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

    def _write_batch(self, batch: list[Append]) -> _BatchWrite:
        """The batch as one write transaction for the writer (see `WriteBatch`)."""

        def write_together(connection: Connection) -> None:
            write.side_by_side = self.sql.write_together(connection, batch)

        def inserted(positions: list[int]) -> None:
            write.single_statement = True
            hand_back(batch, rows or [], positions, to_project=False)

        alone = self.sql.rows_alone(batch)
        rows = alone.rows if alone is not None else None
        events = sum(len(item.rows) for item in batch)
        write = _BatchWrite(write_together, events, rows, inserted if rows is not None else None)
        if alone is not None:
            write.blobs, write.projected = alone.blobs, alone.projected
        return write

    def _committed(self, batch: list[Append], write: _BatchWrite | None) -> None:
        """Count the transaction (`write`: the batch's own; None: the fallback counted its
        own), and remember what now exists: stream heads and blobs of the appends written."""
        if write is not None:
            self.commits.transactions += 1
            self.commits.single_statement += write.single_statement
            self.commits.side_by_side += write.side_by_side
        self._events_since_statistics += sum(len(item.rows) for item in batch)
        self.sql.remember(batch)

    async def _commit_each_alone(self, batch: list[Append]) -> None:
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
                    with savepoint(connection):
                        self.sql.write_checked(connection, item)
                except Exception as exc:
                    if not about_the_append(exc) or not still_in_transaction(connection):
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
                write_one = partial(self.sql.write_checked, item=item)
                await self._writer_call(self._writer.transaction(write_one))
                self.commits.transactions += 1
            except Exception as exc:
                self._refused(item, exc)
                if isinstance(item.error, DatabaseUnavailableError):
                    for rest in batch[number + 1 :]:  # out of reach: the same cause for all
                        rest.result, rest.error = None, item.error
                    return

    def _refused(self, item: Append, exc: BaseException) -> None:
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
        self.sql.forget_head(item.stream_id)

    async def _writer_call(self, call: Awaitable[T]) -> T:
        """Await a call of the writer; after an error that is not about the appends (the
        connection), the writer replaces its connection."""
        assert self._writer is not None
        try:
            return await call
        except BaseException as exc:
            if not about_the_append(exc):
                await self._writer.reset()
            raise

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
