"""Peak memory of every export, at N rollouts and at N/100, on SQLite and PostgreSQL.

Issue 28: "Every export streams (constant memory at 100,000 rollouts) and shows progress".
This script records the same generated run twice into each database, once of N/100 and
once of N rollouts (`--rollouts`, default 100,000), then runs each export as its own
subprocess, the real command a user types:

- `artstore export RUN OUT --format jsonl | atif | otlp | parquet`;
- `artstore dataset export NAME --format openai | hf-sft | hf-dpo | hf-kto | art --out OUT`
  (the dataset: every finished policy rollout of the run, `Selection(run=RUN)`);

and reads its peak resident set size from the kernel once it exits (`os.wait4`'s
`ru_maxrss`: that child's own peak, whatever it did). It prints a table (format,
database, rollouts, seconds, peak RSS MiB, progress lines the export wrote on stderr) and
one PASS/MISS line per format and database: PASS when the peak at N is within 1.5x, or
+50 MiB, of the peak at N/100 (the part of memory that grows with the run: whatever an
export holds per rollout beyond its outline of ids).

The run is `tools/bench_queries.py`'s (`plan_run`, recorded with `store.append_nowait` in
bulk): train steps of 25 groups x 8 rollouts, each rollout three LLM calls (tool call,
tool call, answer) of small messages with a few logprobs, rewarded and trained at its
step: a small conversation, so that 100,000 rollouts record in tens of minutes on 2 CPUs;
the exports' memory per chunk is what a realistic conversation would multiply, the
growth with N is what this measures. Two databases of each kind (SQLite files and fresh
PostgreSQL databases `bench_queries_*`), dropped at the end unless `--keep`.

    python tools/bench_export_memory.py --rollouts 10000
    python tools/bench_export_memory.py --rollouts 10000 --databases sqlite --formats jsonl,art
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from bench_queries import (  # tools/bench_queries.py, beside this file
    DEFAULT_POSTGRES_URL,
    ROLLOUTS_PER_STEP,
    RUN,
    Place,
    load,
)

RUN_FORMATS = ("jsonl", "atif", "otlp", "parquet")
DATASET_FORMATS = ("openai", "hf-sft", "hf-dpo", "hf-kto", "art")
DATASET = "bench"
RATIO, SLACK_MIB = 1.5, 50.0


@dataclass
class Measured:
    format: str
    database: str
    rollouts: int
    seconds: float
    peak_mib: float
    progress_lines: int


def export_command(fmt: str, url: str, out: Path) -> list[str]:
    """The command a user types to export the bench run (or its dataset) as `fmt`."""
    artstore_command = shutil.which("artstore") or "artstore"
    if fmt in RUN_FORMATS:
        return [artstore_command, "export", RUN, str(out), "--format", fmt, "--url", url]
    out_option = ["--out", str(out), "--url", url]
    return [artstore_command, "dataset", "export", DATASET, "--format", fmt, *out_option]


def run_export(command: list[str]) -> tuple[float, float, str]:
    """Run one export to its end: (seconds, its own peak RSS in MiB, its stderr)."""
    start = time.perf_counter()
    child = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    assert child.stderr is not None
    stderr = child.stderr.read().decode(errors="replace")
    _, status, usage = os.wait4(child.pid, 0)
    child.returncode = os.waitstatus_to_exitcode(status)
    seconds = time.perf_counter() - start
    if child.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed ({child.returncode}): {stderr[-2000:]}")
    return seconds, usage.ru_maxrss / 1024, stderr  # ru_maxrss: KiB on Linux


def launcher_mib() -> float:
    """This process's resident set size now, in MiB."""
    with open("/proc/self/status") as status:
        line = next(line for line in status if line.startswith("VmRSS:"))
    return int(line.split()[1]) / 1024


def progress_lines(stderr: str) -> int:
    """The lines that say how far an export got (`exported n/N`, or a progress bar's)."""
    lines = stderr.replace("\r", "\n").splitlines()
    return sum(1 for line in lines if "exported" in line or "exporting" in line)


def recorded(place: Place, database: str, rollouts: int, seed: int) -> str:
    """A fresh database of `database` holding the bench run of `rollouts` and its dataset;
    its URL. Recorded by a child process: Linux counts the RSS a process had when it
    forked in its children's peak (`ru_maxrss`), so this one stays small."""
    if database == "sqlite":
        path = place.folder / f"artstore-{rollouts}.db"
        url = f"sqlite:///{path}"
    else:
        url = place.postgres_database()
    start = time.perf_counter()
    command = [sys.executable, __file__, "--record", url, "--rollouts", str(rollouts)]
    subprocess.run([*command, "--seed", str(seed)], check=True)
    print(
        f"recorded {rollouts:,} rollouts on {database} in {time.perf_counter() - start:.0f} s "
        f"({load()})",
        flush=True,
    )
    return url


async def record_run(url: str, rollouts: int, seed: int) -> None:
    """Record the bench run of `rollouts` at `url` (in bulk) and its dataset."""
    from bench_queries import plan_run, record

    import artstore
    from artstore.datasets import Selection, create_dataset

    plan = plan_run(rollouts // ROLLOUTS_PER_STEP, seed)
    async with await artstore.open_store(url) as store:
        await record(store, plan)
        await create_dataset(store, DATASET, Selection(run=RUN))


def measure(formats: list[str], database: str, url: str, rollouts: int, place: Place) -> list:
    found = []
    for fmt in formats:
        out = place.folder / f"out-{database}-{rollouts}-{fmt}"
        if fmt in ("jsonl", "atif", "otlp", "openai"):
            out = out.with_suffix(".jsonl")
        seconds, peak, stderr = run_export(export_command(fmt, url, out))
        found.append(Measured(fmt, database, rollouts, seconds, peak, progress_lines(stderr)))
        shutil.rmtree(out, ignore_errors=True) if out.is_dir() else out.unlink(missing_ok=True)
        print(
            f"  {fmt:8} {database:10} {rollouts:>8,} {seconds:8.1f} s {peak:8.1f} MiB", flush=True
        )
    return found


def verdicts(found: list[Measured], small: int, large: int) -> list[str]:
    """A PASS/MISS line per format and database: the peak at `large` against `small`'s."""
    lines = []
    peaks = {(m.format, m.database, m.rollouts): m.peak_mib for m in found}
    for fmt, database in dict.fromkeys((m.format, m.database) for m in found):
        low, high = peaks.get((fmt, database, small)), peaks.get((fmt, database, large))
        if low is None or high is None:
            continue
        bound = max(low * RATIO, low + SLACK_MIB)
        verdict = "PASS" if high <= bound else "MISS"
        lines.append(
            f"{verdict} {fmt} on {database}: {high:.0f} MiB at {large:,} rollouts, "
            f"{low:.0f} MiB at {small:,} (bound {bound:.0f} MiB)"
        )
    return lines


def table(found: list[Measured]) -> str:
    rows = ["| format | database | rollouts | seconds | peak RSS MiB | progress lines |"]
    rows.append("|---|---|---:|---:|---:|---:|")
    for m in sorted(found, key=lambda m: (m.format, m.database, m.rollouts)):
        rows.append(
            f"| {m.format} | {m.database} | {m.rollouts:,} | {m.seconds:.1f} | "
            f"{m.peak_mib:.0f} | {m.progress_lines} |"
        )
    return "\n".join(rows)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rollouts", type=int, default=100_000, help="N (default 100,000)")
    parser.add_argument("--databases", default="sqlite,postgresql", help="comma-separated")
    parser.add_argument(
        "--formats",
        default=",".join(RUN_FORMATS + DATASET_FORMATS),
        help="comma-separated (default: all nine)",
    )
    parser.add_argument(
        "--postgres-url",
        default=os.environ.get("ARTSTORE_BENCH_POSTGRES_URL", DEFAULT_POSTGRES_URL),
        help="a PostgreSQL server where the user may create databases",
    )
    parser.add_argument("--seed", type=int, default=5, help="of the generated run")
    parser.add_argument("--keep", action="store_true", help="keep the databases")
    parser.add_argument("--record", metavar="URL", help=argparse.SUPPRESS)  # the child's work
    args = parser.parse_args(argv)
    args.databases = [d for d in args.databases.split(",") if d]
    args.formats = [f for f in args.formats.split(",") if f]
    unknown = set(args.formats) - set(RUN_FORMATS + DATASET_FORMATS)
    if unknown:
        parser.error(f"unknown formats: {sorted(unknown)}")
    if (
        args.rollouts < ROLLOUTS_PER_STEP * (1 if args.record else 2)
        or args.rollouts % ROLLOUTS_PER_STEP
    ):
        parser.error(f"--rollouts must be a multiple of {ROLLOUTS_PER_STEP}, at least two")
    return args


def small_size(rollouts: int) -> int:
    """N/100 in whole train steps (at least one: N/50 at 10,000 rollouts)."""
    return max(1, round(rollouts / 100 / ROLLOUTS_PER_STEP)) * ROLLOUTS_PER_STEP


async def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.record:
        await record_run(args.record, args.rollouts, args.seed)
        return 0
    place = Place(args.postgres_url)
    small, large = small_size(args.rollouts), args.rollouts
    found: list[Measured] = []
    try:
        print(f"bench_export_memory: {small:,} and {large:,} rollouts ({load()})", flush=True)
        for database in args.databases:
            for rollouts in (small, large):
                url = recorded(place, database, rollouts, args.seed)
                found += measure(args.formats, database, url, rollouts, place)
        print(table(found))
        print(
            f"(the launcher's own RSS, which no child's peak reads below: {launcher_mib():.0f} MiB)"
        )
        lines = verdicts(found, small, large)
        print("\n".join(lines))
        return 0 if all(line.startswith("PASS") for line in lines) else 1
    finally:
        if args.keep:
            print(f"kept: {place.folder}, PostgreSQL databases {', '.join(place.created)}")
        else:
            place.clean()


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
