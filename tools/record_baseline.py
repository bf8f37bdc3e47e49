"""Record bench_queries' run with an earlier artstore, taken from this repository's history.

`tools/bench_queries.py` checks its recording target (issue 13: >= 5x) against artstore
as it was before projections were written in bulk, when each event was projected by
statements of its own. That code is gone from the working tree, so it is taken from git:

    python tools/record_baseline.py COMMIT --rollouts 10000 --databases sqlite,postgresql

extracts COMMIT (`git archive`) into a temporary folder and runs, in a child process
whose `artstore` is the extracted one, that commit's own `tools/bench_queries.py`: its
`plan_run` builds the run (same seed, same shape) and its `record` queues every append
and waits, on a fresh SQLite file and a fresh PostgreSQL database, timed as
bench_queries times its own recording. With `--import-file PATH` (an artstore JSONL
export), it then times that commit's `artstore.exchange.import_path` of the file into
another fresh database of each kind, as bench_queries times today's. The last line
printed is JSON: `{"commit", "rollouts", "rates": {database: events per second},
"import_seconds": {database: seconds}}`.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[1]

# Runs in the child, whose PYTHONPATH puts the extracted tree first (argv: tree,
# rollouts, seed, databases as JSON, PostgreSQL URL, the JSONL to import or "").
_CHILD = """
import asyncio, importlib.util, json, sys, time
tree, rollouts, seed, databases, postgres_url, import_file = sys.argv[1:7]
import artstore
assert artstore.__file__.startswith(tree), artstore.__file__
spec = importlib.util.spec_from_file_location("baseline_bench", f"{tree}/tools/bench_queries.py")
bench = sys.modules["baseline_bench"] = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)

async def timed(place, database, sqlite_name, work):
    # Seconds work(store) takes on a fresh database of the kind.
    if database == "sqlite":
        url = f"sqlite:///{place.folder / sqlite_name}"
    else:
        url = place.postgres_database()
    store = await artstore.open_store(url)
    try:
        start = time.perf_counter()
        await work(store)
        return time.perf_counter() - start
    finally:
        await store.close()

async def main():
    plan = bench.plan_run(int(rollouts) // bench.ROLLOUTS_PER_STEP, int(seed))
    place = bench.Place(postgres_url)
    rates, import_seconds = {}, {}
    try:
        for database in json.loads(databases):
            seconds = await timed(place, database, "artstore.db", lambda s: bench.record(s, plan))
            rates[database] = plan.events / seconds
            if import_file:
                from artstore.exchange import import_path
                import_seconds[database] = await timed(
                    place, database, "imported.db", lambda s: import_path(s, import_file)
                )
    finally:
        place.clean()
    print(json.dumps({"events": plan.events, "rates": rates, "import_seconds": import_seconds}))

asyncio.run(main())
"""


def available(commit: str) -> bool:
    """Whether this checkout's git history holds `commit` (not so in a source archive)."""
    try:
        found = subprocess.run(
            ["git", "-C", str(REPOSITORY), "cat-file", "-e", f"{commit}^{{commit}}"],
            capture_output=True,
        )
    except OSError:
        return False
    return found.returncode == 0


@dataclass
class BaselineRun:
    """What `commit` measured, per database."""

    rates: dict[str, float]  # recording the run: events per second
    import_seconds: dict[str, float] = field(default_factory=dict)  # importing the file


def record(
    commit: str,
    *,
    rollouts: int,
    seed: int,
    databases: Sequence[str],
    postgres_url: str,
    import_file: Path | None = None,
) -> BaselineRun:
    """`commit`'s recording of the run, and its import of `import_file` if given."""
    with tempfile.TemporaryDirectory(prefix="artstore_baseline_") as tree:
        archive = subprocess.run(
            ["git", "-C", str(REPOSITORY), "archive", "--format=tar", commit],
            capture_output=True,
            check=True,
        ).stdout
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            tar.extractall(tree, filter="tar")
        environment = {**os.environ, "PYTHONPATH": tree}
        # The child runs in the extracted tree: the file's path must not be relative.
        imported = str(import_file.resolve()) if import_file else ""
        child_args = [json.dumps(list(databases)), postgres_url, imported]
        child = subprocess.run(
            [sys.executable, "-c", _CHILD, tree, str(rollouts), str(seed), *child_args],
            cwd=tree,
            env=environment,
            capture_output=True,
            text=True,
        )
        if child.returncode != 0:
            tail = (child.stderr or child.stdout).strip().splitlines()[-1:]
            raise RuntimeError(f"the baseline ({commit[:12]}) failed: {' '.join(tail)}")
        measured = json.loads(child.stdout.strip().splitlines()[-1])
        return BaselineRun(measured["rates"], measured["import_seconds"])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("commit")
    parser.add_argument("--rollouts", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=5)
    parser.add_argument("--databases", default="sqlite,postgresql")
    parser.add_argument("--import-file", type=Path, help="an artstore JSONL export to import")
    parser.add_argument(
        "--postgres-url",
        default=os.environ.get(
            "ARTSTORE_BENCH_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test"
        ),
    )
    args = parser.parse_args(argv)
    if not available(args.commit):
        parser.error(f"this checkout has no commit {args.commit}")
    databases = [d.strip() for d in args.databases.split(",") if d.strip()]
    run = record(
        args.commit,
        rollouts=args.rollouts,
        seed=args.seed,
        databases=databases,
        postgres_url=args.postgres_url,
        import_file=args.import_file,
    )
    print(
        json.dumps(
            {
                "commit": args.commit,
                "rollouts": args.rollouts,
                "rates": run.rates,
                "import_seconds": run.import_seconds,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
