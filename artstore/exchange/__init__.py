"""Export runs out of the store and import trajectories recorded elsewhere.

- `export_parquet`: ART's own trajectory parquet layout (`trajectories/<split>/<step>.parquet`,
  written by the installed ART's writer: format 2, lossless, on ART >= 0.5.20; format 1, no
  logprobs, on 0.5.18); see `artstore.exchange.parquet` for the splits, steps and formats.
- `export_jsonl`: one JSON line per rollout, lossless (Choice objects with their logprobs,
  tools per history, additional histories, every reward); see `artstore.exchange.jsonl`.
- `export_atif`: one ATIF trajectory (the `atif` package's models) per line; see
  `artstore.exchange.atif_io`, which also reads ATIF files (`import_path(format="atif")`).
- `export_otlp`: OpenTelemetry GenAI traces, a trace per rollout, as OTLP JSON lines or
  sent to an OTLP/HTTP endpoint; see `artstore.exchange.otlp`, which also reads them
  (`import_path(format="otlp")`).
- `follow_otlp`: a run's rollouts sent to an OTLP/HTTP endpoint as they end, each once,
  until stopped (`artstore.exchange.following` reads them off the event log).
- `import_path`: ART parquet files of format 1 or 2 on either ART (a file, or a directory of
  `model.log` output) or a JSONL export, as imported rollouts: `rollout.started`,
  `rollout.finished` (or failed), then `trajectory.imported` (the histories as
  content-addressed blobs); rewards and sealed groups as for a recorded run; the run as
  `run.imported`. `store.trajectory(id)` returns an imported trajectory item for item, and
  the projections mark its rollout `imported`.

Importing is idempotent (ids derived from the source), each group is written in one
transaction (an append the database refuses fails alone, and importing again completes
the group), and a file that does not validate, or that clashes with what the store holds,
imports nothing. See `artstore.exchange.importer`.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from artstore.arguments import check_name, check_store
from artstore.collector import collector_paused
from artstore.errors import ExchangeFormatError, NotFoundError
from artstore.exchange.atif_io import export_atif, read_atif
from artstore.exchange.importer import ImportPlan, ImportSummary, check_plan, write_plan
from artstore.exchange.jsonl import export_jsonl, read_jsonl
from artstore.exchange.otlp import FollowSummary, export_otlp, follow_otlp, read_otlp
from artstore.exchange.parquet import export_parquet, read_parquet
from artstore.exchange.source import ExportSummary

if TYPE_CHECKING:
    from artstore.store import Store

__all__ = [
    "ExportSummary",
    "FollowSummary",
    "ImportSummary",
    "export_atif",
    "export_jsonl",
    "export_otlp",
    "export_parquet",
    "follow_otlp",
    "import_path",
    "read_plan",
    "write_plan",
]


def read_plan(
    path: str | Path,
    *,
    run: str | None = None,
    scorer: str = "imported",
    format: str | None = None,
) -> ImportPlan:
    """What importing `path` would write (nothing is written): parquet file or tree, or JSONL.

    Every event is built and checked: a file that cannot be imported is refused here,
    before any store is opened (`artstore import` creates no store for it)."""
    check_name("run", run, optional=True)
    check_name("scorer", scorer)
    path = Path(path)
    if not path.exists():
        raise NotFoundError(f"{path}: no such file or directory")
    # A plan holds every trajectory of the file until it is written: with the collector
    # on, reading a 10,000-rollout JSONL spent 40% of its time traversing them again and
    # again (artstore.collector).
    if format == "otlp":
        if not path.is_file():
            raise ExchangeFormatError(f"{path}: an OTLP import reads a .jsonl or .json file")
        with collector_paused():
            return check_plan(read_otlp(path, run=run, scorer=scorer))
    if format == "atif":
        if not path.is_file():
            raise ExchangeFormatError(f"{path}: an ATIF import reads a .jsonl or .json file")
        with collector_paused():
            return check_plan(read_atif(path, run=run, scorer=scorer))
    if path.is_file() and path.suffix == ".jsonl":
        with collector_paused():
            return check_plan(read_jsonl(path, run=run, scorer=scorer))
    if path.is_dir() or path.suffix == ".parquet":
        with collector_paused():
            return check_plan(read_parquet(path, run=run, scorer=scorer))
    raise ExchangeFormatError(
        f"{path}: artstore imports ART trajectory parquet files (a .parquet file, or a "
        "directory of trajectories/<split>/<step>.parquet) and its own JSONL exports (.jsonl)"
    )


async def import_path(
    store: Store,
    path: str | Path,
    *,
    run: str | None = None,
    scorer: str = "imported",
    format: str | None = None,
) -> ImportSummary:
    """Import `path` into `store` (see the module's docstring).

    `format="atif"` or `"otlp"` reads an ATIF or OTLP JSON file (else the file's suffix
    tells which format).
    `run` names the run (default: the JSONL's own run, or `<project>/<name>` of ART's
    layout, else the file's name); `scorer` names the parquet's rewards.
    """
    check_store(store)
    return await write_plan(store, read_plan(path, run=run, scorer=scorer, format=format))
