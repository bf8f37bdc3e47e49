"""Append throughput of artstore against its peers, on SQLite and on PostgreSQL, in one run.

What it measures: events per second for three ways of appending events with a ~2 KB payload

- `sequential`: one writer appends single events, each committed before the next;
- `concurrent64`: 64 concurrent writers append single events, each to its own stream;
- `batch100`: one writer appends batches of 100 events, one commit per batch;

for four peers, each writing its own SQLite file (in a temporary folder) and its own fresh
PostgreSQL database (`bench_*`, dropped at the end):

- `artstore`: `artstore.open_store(url)` and `store.append(stream, events, expected_version)`
  with a bench event type; the 64 writers are asyncio tasks (its natural concurrency);
- `eventsourcing`: the `eventsourcing` library's `SQLiteApplicationRecorder` and
  `PostgresApplicationRecorder`, given `StoredEvent` objects; it is synchronous, so its 64
  writers are 64 threads sharing the recorder (and its connection pool);
- `raw` (sqlite3 / psycopg): the driver alone, binding ready-made JSON texts: one INSERT +
  COMMIT per event for single appends (64 threads for the concurrent case), `executemany`
  in one transaction (SQLite) or `COPY ... FROM STDIN` (PostgreSQL) for batches. On SQLite
  it writes into artstore's own events table, made by artstore's migrations (its keys and
  triggers); on PostgreSQL into a table like artstore's (same columns and unique keys, no
  trigger). Raw writers give no commit-ordered positions, no idempotency and no
  expected-version check: they bound what the database itself can do;
- `raw-es` (SQLite only): the same driver loop into eventsourcing's table, made by its
  recorder's `create_table`. `raw` against `raw-es` is what the two tables cost; each
  library against the driver on its own table is what its own layer costs (printed under
  "the tables and the layers").

Settings are aligned so that libraries are compared, not settings: every SQLite peer uses
WAL with `synchronous=NORMAL` (artstore's setting; eventsourcing's default would be FULL);
every PostgreSQL peer may open at most 16 connections (artstore's pool size).

The machine is small and noisy, so each cell is measured in several short rounds (3 by
default), peers interleaved and their order rotated every round, and the table shows the
median round of each cell. Then the targets are checked, each a PASS or MISS line:

1. SQLite ahead of eventsourcing in every scenario: sequential >= 1x, batches of 100
   >= 1x, 64 concurrent single-event appenders >= 2x; PostgreSQL sequential >= 1x;
2. artstore with 64 concurrent single-event appenders >= 30% of the raw batched rate.

On 2026-12-01 (2-core machine, otherwise idle, 3 rounds, medians): SQLite sequential
4,164 vs 11,300 ev/s (0.37x, MISS), batch100 13,794 vs 29,664 (0.47x, MISS),
concurrent64 9,411 vs 6,080 (1.55x, MISS); PostgreSQL sequential 991 vs 763 (1.30x, PASS),
concurrent64 10,196 vs 905 (11.3x).

Where the time went (cProfile of the writer's thread and of the event loop, SQLite, before
the changes below): a single-event commit spent ~40% in SQLAlchemy (compiling and caching
the INSERT ... RETURNING, result processing, three statements through the engine), ~15%
in the hop to the writer thread and back, and the rest in SQLite's COMMIT, which writes
five b-tree pages per event (the table, the event-id and stream-version keys, the type
index, AUTOINCREMENT's counter) where eventsourcing writes two. A batch of 100 spent
~40% in SQLAlchemy's RETURNING (sent as batched INSERTs, then matched by event id).
JSON encoding (~10 us per 2 KB event) and projections (none for this event type) were
small. Changed: the writer numbers events itself after the highest position (it holds
the file's write lock) and inserts them with one executemany, without RETURNING; a
transaction of up to 500 events runs on the event loop's thread when the file's write
lock is free at once (else in the writer thread, which waits for it). On PostgreSQL the
writer no longer takes the append lock at the start of the transaction: the INSERT's
trigger takes it, after blobs, stream heads and conditions.

Measured on this machine (2 noisy cores, 5 rounds, medians, SQLite): before, artstore
sequential 1,938 / concurrent64 4,347 / batch100 4,237 ev/s against eventsourcing's
5,283 / 4,971 / 17,836; after, the figures of the paragraph above.

Second round, 2026-12-01 (2-core machine shared with other work, load average 4 to 8 while
measuring; medians of 5 rounds; CPU time per event from `time.process_time`, which the
load disturbs less than the rates). Settings are fair: both libraries run SQLite in WAL
with `synchronous=NORMAL` (a commit survives a killed process; a power cut may lose the
last commits; eventsourcing's own default would be FULL) and artstore's durability is
unchanged. Found, per event: a commit of 100 events rewrote ~100 pages of the unique
event-id index, because the ids were random (UUIDv4), and the type index on top; a
single-event commit wrote ~6.3 WAL frames where eventsourcing's writes ~4.3 (its table
has one key, no event id, no triggers). Changed: event ids artstore makes are UUIDv7
(time-ordered: new ids land on the index's last page), the `type` index is dropped (0008;
no query needs it), the writer's BEGIN, position query and INSERT go straight to the
driver (no SQLAlchemy statement machinery), and a lone `append` commits on its own task
when nothing is queued (two hops through the writer task saved; concurrent appenders
still share a transaction). CPU per event, artstore vs eventsourcing: sequential 169 -> 84
us vs 48-79, batch100 57 -> 29 vs 16-20, concurrent64 70 -> 41 vs 77-98. Rates before
(main, load ~1): sequential 5,667 vs 15,474 (0.37x), concurrent64 13,365 vs 8,571 (1.56x),
batch100 14,947 vs 41,211 (0.36x). After, load ~6: sequential 8,959 vs 15,950 (0.56x,
MISS), concurrent64 15,823 vs 7,281 (2.17x, PASS), batch100 24,857 vs 43,724 (0.57x, MISS);
three runs at load 7 to 10: sequential 0.58-0.69x, batch100 0.52-0.62x, concurrent64
0.84-1.16x (MISS). With 64 threads eventsourcing gets a bigger share of two busy cores than
artstore's one event-loop thread, so the concurrent64 ratio falls as the load rises; by
CPU time per event artstore needs about half of what eventsourcing does there.

Third round, 2026-12-01 (same machine, shared: load average 4 to 11 while measuring;
medians of 5 rounds; the table now shows each peer's CPU time per event, which the load
disturbs less than the rates).

Settings, compared: both libraries run SQLite with journal_mode=WAL, synchronous=NORMAL
(eventsourcing's own default is FULL; the bench sets NORMAL, artstore's documented
setting), and SQLite's defaults for page_size (4096), cache_size (-2000) and
wal_autocheckpoint (1000 pages). Like for like; artstore's durability is unchanged.

Found. Driver alone (sqlite3, 4,000 single-event commits, WAL frames counted with
autocheckpoint off): artstore's table wrote 6.51 frames per commit and took 38.6 us CPU;
without AUTOINCREMENT 5.51 frames, 33.3 us; eventsourcing's table (one key, no trigger)
4.29 frames, 27.3 us. The trigger that refuses REPLACE costs ~1.5-2 us per row whatever
its condition (one with a trivial WHEN costs about as much as its three index lookups),
so it stays as it is. With checkpoints on, as both libraries run, the checkpoint's
fsyncs took a third to half of the wall time, and they come every 1,000 frames: each
extra frame per commit is paid again there. cProfile of 10,000 sequential appends: a
third of the Python time was SQLAlchemy's transaction (its begin and commit events and
bookkeeping around the driver's BEGIN and COMMIT) and the call of the projector for an
event it has nothing to project; JSON (~6 us per 2 KB event, which eventsourcing pays
too), pydantic and the redaction scan (no secrets known: nothing) were small.

Changed: the events table has no AUTOINCREMENT on SQLite (migration 0011 rebuilds it;
positions stay increasing and never reused: the triggers refuse DELETE and REPLACE, the
writer numbers after the highest position ever handed out); an append or batch with
nothing to project, no condition, no new blob and known stream heads is BEGIN IMMEDIATE,
one INSERT and COMMIT sent to the driver as they are (as on PostgreSQL, where such a
batch is one statement), for lone appends and for the writer's group commits; a single
event is numbered by its INSERT (one statement less); no RecordedEvent objects are made
for appends nothing projects; the canonical JSON encoder is made once.

CPU per event, artstore before -> after (eventsourcing in the same run), SQLite, load ~4:
sequential 116 -> 84 us (es 59-64), batch100 38 -> 33 us (es 22), concurrent64 57 -> 54
us (es 82-87). Rates in those two runs: sequential 0.51x -> 0.79x, batch100 0.55x ->
0.71x, concurrent64 1.16x -> 1.25x. Full run after the changes (both databases, load 4
rising to 11): SQLite sequential 5,055 vs 5,632 ev/s (0.90x, MISS), batch100 14,414 vs
18,160 (0.79x, MISS), concurrent64 7,914 vs 7,399 (1.07x, MISS at this load; 2.26x at
load 0.5 before the changes); PostgreSQL sequential 213 vs 139 (1.54x, PASS),
concurrent64 4,433 vs 252. Earlier runs of the branch at load ~5: sequential 0.97x.

What is left, per event, is what the invariants cost plus artstore's layers, not
settings. The raw peer (the driver alone on a table with artstore's columns and keys,
AUTOINCREMENT, no trigger) spends as much CPU on a single-event commit as
eventsourcing's whole append (56-60 us vs 59-64 in the runs above); artstore's table
writes 5.5 WAL frames per commit to eventsourcing's 4.3 (its unique event id, the key
that makes retries idempotent, is the extra page), so ~28% more checkpoint fsyncs per
event. On top come ~25 us of artstore's Python for a lone append (timers around each
step, load ~5: encoding it, ~15 us, of which the JSON that both pay ~6, the pydantic
model, the time stamp, the append's future; the stream-head and expected-version check
~3; the Python side of the driver calls and the result ~7; the asyncio yield that lets
concurrent appenders share a commit ~3). For batches of 100 the commit costs both
libraries about the same per event; artstore's seven columns and two keys against four
and one, the trigger (~5 us together) and its payload handling (~6 us) make the rest.
Not adopted: checkpointing in a thread of its own (sequential 15k vs 7k ev/s in a driver
test) let the WAL grow without bound (22,000 pages after 4,000 events: a passive
checkpoint never catches up with a writer that does not pause) and moves when the WAL
is synced; leaving the numbering to SQLite (position NULL) would save ~1.5 us per event.

After merging (2026-12-01, machine otherwise idle, load 2-3, 5 rounds): SQLite sequential
9,288 vs 12,362 ev/s = 0.75x (MISS; CPU 81 vs 59 us/event), batches of 100 27,509 vs
38,892 = 0.71x (MISS), 64 concurrent 16,745 vs 6,307 = 2.66x (PASS); PostgreSQL
sequential 1,259 vs 812 = 1.55x (PASS).

On 2026-12-02 (a fresh machine of the same kind, 2 cores, otherwise idle, load 0.5;
3 rounds): SQLite sequential 7,129 vs 7,985 ev/s = 0.89x (MISS), batches of 100 15,685 vs
24,099 = 0.65x (MISS), 64 concurrent 9,038 vs 4,250 = 2.13x (PASS); PostgreSQL sequential
748 vs 724 = 1.03x (PASS). This machine is slower than the day before for every peer
(eventsourcing's single-event commit took 109 us of CPU instead of 59), so compare
ratios, not rates. What the figures say: artstore's single-event commit (125 us of CPU)
costs what the raw driver's INSERT + COMMIT on a table like artstore's costs (121 us,
0.89x eventsourcing as well): what is left of the sequential gap is the table, not
artstore's Python; in batches of 100 artstore spends ~15 us per event above the raw
driver on that table (encoding the pydantic event and its canonical JSON, the secret
scan, the time stamp, the row), and the raw driver ~6 us above eventsourcing (the trigger
that refuses REPLACE, the unique event id, seven columns against four). Dropping the
trigger or the event-id key would give up the invariants they hold (nothing altered,
retries idempotent): not done.

On 2026-12-02, a later, faster machine of the same kind (2 cores, otherwise idle, 3
rounds, medians; two runs): SQLite sequential 11,991 / 11,336 vs 14,546 / 14,433 ev/s
(0.82x / 0.79x, MISS), batch100 29,085 / 29,257 vs 48,962 / 45,399 (0.59x / 0.64x,
MISS), concurrent64 19,638 / 19,249 vs 7,179 / 7,279 (2.74x / 2.64x, PASS); PostgreSQL
sequential 1,235 / 1,214 vs 886 / 874 (1.39x, PASS). CPU per event, SQLite sequential:
artstore 73 us, eventsourcing 53, the raw driver on artstore's table 45 (1.13x
eventsourcing here, where it was 0.89x on the machine before). cProfile of 5,000 lone
appends there (its overhead included): the driver's three calls (BEGIN IMMEDIATE,
INSERT, COMMIT) ~50 us, artstore's Python ~25 us (the event's pydantic dump and canonical
JSON ~7, its row and event id ~5, the append's future and the event loop's turn ~10). On
this machine the gap is mostly artstore's own layers rather than its table; nothing was
changed for it in this pass.

On 2026-12-02, a third machine of the same kind, slower again (eventsourcing's
single-event commit took 180-210 us of CPU; load 0-2.5). cProfile of 20,000 events in
batches of 100: the canonical JSON of a 2 KB payload (`json` with sorted keys and
`ensure_ascii`) took 13.6 us per event, as long as the rest of artstore's Python
together; orjson writes the same document with sorted keys in 3.7 us (a call's payload
14 -> 3 us, a payload of 40 metrics 43 -> 6 us). Each event also got its own time stamp
and its own conversion to SQLite's text (~5 us). In a lone append the driver's BEGIN
IMMEDIATE and COMMIT cost ~10 us of CPU around the one INSERT, and the loop's turn that
lets concurrent appenders queue ran even when nothing else was ready. Changed: payloads
are written by orjson (`payload_json`: the standard encoder where orjson cannot say the
same, a lone surrogate or a 65-bit int, and for NaN, which orjson would write as null);
one time stamp per append; a single-event append on SQLite is one INSERT that commits by
itself (SQLite takes the write lock when the statement starts, before it reads the
highest position); no loop turn when asyncio's ready queue is empty. The same run
before -> after (trees alternated, both databases, 3 rounds): SQLite sequential 0.74x ->
0.79x (CPU 272 -> 240 us/event), batch100 0.72x -> 0.82x (81 -> 72 us), concurrent64
2.68x -> 2.81x; PostgreSQL sequential 1.66x -> 1.36x (330 and 258 ev/s against 198 and
190: this machine's PostgreSQL commits are slow and noisy). SQLite-only runs of the
new code: batch100 1.13x and 0.98x, sequential 0.82x and 0.93x. What is left on this
machine for a lone append: ~100 us of CPU in the driver's INSERT (as the raw peer's)
and ~75-100 us of artstore's Python around it, which runs with caches the commit has
just emptied (`_new_append` takes 12 us in a tight loop, ~38 us between commits, timed
with `time.process_time` around it).

On 2026-12-02, evening, a fourth machine of the kind (2 cores, otherwise idle, load ~1;
eventsourcing's single-event commit 86 us of CPU). At the start of the session: SQLite
sequential 7,837 vs 9,409 ev/s (0.83x; CPU 100 vs 88 us), batch100 24,358 vs 28,659
(0.85x; 36 vs 30 us), concurrent64 2.82x. Changed since, for other reasons (recording,
tools/bench_queries.py): an append's payload is kept as plain JSON text, no longer as a
`str` subclass carrying the dumped document (one copy of the text less, and no document
kept for an event nothing projects). The full run after (both databases, 3 rounds):
SQLite sequential 8,833 vs 9,365 ev/s (0.94x, MISS; CPU 88 vs 86 us, the raw driver on
artstore's table 78 us), batch100 25,892 vs 28,631 (0.90x, MISS; 33 vs 28 us, the raw
driver 33 us), concurrent64 14,878 vs 5,043 (2.95x, PASS); PostgreSQL sequential 931 vs
420 (2.22x, PASS). In batches of 100 artstore now costs what the raw driver costs on a
table with artstore's columns, keys and trigger: what is left there is the table, which
holds the invariants (the unique event id that makes retries idempotent, the trigger
that refuses REPLACE). A lone append costs ~10 us of CPU above the raw driver's INSERT:
the event's pydantic dump, its JSON and secret scan, the event id and time stamp, the
append's future.

On 2026-12-03, a slower machine of the kind (eventsourcing's single-event commit 113 us of
CPU, the raw driver's INSERT + COMMIT on artstore's table 86 us; otherwise idle, 3
rounds): SQLite sequential 7,025 vs 7,971 ev/s (0.88x, MISS; 125 us of CPU per event),
batch100 24,183 vs 30,269 (0.80x, MISS; 36 vs 28 us, the raw driver 32 us), concurrent64
3.54x (PASS); PostgreSQL sequential 1,036 vs 621 (1.67x, PASS). py-spy of 8,000 lone
appends (2,000 samples/s): 43% of the append's time is the driver's one INSERT that
commits by itself, the rest artstore's Python around it, spread thin: the event id
(~7%, 2 us in a tight loop, 9 us between commits), the payload's JSON (~4%), its time
stamp as text (~4%), the row and the stream head (~3%), the pydantic dump (~2%), the
future and the bookkeeping. Each step costs three to four times what it costs in a tight
loop, which is the commit emptying the caches, as noted above. Nothing was changed in
this pass: no single part is worth a change that would cost an invariant.

Later that day the raw SQLite peer was moved onto artstore's own table (until then it
wrote into a table "like artstore's" that still had AUTOINCREMENT, which artstore dropped
in migration 0011, and no trigger) and `raw-es` was added, both binding ready-made JSON.
Full run, 3 rounds, otherwise idle: the driver alone on artstore's table against
eventsourcing's: sequential 10,356 vs 13,418 ev/s (0.77x), batch100 28,652 vs 41,333
(0.69x). Each library over the driver on its own table: artstore 0.72x sequential and
0.74x in batches, eventsourcing 0.52x and 0.64x. artstore's own layer costs less than
eventsourcing's; the gap to eventsourcing is the table. Targets in that run: SQLite
sequential 7,486 vs 6,997 (1.07x, PASS; 0.94x and 0.96x in two SQLite-only runs of 5
rounds), batch100 21,301 vs 26,649 (0.80x, MISS; 0.80x and 0.85x), concurrent64 2.87x
(PASS); PostgreSQL sequential 1.80x (PASS). What in the table costs what (the driver
alone, 3,000 single-event commits and 6,000 events in batches of 100, medians of 5,
CPU per event, sequential / batch100): artstore's table as migrated 84 / 28.8 us;
without the trigger that refuses REPLACE 77 / 24.8; without the unique event-id key
69 / 27.2; eventsourcing's table 70.5 / 25.1. Both are invariants: the event-id key
makes a retried append idempotent whatever its expected version (with ANY, a retry
lands at another version, where only the event id can tell it was stored), and the
trigger keeps `INSERT OR REPLACE` from any client from deleting a stored event. In
batches of 100 the driver alone on that table is at 1.08x of eventsourcing's library (30
against 33 us of CPU per event): to be level, artstore's whole layer (validating,
encoding and scanning each event for secrets, its id and time stamp) would have to cost
under ~3 us per event; it costs ~10.

Run it from the repository root:

    python tools/bench_append.py                      # both databases, about 1-3 minutes
    python tools/bench_append.py --quick              # smoke run, a few seconds
    python tools/bench_append.py --databases sqlite --events 4000 --rounds 5

PostgreSQL comes from `--postgres-url`, else `$ARTSTORE_BENCH_POSTGRES_URL`, else
`postgresql://postgres@127.0.0.1:5432/test`; the user must be allowed to create databases.

"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import shutil
import sqlite3
import statistics
import sys
import tempfile
import threading
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
from eventsourcing.persistence import ApplicationRecorder, StoredEvent
from eventsourcing.postgres import PostgresApplicationRecorder, PostgresDatastore
from eventsourcing.sqlite import SQLiteApplicationRecorder, SQLiteConnection, SQLiteDatastore
from psycopg_pool import ConnectionPool
from rich.console import Console
from rich.table import Table
from sqlalchemy.engine import URL, make_url

import artstore
from artstore.events import Event, event_type, new_event_id

SCENARIOS = ("sequential", "concurrent64", "batch100")
PEERS = ("artstore", "eventsourcing", "raw", "raw-es")  # the last on SQLite only
DATABASES = ("sqlite", "postgresql")
CONCURRENCY = 64
BATCH_SIZE = 100
PAYLOAD_CHARS = 2048
SEQUENTIAL_SHARE = 4  # sequential cells write events / 4: one commit per event is slow
PG_MAX_CONNECTIONS = 16  # artstore's pool (8 + 8 overflow); the other peers get as many
DEFAULT_POSTGRES_URL = "postgresql://postgres@127.0.0.1:5432/test"
BENCH_TYPE = "bench.payload"
ES_TOPIC = "bench_append:Payload"


@event_type(BENCH_TYPE)
class BenchPayload(Event):
    """The bench's event: one ~2 KB string."""

    payload: str


def make_payloads(count: int = 256) -> list[str]:
    """Distinct random 2 KB strings (random, so that PostgreSQL cannot compress them away)."""
    return [secrets.token_urlsafe(PAYLOAD_CHARS)[:PAYLOAD_CHARS] for _ in range(count)]


PAYLOADS = make_payloads()


def payload(i: int) -> str:
    return PAYLOADS[i % len(PAYLOADS)]


# The raw peers bind these texts: they measure the driver and the table, not an encoder.
PAYLOAD_TEXTS = [json.dumps({"payload": text}) for text in PAYLOADS]
PAYLOAD_BYTES = [text.encode() for text in PAYLOAD_TEXTS]


def now() -> datetime:
    return datetime.now(UTC)


# --- the peers ------------------------------------------------------------------------------
#
# Every peer has the same four coroutines: `sequential(n)`, `concurrent(n)`, `batches(n)`
# (each writes n events; the harness times them) and `close()`. The synchronous peers block
# the event loop while they run: nothing else runs meanwhile, and no thread hop is added.


class Peer(ABC):
    name: str

    @abstractmethod
    async def sequential(self, n: int) -> None: ...

    @abstractmethod
    async def concurrent(self, n: int) -> None: ...

    @abstractmethod
    async def batches(self, n: int) -> None: ...

    @abstractmethod
    async def close(self) -> None: ...

    async def run(self, scenario: str, n: int) -> int:
        """Write about n events the scenario's way; returns how many were written."""
        if scenario == "sequential":  # the slowest way: a share of the events
            n //= SEQUENTIAL_SHARE
            await self.sequential(n)
            return n
        if scenario == "concurrent64":
            await self.concurrent(n)
            return n // CONCURRENCY * CONCURRENCY
        await self.batches(n)
        return n // BATCH_SIZE * BATCH_SIZE


class ArtstorePeer(Peer):
    """artstore's public API: `open_store` and `append` with an expected version."""

    name = "artstore"

    def __init__(self, store: artstore.Store) -> None:
        self.store = store

    @classmethod
    async def open(cls, url: str) -> ArtstorePeer:
        return cls(await artstore.open_store(url))

    async def _append_singles(self, stream: str, n: int) -> None:
        version = artstore.NO_STREAM
        for i in range(n):
            result = await self.store.append(stream, [BenchPayload(payload=payload(i))], version)
            version = result.version

    async def sequential(self, n: int) -> None:
        await self._append_singles(f"bench-seq-{uuid.uuid4()}", n)

    async def concurrent(self, n: int) -> None:
        each = n // CONCURRENCY
        streams = [f"bench-c{k}-{uuid.uuid4()}" for k in range(CONCURRENCY)]
        await asyncio.gather(*(self._append_singles(stream, each) for stream in streams))

    async def batches(self, n: int) -> None:
        stream, version = f"bench-batch-{uuid.uuid4()}", artstore.NO_STREAM
        for start in range(0, n - BATCH_SIZE + 1, BATCH_SIZE):
            batch = [BenchPayload(payload=payload(i)) for i in range(start, start + BATCH_SIZE)]
            version = (await self.store.append(stream, batch, version)).version

    async def close(self) -> None:
        await self.store.close()


class EventsourcingPeer(Peer):
    """The eventsourcing library's application recorder, fed `StoredEvent` objects."""

    name = "eventsourcing"

    def __init__(
        self, recorder: ApplicationRecorder, datastore: SQLiteDatastore | PostgresDatastore
    ) -> None:
        self.recorder = recorder
        self.datastore = datastore

    @classmethod
    def open_sqlite(cls, path: Path) -> EventsourcingPeer:
        datastore = SQLiteDatastore(str(path), pool_size=5, max_overflow=10, pool_timeout=120)
        create = datastore.pool._create_connection

        def create_with_normal_sync() -> SQLiteConnection:  # artstore's setting
            connection = create()
            connection._sqlite_conn.execute("PRAGMA synchronous=NORMAL")
            return connection

        datastore.pool._create_connection = create_with_normal_sync
        recorder = SQLiteApplicationRecorder(datastore)
        recorder.create_table()
        return cls(recorder, datastore)

    @classmethod
    def open_postgresql(cls, url: URL) -> EventsourcingPeer:
        datastore = PostgresDatastore(
            dbname=url.database or "",
            host=url.host or "127.0.0.1",
            port=url.port or 5432,
            user=url.username or "postgres",
            password=url.password or "",
            pool_size=PG_MAX_CONNECTIONS,
            max_overflow=0,
            connect_timeout=120,  # also psycopg_pool's wait for a free connection
        )
        recorder = PostgresApplicationRecorder(datastore)
        recorder.create_table()
        return cls(recorder, datastore)

    @staticmethod
    def _stored(aggregate: uuid.UUID, version: int, i: int) -> StoredEvent:
        state = json.dumps({"payload": payload(i)}).encode()
        return StoredEvent(aggregate, version, ES_TOPIC, state)

    def _insert_singles(self, n: int) -> None:
        aggregate = uuid.uuid4()
        for i in range(n):
            self.recorder.insert_events([self._stored(aggregate, i + 1, i)])

    async def sequential(self, n: int) -> None:
        self._insert_singles(n)

    async def concurrent(self, n: int) -> None:
        run_threads(self._insert_singles, n // CONCURRENCY)

    async def batches(self, n: int) -> None:
        aggregate = uuid.uuid4()
        for start in range(0, n - BATCH_SIZE + 1, BATCH_SIZE):
            stored = [self._stored(aggregate, i + 1, i) for i in range(start, start + BATCH_SIZE)]
            self.recorder.insert_events(stored)

    async def close(self) -> None:
        self.datastore.close()


# The raw SQLite peers write with the driver alone into a table that each library made
# itself, so that it cannot drift from the library's: `raw` into artstore's events table
# (its migrations: keys, triggers), `raw-es` into eventsourcing's (its recorder's
# `create_table`). What one driver INSERT + COMMIT costs on each is what the tables cost.
RAW_SQLITE_INSERT = (
    "INSERT INTO events (event_id, stream_id, version, type, data, recorded_at) "
    "VALUES (?, ?, ?, ?, ?, ?)"
)
RAW_ES_INSERT = (
    "INSERT INTO stored_events (originator_id, originator_version, topic, state) "
    "VALUES (?, ?, ?, ?)"
)

Row = tuple[str, str, int, str, str, datetime | str]
RowMaker = Callable[[str, int, int], tuple[Any, ...]]  # (stream, version, i) -> a row


def raw_row(stream: str, version: int, i: int, *, iso: bool = False) -> Row:
    recorded_at = now()
    return (
        new_event_id(),  # artstore's event ids (time-ordered), as its unique key gets them
        stream,
        version,
        BENCH_TYPE,
        PAYLOAD_TEXTS[i % len(PAYLOAD_TEXTS)],
        recorded_at.isoformat() if iso else recorded_at,
    )


def raw_es_row(stream: str, version: int, i: int) -> tuple[str, int, str, bytes]:
    """A row of eventsourcing's table, as its recorder binds a `StoredEvent`."""
    return (stream, version, ES_TOPIC, PAYLOAD_BYTES[i % len(PAYLOAD_BYTES)])


class RawSqlitePeer(Peer):
    """sqlite3 alone: INSERT + COMMIT per event; executemany in one transaction per batch.

    `raw`: into artstore's own events table; `raw-es`: into eventsourcing's.
    """

    def __init__(self, name: str, path: Path, insert: str, make_row: RowMaker) -> None:
        self.name = name
        self.path = path
        self.connection = self._connect()
        self.insert = insert
        self.make_row = make_row

    @classmethod
    async def on_artstore_table(cls, path: Path) -> RawSqlitePeer:
        store = await artstore.open_store(f"sqlite:///{path}")  # migrates the file
        await store.close()
        return cls("raw", path, RAW_SQLITE_INSERT, lambda s, v, i: raw_row(s, v, i, iso=True))

    @classmethod
    def on_eventsourcing_table(cls, path: Path) -> RawSqlitePeer:
        datastore = SQLiteDatastore(str(path))
        SQLiteApplicationRecorder(datastore).create_table()
        datastore.close()
        return cls("raw-es", path, RAW_ES_INSERT, raw_es_row)

    def _connect(self) -> sqlite3.Connection:
        connection = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        connection.execute("PRAGMA journal_mode=WAL")
        connection.execute("PRAGMA synchronous=NORMAL")
        connection.execute("PRAGMA busy_timeout=120000")
        return connection

    def _insert_singles(self, connection: sqlite3.Connection, n: int) -> None:
        stream = f"bench-{uuid.uuid4()}"
        for i in range(n):
            connection.execute("BEGIN IMMEDIATE")
            connection.execute(self.insert, self.make_row(stream, i + 1, i))
            connection.execute("COMMIT")

    async def sequential(self, n: int) -> None:
        self._insert_singles(self.connection, n)

    async def concurrent(self, n: int) -> None:
        # One connection per thread; SQLite's busy handler queues the writers.
        connections = [self._connect() for _ in range(CONCURRENCY)]
        pool = iter(connections)
        lock = threading.Lock()

        def worker(each: int) -> None:
            with lock:
                connection = next(pool)
            self._insert_singles(connection, each)

        try:
            run_threads(worker, n // CONCURRENCY)
        finally:
            for connection in connections:
                connection.close()

    async def batches(self, n: int) -> None:
        stream = f"bench-batch-{uuid.uuid4()}"
        for start in range(0, n - BATCH_SIZE + 1, BATCH_SIZE):
            rows = [self.make_row(stream, i + 1, i) for i in range(start, start + BATCH_SIZE)]
            self.connection.execute("BEGIN IMMEDIATE")
            self.connection.executemany(self.insert, rows)
            self.connection.execute("COMMIT")

    async def close(self) -> None:
        self.connection.close()


RAW_PG_SCHEMA = """
CREATE TABLE events (
    position BIGSERIAL PRIMARY KEY,
    event_id VARCHAR(36) NOT NULL UNIQUE,
    stream_id VARCHAR(255) NOT NULL,
    version INTEGER NOT NULL,
    type VARCHAR(100) NOT NULL,
    data JSONB NOT NULL,
    recorded_at TIMESTAMPTZ NOT NULL,
    UNIQUE (stream_id, version)
);
"""
RAW_PG_INSERT = (
    "INSERT INTO events (event_id, stream_id, version, type, data, recorded_at) "
    "VALUES (%s, %s, %s, %s, %s, %s)"
)
RAW_COPY = "COPY events (event_id, stream_id, version, type, data, recorded_at) FROM STDIN"


class RawPsycopgPeer(Peer):
    """psycopg 3 alone: INSERT + COMMIT per event; COPY FROM STDIN + COMMIT per batch."""

    name = "raw"

    def __init__(self, conninfo: str) -> None:
        self.conninfo = conninfo
        self.connection = psycopg.connect(conninfo)
        self.connection.execute(RAW_PG_SCHEMA)
        self.connection.commit()
        self.insert = RAW_PG_INSERT

    def _insert_singles(self, connection: psycopg.Connection, n: int) -> None:
        stream = f"bench-{uuid.uuid4()}"
        for i in range(n):
            connection.execute(self.insert, raw_row(stream, i + 1, i), prepare=True)
            connection.commit()

    async def sequential(self, n: int) -> None:
        self._insert_singles(self.connection, n)

    async def concurrent(self, n: int) -> None:
        # 64 threads share PG_MAX_CONNECTIONS connections, as the libraries' pools do.
        with ConnectionPool(
            self.conninfo, min_size=PG_MAX_CONNECTIONS, max_size=PG_MAX_CONNECTIONS, timeout=120
        ) as pool:
            pool.wait()
            stream_of: dict[int, str] = {}

            def worker(each: int) -> None:
                stream = stream_of.setdefault(threading.get_ident(), f"bench-{uuid.uuid4()}")
                for i in range(each):
                    with pool.connection() as connection:  # commits on leaving
                        connection.execute(self.insert, raw_row(stream, i + 1, i), prepare=True)

            run_threads(worker, n // CONCURRENCY)

    async def batches(self, n: int) -> None:
        stream = f"bench-batch-{uuid.uuid4()}"
        for start in range(0, n - BATCH_SIZE + 1, BATCH_SIZE):
            with self.connection.cursor() as cursor, cursor.copy(RAW_COPY) as copy:
                for i in range(start, start + BATCH_SIZE):
                    copy.write_row(raw_row(stream, i + 1, i))
            self.connection.commit()

    async def close(self) -> None:
        self.connection.close()


def run_threads(work: Callable[[int], None], each: int) -> None:
    """`work(each)` in CONCURRENCY threads at once; re-raises the first failure."""
    start = threading.Barrier(CONCURRENCY)

    def go(_: int) -> None:
        start.wait()
        work(each)

    with ThreadPoolExecutor(CONCURRENCY) as pool:
        for future in [pool.submit(go, k) for k in range(CONCURRENCY)]:
            future.result()


# --- where the peers write ----------------------------------------------------------------


@dataclass
class Place:
    """Fresh databases for the peers: one SQLite file each, one PostgreSQL database each."""

    postgres_url: str
    folder: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="bench_append_")))
    created: list[str] = field(default_factory=list)

    def sqlite_file(self, peer: str) -> Path:
        return self.folder / f"{peer}.db"

    def admin_conninfo(self) -> str:
        url = make_url(self.postgres_url).set(drivername="postgresql")
        return url.render_as_string(hide_password=False)

    def postgres_database(self, peer: str) -> URL:
        name = f"bench_{peer}_{secrets.token_hex(4)}"
        with psycopg.connect(self.admin_conninfo(), autocommit=True) as connection:
            connection.execute(f'CREATE DATABASE "{name}"')
        self.created.append(name)
        return make_url(self.postgres_url).set(drivername="postgresql", database=name)

    def postgres_settings(self) -> str:
        with psycopg.connect(self.admin_conninfo(), autocommit=True) as connection:
            values = [
                f"{name}={connection.execute(f'SHOW {name}').fetchone()[0]}"  # type: ignore[index]
                for name in ("fsync", "synchronous_commit", "commit_delay", "max_connections")
            ]
        return ", ".join(values)

    def clean(self) -> None:
        if self.created:
            with psycopg.connect(self.admin_conninfo(), autocommit=True) as connection:
                for name in self.created:
                    connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        shutil.rmtree(self.folder, ignore_errors=True)


async def open_peers(database: str, place: Place) -> list[Peer]:
    if database == "sqlite":
        return [
            await ArtstorePeer.open(f"sqlite:///{place.sqlite_file('artstore')}"),
            EventsourcingPeer.open_sqlite(place.sqlite_file("eventsourcing")),
            await RawSqlitePeer.on_artstore_table(place.sqlite_file("raw")),
            RawSqlitePeer.on_eventsourcing_table(place.sqlite_file("raw-es")),
        ]
    artstore_url = place.postgres_database("artstore").render_as_string(hide_password=False)
    raw_url = place.postgres_database("raw").render_as_string(hide_password=False)
    return [
        await ArtstorePeer.open(artstore_url),
        EventsourcingPeer.open_postgresql(place.postgres_database("eventsourcing")),
        RawPsycopgPeer(raw_url),
    ]


# --- measuring ------------------------------------------------------------------------------


@dataclass
class Cell:
    """The rounds of one peer x scenario x database."""

    rates: list[float] = field(default_factory=list)
    # CPU time of this process per event (all its threads; not the PostgreSQL server's):
    # less disturbed than the rates when other work shares the machine.
    cpu_us: list[float] = field(default_factory=list)
    transactions: list[int] = field(default_factory=list)  # artstore only

    @property
    def best(self) -> float:
        """The median round (named `best` for the report's code; noise hits both ways)."""
        return statistics.median(self.rates) if self.rates else float("nan")

    @property
    def cpu(self) -> float:
        """The median round's CPU microseconds per event."""
        return statistics.median(self.cpu_us) if self.cpu_us else float("nan")


Results = dict[tuple[str, str, str], Cell]  # (database, peer, scenario) -> cell


async def measure(
    databases: Sequence[str], place: Place, events: int, rounds: int, console: Console
) -> Results:
    results: Results = {}
    peers: dict[str, list[Peer]] = {}
    try:
        for database in databases:
            peers[database] = await open_peers(database, place)
        with console.status("warming up (connections, prepared statements, caches)") as status:
            for database in databases:
                for peer in peers[database]:
                    for scenario in SCENARIOS:
                        await peer.run(scenario, 2 * CONCURRENCY)
            for round_ in range(rounds):
                for database in databases:
                    order = rotate(peers[database], round_)
                    for scenario in SCENARIOS:
                        for peer in order:
                            status.update(
                                f"round {round_ + 1}/{rounds}: {database} {scenario} {peer.name}"
                            )
                            cell = results.setdefault((database, peer.name, scenario), Cell())
                            await measure_cell(peer, scenario, events, cell)
    finally:
        for opened in peers.values():
            for peer in opened:
                await peer.close()
    return results


async def measure_cell(peer: Peer, scenario: str, events: int, cell: Cell) -> None:
    transactions = peer.store.transactions if isinstance(peer, ArtstorePeer) else 0
    started, cpu_started = time.perf_counter(), time.process_time()
    written = await peer.run(scenario, events)
    cell.rates.append(written / (time.perf_counter() - started))
    cell.cpu_us.append((time.process_time() - cpu_started) / written * 1e6)
    if isinstance(peer, ArtstorePeer):
        cell.transactions.append(peer.store.transactions - transactions)


def rotate(items: list[Peer], by: int) -> list[Peer]:
    by %= len(items)
    return items[by:] + items[:by]


# --- reporting ------------------------------------------------------------------------------


def ratio(numerator: float, denominator: float) -> str:
    if not denominator or denominator != denominator or numerator != numerator:
        return "—"
    return f"{numerator / denominator:.2f}x"


def rate(value: float) -> str:
    return "—" if value != value else f"{value:,.0f}"


def report(results: Results, databases: Sequence[str], events: int, console: Console) -> None:
    table = Table(
        title=f"Append throughput, events/s: median of the rounds; {events:,} events of "
        f"{PAYLOAD_CHARS} B per cell and round ({events // SEQUENTIAL_SHARE:,} for sequential)",
        header_style="bold",
    )
    table.add_column("peer")
    table.add_column("scenario")
    labels = {"sqlite": "SQLite", "postgresql": "PostgreSQL"}
    for database in databases:
        label = labels[database]
        table.add_column(f"{label}\nev/s", justify="right")
        table.add_column(f"{label}\n÷ es", justify="right")
        table.add_column(f"{label}\n÷ raw batch", justify="right")
        table.add_column(f"{label}\nCPU us/ev", justify="right")
    for peer in PEERS:
        if not any((database, peer, "sequential") in results for database in databases):
            continue
        for scenario in SCENARIOS:
            row = [peer, scenario]
            for database in databases:
                if (database, peer, scenario) not in results:  # a peer of the other database
                    row += ["-"] * 4
                    continue
                mine = results[(database, peer, scenario)].best
                peer_es = results[(database, "eventsourcing", scenario)].best
                raw_batched = results[(database, "raw", "batch100")].best
                cpu = results[(database, peer, scenario)].cpu
                row += [rate(mine), ratio(mine, peer_es), ratio(mine, raw_batched), f"{cpu:.0f}"]
            table.add_row(*row, end_section=scenario == SCENARIOS[-1])
    console.print(table)
    console.print(
        "raw: the driver alone into artstore's table (on SQLite, the one its migrations "
        "make); raw-es: into eventsourcing's. "
        "÷ es: the row's rate over eventsourcing's in the same scenario and database; "
        "÷ raw batch: over the raw driver's batch100 rate on the same database; CPU us/ev: "
        "this process's CPU time per event (median round; on PostgreSQL the server's is not "
        "in it)."
    )

    check_targets(results, databases, console)
    if "sqlite" in databases:
        tables_and_layers(results, console)
    print_group_commit(results, databases, events, console)


def check_targets(results: Results, databases: Sequence[str], console: Console) -> None:
    """A PASS or MISS line for each target of the module docstring."""
    labels = {"sqlite": "SQLite", "postgresql": "PostgreSQL"}
    console.print("\n[bold]Targets[/bold] (artstore over eventsourcing, same scenario)")
    # (database, scenario, needed ratio): ahead of eventsourcing in every SQLite scenario,
    # twice its rate with 64 concurrent appenders, and level with it sequentially on
    # PostgreSQL.
    targets = [
        ("sqlite", "sequential", 1.0),
        ("sqlite", "batch100", 1.0),
        ("sqlite", "concurrent64", 2.0),
        ("postgresql", "sequential", 1.0),
    ]
    for database, scenario, needed in targets:
        if database not in databases:
            continue
        check(
            console,
            f"{labels[database]} {scenario}: >= {needed:g}x eventsourcing",
            results[(database, "artstore", scenario)].best,
            results[(database, "eventsourcing", scenario)].best,
            needed,
        )
    for database in databases:
        artstore_c = results[(database, "artstore", "concurrent64")].best
        raw_batched = results[(database, "raw", "batch100")].best
        check(
            console,
            f"{labels[database]} concurrent64: >= 30% of the raw driver's batched rate",
            artstore_c,
            raw_batched,
            0.30,
        )


def print_group_commit(
    results: Results, databases: Sequence[str], events: int, console: Console
) -> None:
    """How many single-event appends each transaction held (group commit)."""
    labels = {"sqlite": "SQLite", "postgresql": "PostgreSQL"}
    console.print("\n[bold]Group commit[/bold] (artstore, concurrent64, store.transactions)")
    appends = events // CONCURRENCY * CONCURRENCY
    for database in databases:
        counts = results[(database, "artstore", "concurrent64")].transactions
        console.print(
            f"  {labels[database]}: {appends:,} single-event appends per round took "
            f"{', '.join(f'{t:,}' for t in counts)} transactions "
            f"(at least {appends / max(max(counts), 1):.1f} appends per transaction)"
        )


def tables_and_layers(results: Results, console: Console) -> None:
    """Split each SQLite gap in two: the tables (the driver alone on artstore's table
    against eventsourcing's) and each library's own layer (its rate over the driver's on
    its own table)."""
    console.print("\n[bold]SQLite: the tables and the layers[/bold] (median rounds; information)")
    for scenario in ("sequential", "batch100"):
        cell = {peer: results[("sqlite", peer, scenario)].best for peer in PEERS}
        console.print(
            f"  {scenario}: driver alone on artstore's table {rate(cell['raw'])} vs on "
            f"eventsourcing's {rate(cell['raw-es'])} ev/s = "
            f"{ratio(cell['raw'], cell['raw-es'])}; each library over the driver on its "
            f"own table: artstore {ratio(cell['artstore'], cell['raw'])}, eventsourcing "
            f"{ratio(cell['eventsourcing'], cell['raw-es'])}"
        )


def check(console: Console, what: str, value: float, reference: float, needed: float) -> None:
    achieved = value / reference if reference else float("nan")
    verdict = "[green]PASS[/green]" if achieved >= needed else "[red]MISS[/red]"
    console.print(
        f"  {verdict} {what}: {value:,.0f} vs {reference:,.0f} ev/s = {achieved:.2f}x "
        f"(needs {needed:.2f}x)"
    )


# --- main -----------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])  # type: ignore[union-attr]
    parser.add_argument(
        "--events",
        type=int,
        default=None,
        help="events per cell per round (default 3,200; 640 with --quick); concurrent64 "
        f"rounds down to a multiple of {CONCURRENCY}, batch100 to one of {BATCH_SIZE}",
    )
    parser.add_argument("--rounds", type=int, default=None, help="rounds per cell (default 3)")
    parser.add_argument(
        "--databases",
        default="sqlite,postgresql",
        help="comma-separated: sqlite, postgresql (default both)",
    )
    parser.add_argument(
        "--postgres-url",
        default=os.environ.get("ARTSTORE_BENCH_POSTGRES_URL", DEFAULT_POSTGRES_URL),
        help="a PostgreSQL server where the user may create databases "
        "(default $ARTSTORE_BENCH_POSTGRES_URL or %(default)s)",
    )
    parser.add_argument("--quick", action="store_true", help="a smoke run: few events, 1 round")
    args = parser.parse_args(argv)
    args.databases = [d.strip() for d in args.databases.split(",") if d.strip()]
    unknown = set(args.databases) - set(DATABASES)
    if unknown or not args.databases:
        parser.error(f"--databases takes sqlite and/or postgresql, not {sorted(unknown)}")
    args.events = max(args.events or (640 if args.quick else 3200), CONCURRENCY * BATCH_SIZE // 10)
    args.rounds = args.rounds or (1 if args.quick else 3)
    return args


async def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    console = Console(width=max(Console().width, 120))
    place = Place(args.postgres_url)
    try:
        settings = [
            f"{os.cpu_count()} CPUs, Python {sys.version.split()[0]}, "
            f"artstore {artstore.__version__}",
            "SQLite: WAL, synchronous=NORMAL for every peer",
        ]
        if "postgresql" in args.databases:
            try:
                place.postgres_settings()
            except psycopg.OperationalError as exc:
                console.print(f"[red]cannot use PostgreSQL at {args.postgres_url}: {exc}[/red]")
                return 2
            settings.append(
                f"PostgreSQL: {place.postgres_settings()}; "
                f"at most {PG_MAX_CONNECTIONS} connections per peer"
            )
        settings.append(
            f"concurrent64: artstore = {CONCURRENCY} asyncio tasks; eventsourcing and raw = "
            f"{CONCURRENCY} threads; each writer appends to its own stream"
        )
        settings.append(
            f"{args.rounds} round(s) per cell, peers interleaved and rotated each round; "
            "median round shown"
        )
        for line in settings:
            console.print(f"[dim]{line}[/dim]")
        started = time.perf_counter()
        results = await measure(args.databases, place, args.events, args.rounds, console)
        report(results, args.databases, args.events, console)
        console.print(f"\n[dim]measured in {time.perf_counter() - started:.0f} s[/dim]")
    finally:
        place.clean()
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
