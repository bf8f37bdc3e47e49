"""`artstore archive RUN --to DIR` and `artstore restore RUN --from DIR`."""

from __future__ import annotations

from dataclasses import asdict
from typing import Annotated

import typer

from artstore.cli.output import FormatOption, OutputFormat, write_json
from artstore.cli.shared import UrlOption, console, run

RunArgument = Annotated[str, typer.Argument(metavar="RUN", help="The run's name.")]


def archive(
    run_name: RunArgument,
    to: Annotated[
        str,
        typer.Option(
            "--to",
            metavar="DIR|URL",
            help="A directory, or an fsspec URL such as s3://bucket/prefix.",
            show_default=False,
        ),
    ],
    url: UrlOption = None,
    output: FormatOption = OutputFormat.table,
) -> None:
    """Move a run out of the database into an archive: the one deletion artstore makes.

    The run's events and blobs are written as zstd parquet with a manifest and
    checksums, read back and checked, and only then removed from the database in one
    transaction, which records run.archived. A run still running is refused.
    """

    async def work():
        import artstore
        from artstore.archive import archive_run

        async with await artstore.open_store(url, create=False) as store:
            return await archive_run(store, run_name, to)

    summary = run(work)
    if output is OutputFormat.table:
        console.print(
            f"archived run {summary.run} to {summary.location}: {summary.num_events} events, "
            f"{summary.num_blobs} blobs ({summary.blobs_removed} removed from the database)",
            highlight=False,
            soft_wrap=True,
        )
    else:
        write_json(asdict(summary))


def restore(
    run_name: RunArgument,
    source: Annotated[
        str,
        typer.Option(
            "--from",
            metavar="DIR|URL",
            help="Where the run was archived to (its --to).",
            show_default=False,
        ),
    ],
    url: UrlOption = None,
    output: FormatOption = OutputFormat.table,
) -> None:
    """Bring an archived run back into the database.

    The archive is read and checked against its manifest; the events come back as they
    were stored (ids, streams, versions, payloads byte for byte, times) at new positions,
    projected as a rebuild would, in one transaction that records run.restored.
    """

    async def work():
        import artstore
        from artstore.archive import restore_run

        async with await artstore.open_store(url, create=False) as store:
            return await restore_run(store, run_name, source)

    summary = run(work)
    if output is OutputFormat.table:
        console.print(
            f"restored run {summary.run} from {summary.location}: {summary.num_events} events, "
            f"{summary.num_blobs} blobs",
            highlight=False,
            soft_wrap=True,
        )
    else:
        write_json(asdict(summary))
