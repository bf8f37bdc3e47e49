"""Each export of a small and a large run, each in a fresh process, with its peak memory.

    python tests/support/export_memory_driver.py SMALL_URL LARGE_URL OUT_DIR FORMAT...

Runs `artstore export heavy OUT --format F` (jsonl, atif, otlp, parquet) or `artstore
dataset export heavy-set --format F --out OUT` (openai, hf-*, art) through the real
command line, on the small run's store and on the large one's. This process imports what
the exports use once, then forks a child per export (starting a new interpreter per
export would cost the test a minute of imports): each child starts from the same memory,
sets the kernel's peak resident set size to what it holds then (`/proc/self/clear_refs`,
5), runs the export and reads its peak (`VmHWM`): what the export itself added, never
what an earlier export left behind. Chunks and pages are one group
(`heavy_run.GROUP_SIZE` rollouts), so the small run is one and the large one eight. Writes a JSON
line per export to OUT_DIR/peaks.jsonl: format, run, peak MiB, and the lines it wrote
on stderr that report progress.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
from pathlib import Path

from heavy_run import DATASET, GROUP_SIZE, RUN

RUN_FORMATS = ("jsonl", "atif", "otlp", "parquet")


def _warm() -> None:
    """Import, once, what the exports import on their first use (each child would again)."""
    import importlib

    for name in (
        "aiosqlite",
        "asyncpg",
        "art.langgraph",
        "art.utils.trajectory_logging",
        "artstore.cli",
        "artstore.datasets.export",
        "artstore.exchange",
        "artstore.store",
        "google.protobuf.json_format",
        "langchain_openai",
        "opentelemetry.exporter.otlp.proto.common.trace_encoder",
        "opentelemetry.sdk.trace.export.in_memory_span_exporter",
        "pandas",
        "pyarrow.compute",
        "pyarrow.pandas_compat",
        "pyarrow.parquet",
    ):
        importlib.import_module(name)


def _peak_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def _command(fmt: str, url: str, out: Path) -> list[str]:
    if fmt in RUN_FORMATS:
        return ["export", RUN, str(out), "--format", fmt, "--url", url]
    return ["dataset", "export", DATASET, "--format", fmt, "--out", str(out), "--url", url]


def _export(fmt: str, url: str, out: Path) -> tuple[float, str]:
    """Run one export through the command line: (its peak MiB, what it wrote on stderr)."""
    from typer.main import get_command

    from artstore.cli import app
    from artstore.datasets import export as dataset_export
    from artstore.exchange import source

    source.CHUNK_ROLLOUTS = GROUP_SIZE
    dataset_export.PAGE = GROUP_SIZE
    stderr = io.StringIO()
    Path("/proc/self/clear_refs").write_text("5")
    with contextlib.redirect_stderr(stderr):
        get_command(app).main(_command(fmt, url, out), standalone_mode=False)
    return _peak_mib(), stderr.getvalue()


def _in_child(fmt: str, name: str, url: str, folder: Path) -> None:
    """Fork; the child exports and writes its line, the parent waits for it."""
    pid = os.fork()
    if pid:
        _, status = os.waitpid(pid, 0)
        if os.waitstatus_to_exitcode(status):
            raise SystemExit(f"the {fmt} export of the {name} run failed")
        return
    try:
        suffix = ".jsonl" if fmt in ("jsonl", "atif", "otlp", "openai") else ""
        peak, stderr = _export(fmt, url, folder / f"{fmt}-{name}{suffix}")
        progress = [line for line in stderr.splitlines() if line.startswith("exported ")]
        measured = {"format": fmt, "run": name, "peak_mib": peak, "progress": progress}
        with open(folder / "peaks.jsonl", "a") as peaks:  # (stdout: the commands')
            peaks.write(json.dumps(measured) + "\n")
    except BaseException as exc:
        print(f"{fmt} {name}: {exc!r}", file=sys.__stderr__, flush=True)
        os._exit(1)
    os._exit(0)


def main(small: str, large: str, folder: str, formats: list[str]) -> None:
    _warm()
    for fmt in formats:
        for name, url in (("small", small), ("large", large)):
            _in_child(fmt, name, url, Path(folder))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:])
