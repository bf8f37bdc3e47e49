"""Every export streams: its peak memory does not grow with the run (issue 28).

Each export (the run's: jsonl, atif, otlp, parquet; a dataset's: openai, hf-sft, hf-dpo,
hf-kto, art; in CI one of each way of reading the store: otlp, parquet, hf-sft, hf-dpo)
runs through the real command line in a child process of its own
(tests/support/export_memory_driver.py), on a run of one group and on one 8 times larger
(tests/support/heavy_run.py: every rollout carries 1 MiB of its own), a group at a time.
One that streams holds a group in either run: its peak grew by 6 to 8 MiB. One that holds
the whole run holds 32 MiB of text, several times over (blobs, trajectories, lines):
checked by hand against exports that read every rollout at once (never committed), whose
peaks grew by 48 to 293 MiB (parquet reading all trajectories before the first file: 46).

Every export also reports its progress on stderr where that is no terminal (a log, a
pipe), a line per chunk of rollouts (parquet: per file; a dataset's: per page); on a
terminal a dataset's export draws a progress bar instead.

`tools/bench_export_memory.py` measures the same at 100,000 rollouts.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

from budget import LONG
from heavy_run import GROUP_SIZE, record_heavy_run

import artstore

# CI measures one format of each way of reading the store (run exports through
# export_lines, ART's parquet, dataset exports of single rollouts and of pairs); every
# format under ARTSTORE_LONG=1.
RUN_FORMATS = ("jsonl", "atif", "otlp", "parquet") if LONG else ("otlp", "parquet")
FORMATS = (
    *RUN_FORMATS,
    *(("openai", "hf-sft", "hf-dpo", "hf-kto", "art") if LONG else ("hf-sft", "hf-dpo")),
)
SMALL_GROUPS, LARGE_GROUPS = 1, 8
GROWTH_BOUND_MIB = 30
DRIVER = Path(__file__).parents[1] / "support" / "export_memory_driver.py"


def _recorded(url: str, groups: int) -> None:
    async def record() -> None:
        async with await artstore.open_store(url) as store:
            await record_heavy_run(store, groups)

    asyncio.run(record())


def test_every_export_holds_a_chunk_however_long_the_run(
    database_url, other_database_url, tmp_path
):
    _recorded(database_url, SMALL_GROUPS)
    _recorded(other_database_url, LARGE_GROUPS)
    found = subprocess.run(
        [sys.executable, str(DRIVER), database_url, other_database_url, str(tmp_path), *FORMATS],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert found.returncode == 0, found.stderr[-3000:]
    measured = {}
    for line in (tmp_path / "peaks.jsonl").read_text().splitlines():
        export = json.loads(line)
        measured[export["format"], export["run"]] = export
    grown = {
        fmt: round(measured[fmt, "large"]["peak_mib"] - measured[fmt, "small"]["peak_mib"], 1)
        for fmt in FORMATS
    }
    assert all(growth < GROWTH_BOUND_MIB for growth in grown.values()), grown
    large = LARGE_GROUPS * GROUP_SIZE
    for fmt in FORMATS:  # a line per chunk or page (a group here), also in a log
        assert measured[fmt, "large"]["progress"][-2:] == [
            f"exported {large - GROUP_SIZE}/{large} rollouts",
            f"exported {large}/{large} rollouts",
        ], fmt
