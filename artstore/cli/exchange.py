"""`artstore export` and `artstore import`: runs to and from files.

artstore export RUN OUT_DIR --format parquet    # ART's trajectories/<split>/<step>.parquet
artstore export RUN run.jsonl                   # lossless JSONL, one line per rollout
artstore export RUN run.atif.jsonl --format atif  # ATIF trajectories, one per line
artstore export RUN --otlp-endpoint URL --follow  # GenAI traces, each rollout as it ends
artstore import .art/my-project/models/agent-001 --run agent-001-from-art
artstore import run.jsonl --url postgresql://...
"""

from __future__ import annotations

import os
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer

from artstore.cli.output import counted
from artstore.cli.shared import UrlOption, console, err_console, fail, run, say_error


class ExportFormat(StrEnum):
    parquet = "parquet"
    jsonl = "jsonl"
    atif = "atif"
    otlp = "otlp"


class ImportFormat(StrEnum):
    atif = "atif"
    otlp = "otlp"


RunArgument = Annotated[str, typer.Argument(metavar="RUN", help="The run to export.")]
OutArgument = Annotated[
    Path | None,
    typer.Argument(
        metavar="[OUT]",
        show_default=False,
        help="parquet: a directory (trajectories/<split>/<step>.parquet go under it); "
        "jsonl, atif, otlp: a file, or - for stdout (otlp: none with --otlp-endpoint).",
    ),
]
ExportFormatOption = Annotated[
    ExportFormat | None,
    typer.Option(
        "--format",
        help="parquet (ART's layout and format, readable by ART), jsonl (lossless) or "
        "atif (Agent Trajectory Interchange Format, one trajectory per line) or otlp "
        "(OpenTelemetry GenAI traces, OTLP JSON lines). "
        "Default: jsonl when OUT ends with .jsonl or is -, else parquet.",
        show_default=False,
    ),
]
ExportScorerOption = Annotated[
    str | None,
    typer.Option(help="parquet: whose rewards to write (default: the run's scorer)."),
]
ExportModelOption = Annotated[
    str | None,
    typer.Option(
        help="parquet: number the files by this trained model's steps (project/name; "
        "default: the run's own model)."
    ),
]
EndpointOption = Annotated[
    str | None,
    typer.Option(
        "--otlp-endpoint",
        help="otlp: send the traces to this OTLP/HTTP endpoint (a URL ending in "
        "/v1/traces), instead of or as well as writing OUT.",
        show_default=False,
    ),
]
FollowOption = Annotated[
    bool,
    typer.Option(
        "--follow",
        help="otlp, with --otlp-endpoint: keep running and send each rollout as it ends "
        "(finishes or fails), once, until Ctrl-C or SIGTERM; the last line gives the "
        "position --after resumes from.",
    ),
]
AfterOption = Annotated[
    int | None,
    typer.Option(
        "--after",
        min=0,
        metavar="POSITION",
        help="--follow: send only the rollouts that end after this event position (the "
        "one a previous --follow stopped at), none of those before.",
        show_default=False,
    ),
]
NewOnlyOption = Annotated[
    bool,
    typer.Option("--new-only", help="--follow: send only the rollouts that end from now on."),
]
ForceOption = Annotated[bool, typer.Option("--force", help="Overwrite existing files.")]
PathArgument = Annotated[
    Path,
    typer.Argument(
        metavar="PATH",
        help="An ART trajectory .parquet file, a directory of them (a model's directory "
        "under .art, where model.log writes trajectories/<split>/<step>.parquet), or a "
        ".jsonl export.",
        show_default=False,
    ),
]
ImportRunOption = Annotated[
    str | None,
    typer.Option(
        "--run",
        help="Import into this run. Default: the JSONL's run, or <project>/<name> from "
        "ART's layout, else the file's name.",
        show_default=False,
    ),
]
ImportFormatOption = Annotated[
    ImportFormat | None,
    typer.Option(
        "--format",
        help="atif: PATH is ATIF (a .jsonl of trajectories, or a .json of one); otlp: OTLP "
        "JSON (an ExportTraceServiceRequest per line, or a .json of one). Default: "
        "the suffix tells (.jsonl: artstore's JSONL; .parquet or a directory: ART's parquet).",
        show_default=False,
    ),
]
ImportScorerOption = Annotated[
    str, typer.Option(help="parquet: the scorer name the parquet's rewards are kept under.")
]


def export(
    run_name: RunArgument,
    out: OutArgument = None,
    format: ExportFormatOption = None,
    scorer: ExportScorerOption = None,
    model: ExportModelOption = None,
    force: ForceOption = False,
    otlp_endpoint: EndpointOption = None,
    follow: FollowOption = False,
    after: AfterOption = None,
    new_only: NewOnlyOption = False,
    url: UrlOption = None,
) -> None:
    """Write a run to files: ART's parquet layout, artstore's lossless JSONL, ATIF or OTLP.

    parquet: policy groups under trajectories/train/<step>.parquet, the step after the train
    step that consumed them; validation trajectories under val/; groups never trained under
    unconsumed/<batch>.parquet (and unconsumed_val/), in the format of the installed ART's
    writer: format 2 on ART >= 0.5.20 (lossless, logprobs included), format 1 on ART 0.5.18
    (no logprobs, no additional histories). jsonl keeps everything and imports back with
    `artstore import`. atif: one ATIF trajectory per line; otlp: OpenTelemetry GenAI spans,
    to a file or to an OTLP/HTTP endpoint, and with --follow to the endpoint as rollouts end.
    """
    chosen = _chosen_format(format, out, otlp_endpoint, parquet_only=bool(scorer or model))
    _check_follow(follow, otlp_endpoint, out, after, new_only)
    if follow:
        from artstore.cli.following import follow as follow_run

        run(lambda: follow_run(run_name, otlp_endpoint, url, after=after, new_only=new_only))
        return

    async def work() -> None:
        import artstore
        from artstore.exchange import export_atif, export_jsonl, export_otlp, export_parquet

        async with await artstore.open_store(url, read_only=True) as store:
            if chosen is ExportFormat.jsonl:
                summary = await export_jsonl(store, run_name, out, force=force, progress=_progress)
            elif chosen is ExportFormat.otlp:
                summary = await export_otlp(
                    store,
                    run_name,
                    out,
                    endpoint=otlp_endpoint,
                    force=force,
                    progress=_progress,
                )
            elif chosen is ExportFormat.atif:
                summary = await export_atif(store, run_name, out, force=force, progress=_progress)
            else:
                summary = await export_parquet(
                    store,
                    run_name,
                    out,
                    scorer=scorer,
                    model=model,
                    force=force,
                    progress=_progress,
                )
        _say_exported(summary, run_name, out, chosen, scorer)

    run(work)


def _chosen_format(
    format: ExportFormat | None, out: Path | None, endpoint: str | None, *, parquet_only: bool
) -> ExportFormat:
    """The format to export in (given, or told by OUT), once the options agree with it."""
    to_stdout = str(out) == "-"
    chosen = format or (
        ExportFormat.otlp
        if endpoint
        else ExportFormat.jsonl
        if to_stdout or (out and out.suffix == ".jsonl")
        else ExportFormat.parquet
    )
    if chosen is not ExportFormat.parquet and parquet_only:
        raise fail("--scorer and --model apply to --format parquet only")
    if endpoint and chosen is not ExportFormat.otlp:
        raise fail("--otlp-endpoint applies to --format otlp only")
    if out is None and not endpoint:
        raise fail("give OUT, the path to write (or --otlp-endpoint with --format otlp)")
    return chosen


def _check_follow(
    follow: bool, endpoint: str | None, out: Path | None, after: int | None, new_only: bool
) -> None:
    if follow and (not endpoint or out is not None):
        raise fail("--follow sends to --otlp-endpoint only (give no OUT)")
    if (after is not None or new_only) and not follow:
        raise fail("--after and --new-only apply to --follow only")
    if after is not None and new_only:
        raise fail("give --after or --new-only, not both")


def _progress(done: int, total: int) -> None:
    """A line on stderr per chunk of rollouts (parquet: per file) written (the export may
    be on stdout); a run of one chunk gets only the closing line."""
    from artstore.exchange.source import CHUNK_ROLLOUTS

    if done < total or total > CHUNK_ROLLOUTS:
        err_console.print(f"exported {done}/{total} rollouts", highlight=False)


def _say_exported(
    summary: Any, run_name: str, out: Path | None, chosen: ExportFormat, scorer: str | None
) -> None:
    """What was written where, and what was left out (on stderr when the rows are on stdout)."""
    # Progress and notes go to stderr: `export RUN -` writes the JSONL to stdout.
    where = "stdout" if str(out) == "-" else summary.path if out is None else out
    trajectories = counted(summary.trajectories, "trajectory", "trajectories")
    what = f"{trajectories} in {counted(summary.groups, 'group')}"
    if chosen is not ExportFormat.parquet:
        err_console.print(f"wrote {what} of run {run_name!r} to {where}", highlight=False)
    else:
        from artstore.art_versions import parquet_format_version

        console.print(
            f"wrote {what} of run {run_name!r} to {counted(len(summary.files), 'file')} under "
            f"{Path(summary.path) / 'trajectories'} "
            f"(ART's parquet format {parquet_format_version()})",
            highlight=False,
        )
    by = repr(scorer) if scorer else "the run's scorer"
    left_out = [
        (summary.unscored_groups, f"groups without a reward by {by}"),
        (summary.unsealed_groups, "unsealed groups"),
        (summary.failed_rollouts if chosen is ExportFormat.parquet else 0, "failed rollouts"),
        (summary.running_rollouts, "rollouts still running"),
    ]
    for count, what in left_out:
        if count:
            err_console.print(f"left out: {count} {what}", highlight=False)


def import_(
    path: PathArgument,
    run_name: ImportRunOption = None,
    scorer: ImportScorerOption = "imported",
    format: ImportFormatOption = None,
    url: UrlOption = None,
) -> None:
    """Bring trajectories recorded elsewhere into the store, as imported rollouts.

    Rollouts, rewards and groups land in the same tables as recorded ones (rollouts marked
    imported) and `store.trajectory(id)` returns them as they were. Importing the same file
    again writes nothing; each group is written in one transaction, and a file that does
    not validate, or clashes with what the store holds, imports nothing.
    """

    _check_readable_input(path)

    async def work() -> None:
        import artstore
        from artstore.exchange import read_plan, write_plan

        # Read and checked whole before the store is opened: a file that cannot be
        # imported creates no store.
        plan = read_plan(path, run=run_name, scorer=scorer, format=format and format.value)
        async with await artstore.open_store(url) as store:
            summary = await write_plan(store, plan)
        _say_imported(summary, path)

    run(work)


def _say_imported(summary: Any, path: Path) -> None:
    """What was imported, and what the imported trajectories can and cannot be used for."""
    source = f"{summary.files} parquet files" if summary.source == "parquet" else str(path)
    if summary.source == "parquet" and summary.files == 1:
        source = str(path)
    if not summary.written_rollouts:
        console.print(
            f"nothing new: the {summary.rollouts} rollouts of {source} are already in run "
            f"{summary.run!r}",
            highlight=False,
        )
        return
    again = summary.rollouts - summary.written_rollouts
    console.print(
        f"imported {summary.written_rollouts} rollouts in {summary.groups} groups "
        f"({summary.sealed_groups} sealed) into run {summary.run!r} from {source}"
        + (f"; {again} were already imported" if again else ""),
        highlight=False,
    )
    _note_untrainable(summary)


def _note_untrainable(summary: Any) -> None:
    from artstore.art_versions import has_exchanges

    if summary.source == "parquet" and 1 in summary.formats:
        err_console.print(
            "note: ART's parquet format 1 (written by ART 0.5.18) keeps no logprobs, so its "
            "trajectories are for analysis and re-scoring; ART trains only Choice objects "
            "with logprobs (or plain assistant messages with "
            "allow_training_without_logprobs=True)",
            highlight=False,
        )
    elif summary.untrainable_rollouts:
        err_console.print(
            f"note: {summary.untrainable_rollouts} of the {summary.rollouts} rollouts "
            "carry no logprobs (ART trains them only with "
            "allow_training_without_logprobs=True)",
            highlight=False,
        )
    if summary.exchange_rollouts and not has_exchanges():
        err_console.print(
            f"note: {summary.exchange_rollouts} rollouts hold ART's captured exchanges, "
            "which this ART cannot represent: they are stored whole, and their trajectories "
            "are read with openpipe-art >= 0.5.20 (Python >= 3.12)",
            highlight=False,
        )


def _check_readable_input(path: Path) -> None:
    """Refuse an input that cannot be read before the store is opened (or created)."""
    problem = None
    if not path.exists():
        problem = f"no such file or directory: {path}"
    elif not os.access(path, os.R_OK | (os.X_OK if path.is_dir() else 0)):
        problem = f"cannot read {path}: permission denied"
    if problem is not None:
        say_error(problem)
        raise typer.Exit(1)
