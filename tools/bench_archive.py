"""`artstore archive` against ART's own parquet: size of the same run, and how long.

The issue's question (29, point 3): is a run's archive, which keeps every event and blob
as stored (restorable byte for byte), within 1.2x of ART's trajectory parquet (format 2
on ART >= 0.5.20) for the same run? One run of this script records the run of
tools/bench_queries.py (`plan_run`: steps x 25 groups x 8 rollouts of three LLM calls,
rewarded, sealed and trained) into each database, exports it with
`artstore.exchange.export_parquet` (ART's layout, ART's writer), archives it with
`artstore.archive.archive_run` to a local folder, restores it with `restore_run`, and
prints side by side: the database's size before, the parquet files' bytes, the archive's
bytes (segments + manifest), their ratio with PASS/MISS against 1.2, and the seconds of
export, archive and restore.

    python tools/bench_archive.py [--rollouts 10000] [--databases sqlite,postgresql]

Both files hold the same run but not the same thing: ART's parquet keeps one row per
trajectory (its messages and choices as JSON, logprobs in format 2), the archive every
event (each LLM call with its request, tokens and timings; rollouts, rewards, seals,
train steps) and every message once, by hash. The run's answers repeat (see
tools/bench_queries.py), which flatters both files' compression alike.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
sys.path.insert(0, str(Path(__file__).parent))

import bench_queries  # tools/bench_queries.py: the run, and where the data live
from rich.console import Console
from rich.table import Table

import artstore
from artstore.archive import archive_run, restore_run
from artstore.art_versions import parquet_format_version
from artstore.exchange import export_parquet

RATIO_TARGET = 1.2  # the archive / ART's parquet, at most


def folder_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


async def measure(database: str, url: str, place: bench_queries.Place, steps: int) -> dict:
    plan = bench_queries.plan_run(steps, seed=29)
    out = place.folder / database
    async with await artstore.open_store(url) as store:
        await bench_queries.record(store, plan)
    size = (
        bench_queries.sqlite_bytes(place.sqlite_file)
        if database == "sqlite"
        else bench_queries.postgres_bytes(url)
    )
    async with await artstore.open_store(url) as store:
        started = time.perf_counter()
        await export_parquet(store, bench_queries.RUN, out / "parquet")
        exported = time.perf_counter() - started
        started = time.perf_counter()
        summary = await archive_run(store, bench_queries.RUN, str(out / "archive"))
        archived = time.perf_counter() - started
        started = time.perf_counter()
        restored = await restore_run(store, bench_queries.RUN, str(out / "archive"))
        restore_s = time.perf_counter() - started
    assert restored.num_events == summary.num_events
    return {
        "database": size,
        "parquet": folder_bytes(out / "parquet"),
        "archive": folder_bytes(out / "archive"),
        "events": summary.num_events,
        "blobs": summary.num_blobs,
        "export_s": exported,
        "archive_s": archived,
        "restore_s": restore_s,
    }


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=10_000)
    parser.add_argument("--databases", default="sqlite,postgresql")
    parser.add_argument("--postgres-url", default=bench_queries.DEFAULT_POSTGRES_URL)
    args = parser.parse_args()
    steps = max(1, args.rollouts // bench_queries.ROLLOUTS_PER_STEP)
    place = bench_queries.Place(args.postgres_url)
    results = {}
    try:
        for database in args.databases.split(","):
            url = (
                f"sqlite:///{place.sqlite_file}"
                if database == "sqlite"
                else place.postgres_database()
            )
            results[database] = await measure(database, url, place, steps)
    finally:
        place.clean()
    mib = 1024 * 1024
    table = Table(
        title=f"{steps * bench_queries.ROLLOUTS_PER_STEP:,} rollouts, ART parquet format "
        f"{parquet_format_version()}"
    )
    for column in (
        "database",
        "db MiB",
        "parquet MiB",
        "archive MiB",
        "archive / parquet",
        "events",
        "blobs",
        "export s",
        "archive s",
        "restore s",
    ):
        table.add_column(column, justify="right")
    verdicts = []
    for database, r in results.items():
        ratio = r["archive"] / r["parquet"]
        verdicts.append(
            f"{'PASS' if ratio <= RATIO_TARGET else 'MISS'} {database}: archive "
            f"{r['archive'] / mib:.2f} MiB = x {ratio:.2f} ART's parquet "
            f"{r['parquet'] / mib:.2f} MiB (target x {RATIO_TARGET})"
        )
        table.add_row(
            database,
            f"{r['database'] / mib:.1f}",
            f"{r['parquet'] / mib:.2f}",
            f"{r['archive'] / mib:.2f}",
            f"{ratio:.2f}",
            f"{r['events']:,}",
            f"{r['blobs']:,}",
            f"{r['export_s']:.1f}",
            f"{r['archive_s']:.1f}",
            f"{r['restore_s']:.1f}",
        )
    console = Console(width=140)
    console.print(table)
    for line in verdicts:
        console.print(line, highlight=False)
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
