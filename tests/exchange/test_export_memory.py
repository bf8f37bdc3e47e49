"""Every export streams: its peak memory does not grow with the run (issue 28).

Each export (the run's: jsonl, atif, otlp, parquet; a dataset's: openai, hf-sft, hf-dpo,
hf-kto, art) runs through the real command line in a child process
(tests/support/export_memory_driver.py), on a run of 2 groups and on one 8 times larger
(tests/support/heavy_run.py: every rollout carries 512 KiB of its own), a group at a
time. An export that holds the whole run holds 64 x 512 KiB of text, several times over
(the blobs, the trajectories, the lines): far above the bound. One that streams holds a
group, in either run. Checked against an export that read every rollout at once (never
committed): jsonl peaked 130+ MiB above the small run's.

`tools/bench_export_memory.py` measures the same at 100,000 rollouts.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

from heavy_run import record_heavy_run

import artstore

FORMATS = ("jsonl", "atif", "otlp", "parquet", "openai", "hf-sft", "hf-dpo", "hf-kto", "art")
SMALL_GROUPS, LARGE_GROUPS = 2, 16
GROWTH_BOUND_MIB = 30  # a streaming export grows by a few MiB; a whole run is 32 MiB of text
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
    peaks = {}
    for line in (tmp_path / "peaks.jsonl").read_text().splitlines():
        measured = json.loads(line)
        peaks[measured["format"], measured["run"]] = measured
    grown = {
        fmt: peaks[fmt, "large"]["peak_mib"] - peaks[fmt, "small"]["peak_mib"] for fmt in FORMATS
    }
    assert all(growth < GROWTH_BOUND_MIB for growth in grown.values()), grown
