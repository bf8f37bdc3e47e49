"""Where a run's bytes go: SQLite and PostgreSQL against ART's parquet format 2 (issue 29).

One run of this script records the corpus of `tools/corpus.py` (10,000 rollouts by
default, `--rollouts 100000` for the long one) into a fresh SQLite file and a fresh
PostgreSQL database through the public API (`artstore.open_store(url)`,
`store.append_nowait`, one train step's appends queued at a time), exports it from
SQLite with `artstore.exchange.export_parquet` (what `artstore export RUN OUT --format
parquet` runs: ART's own writer, one file per train step), and prints:

- each database's size (SQLite: the file after a WAL checkpoint; PostgreSQL:
  `pg_database_size`, after VACUUM so that dead tuples do not count) against the parquet
  files, with PASS/MISS against the targets: PostgreSQL within 3x, SQLite within 5x (it
  compresses nothing itself);
- where the bytes go, per table: heap and indexes (SQLite: the `dbstat` virtual table,
  page by page; PostgreSQL: `pg_table_size`, TOAST included, and `pg_indexes_size`),
  and the event log's payloads by event type (SQLite: `length(CAST(data AS BLOB))`, the
  bytes as stored; PostgreSQL: `pg_column_size(data)`, after its compression).

The targets need ART's parquet format 2 (ART >= 0.5.20, so Python >= 3.12: run it with
/work/venv313's interpreter or any environment with `openpipe-art` 0.5.20+); with format
1 (no logprobs in the files) the comparison is printed and no PASS/MISS is given.

    python tools/bench_size.py                    # 10,000 rollouts, SQLite and PostgreSQL
    python tools/bench_size.py --quick            # 1,000 rollouts: a smoke run
    python tools/bench_size.py --rollouts 100000  # the long one (~10x the time and disk)

PostgreSQL comes from `--postgres-url`, else `$ARTSTORE_BENCH_POSTGRES_URL`, else
`postgresql://postgres@127.0.0.1:5432/test`; the user must be allowed to create databases.

Measured 2026-12-04 (2-core machine shared with other sessions, Python 3.13 / ART
0.5.23), 10,000 rollouts: parquet 454.0 MiB, SQLite 917.0 MiB (x 2.0), PostgreSQL 860.1
MiB (x 1.9): PASS. Where the time goes: recording (25 min on SQLite, 11 on PostgreSQL
under load 6 to 8) and ART's parquet writer (8 min); the split itself takes seconds.
docs/performance.md, "Where the bytes go", has the split before and after.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sqlite3
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # before `art` is imported

import corpus  # tools/corpus.py, beside this file
import psycopg
from bench_queries import Place  # a temporary folder and fresh PostgreSQL databases

import artstore
from artstore.art_versions import parquet_format_version
from artstore.exchange import export_parquet

DEFAULT_POSTGRES_URL = "postgresql://postgres@127.0.0.1:5432/test"
DATABASES = ("sqlite", "postgresql")
TARGETS = {"sqlite": 5.0, "postgresql": 3.0}  # x the parquet files, at most
MIB = 1024 * 1024


@dataclass
class Split:
    """A database's size and where its bytes are."""

    total: int
    tables: dict[str, tuple[int, int]]  # table -> (heap with TOAST, indexes)
    payloads: dict[str, tuple[int, int]]  # event type -> (events, payload bytes as stored)


async def record(url: str, run: corpus.Corpus) -> tuple[float, int]:
    """Record the corpus into `url`, one step's appends queued at a time: (seconds, events)."""
    store = await artstore.open_store(url)
    events = 0
    start = time.perf_counter()
    try:
        for appends in run.steps():
            futures = [store.append_nowait(a.stream, a.events, blobs=a.blobs) for a in appends]
            await asyncio.gather(*futures)
            events += sum(len(a.events) for a in appends)
    finally:
        await store.close()
    return time.perf_counter() - start, events


def sqlite_split(path: Path) -> Split:
    with sqlite3.connect(path) as connection:
        connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        owner = dict(connection.execute("SELECT name, tbl_name FROM sqlite_schema"))
        pages = connection.execute("SELECT name, SUM(pgsize) FROM dbstat GROUP BY name").fetchall()
        payloads = connection.execute(
            "SELECT type, COUNT(*), SUM(length(CAST(data AS BLOB))) FROM events GROUP BY type"
        ).fetchall()
    tables: dict[str, tuple[int, int]] = {}
    for name, used in pages:
        table = owner.get(name, name)
        heap, indexes = tables.get(table, (0, 0))
        tables[table] = (heap + used, indexes) if table == name else (heap, indexes + used)
    wal = path.with_name(path.name + "-wal")
    total = path.stat().st_size + (wal.stat().st_size if wal.exists() else 0)
    return Split(total, tables, {t: (int(n), int(b)) for t, n, b in payloads})


def postgres_split(conninfo: str) -> Split:
    with psycopg.connect(conninfo, autocommit=True) as connection:
        connection.execute("VACUUM ANALYZE")
        total = connection.execute("SELECT pg_database_size(current_database())").fetchone()
        tables = connection.execute(
            "SELECT c.relname, pg_table_size(c.oid), pg_indexes_size(c.oid) FROM pg_class c "
            "JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE c.relkind = 'r' AND n.nspname = 'public'"
        ).fetchall()
        payloads = connection.execute(
            "SELECT type, COUNT(*), SUM(pg_column_size(data)) FROM events GROUP BY type"
        ).fetchall()
    assert total is not None
    return Split(
        int(total[0]),
        {name: (int(heap), int(indexes)) for name, heap, indexes in tables},
        {t: (int(n), int(b)) for t, n, b in payloads},
    )


def mib(value: int) -> str:
    return f"{value / MIB:,.1f} MiB"


def print_split(database: str, split: Split, parquet: int) -> None:
    print(f"\n{database}: {mib(split.total)} = x {split.total / parquet:.1f} the parquet files")
    print(f"  {'table':<24} {'heap':>12} {'indexes':>12} {'share':>6}")
    for name, (heap, indexes) in sorted(split.tables.items(), key=lambda kv: -sum(kv[1])):
        if heap + indexes >= 64 * 1024:
            share = (heap + indexes) / split.total
            print(f"  {name:<24} {mib(heap):>12} {mib(indexes):>12} {share:>6.1%}")
    print("  event payloads by type (as stored):")
    for kind, (count, stored) in sorted(split.payloads.items(), key=lambda kv: -kv[1][1]):
        print(f"    {kind:<22} {count:>9,} events {mib(stored):>12} ({stored / count:,.0f} B each)")


def verdicts(splits: dict[str, Split], parquet: int, format_version: int) -> None:
    print()
    for database, split in splits.items():
        ratio = split.total / parquet
        target = TARGETS[database]
        if format_version < 2:
            print(f"  (no verdict: parquet format {format_version} keeps no logprobs) {database}")
            continue
        verdict = "PASS" if ratio <= target else "MISS"
        print(
            f"  {verdict} {database} size: {mib(split.total)} vs ART parquet (format 2) "
            f"{mib(parquet)} = x {ratio:.1f} (target x {target:.0f})"
        )


async def export(place: Place, url: str) -> int:
    start = time.perf_counter()
    store = await artstore.open_store(url)
    try:
        summary = await export_parquet(store, corpus.RUN, place.parquet_dir)
    finally:
        await store.close()
    files = sorted((place.parquet_dir / "trajectories").rglob("*.parquet"))
    parquet = sum(path.stat().st_size for path in files)
    print(
        f"exported to ART's parquet (format {parquet_format_version()}): {len(files)} files, "
        f"{summary.trajectories:,} trajectories, {mib(parquet)} in "
        f"{time.perf_counter() - start:.1f} s"
    )
    return parquet


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--databases", default="sqlite,postgresql")
    parser.add_argument(
        "--postgres-url",
        default=os.environ.get("ARTSTORE_BENCH_POSTGRES_URL", DEFAULT_POSTGRES_URL),
    )
    parser.add_argument("--rollouts", type=int, default=None, help="default 10,000")
    parser.add_argument("--quick", action="store_true", help="1,000 rollouts")
    parser.add_argument("--seed", type=int, default=29)
    parser.add_argument("--keep", action="store_true", help="keep the databases and files")
    args = parser.parse_args(argv)
    args.databases = [d.strip() for d in args.databases.split(",") if d.strip()]
    if set(args.databases) - set(DATABASES) or not args.databases:
        parser.error("--databases takes sqlite and/or postgresql")
    args.rollouts = args.rollouts or (1_000 if args.quick else 10_000)
    return args


async def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    run = corpus.Corpus(args.rollouts, args.seed)
    place = Place(args.postgres_url)
    one, five, _ = os.getloadavg()
    print(
        f"bench_size: {args.rollouts:,} rollouts of tools/corpus.py (seed {args.seed}); "
        f"load average {one:.2f} / {five:.2f} on {os.cpu_count()} CPUs"
    )
    try:
        urls = {}
        for database in args.databases:
            urls[database] = (
                f"sqlite:///{place.sqlite_file}"
                if database == "sqlite"
                else place.postgres_database()
            )
            seconds, events = await record(urls[database], run)
            print(f"recorded on {database}: {events:,} events in {seconds:.1f} s")
        parquet = await export(place, urls[args.databases[0]])
        splits = {
            database: sqlite_split(place.sqlite_file)
            if database == "sqlite"
            else postgres_split(urls[database])
            for database in args.databases
        }
        for database, split in splits.items():
            print_split(database, split, parquet)
        verdicts(splits, parquet, parquet_format_version())
        if args.keep:
            print(f"kept: {place.folder}, PostgreSQL databases {', '.join(place.created) or '-'}")
        return 0
    finally:
        if not args.keep:
            place.clean()


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
