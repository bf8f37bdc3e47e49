"""`artstore sql`: one read-only SQL query, its rows printed as they come (table, CSV, JSON)."""

from __future__ import annotations

import csv
import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Annotated, Any

import typer

from artstore.cli.output import FormatOption, OutputFormat, print_table
from artstore.cli.shared import UrlOption, UsageError, fail, read_text_file, run

QueryArgument = Annotated[
    str | None,
    typer.Argument(
        metavar="QUERY",
        help='The query, e.g. "SELECT * FROM v_runs" (or use --file).',
        show_default=False,
    ),
]
FileOption = Annotated[
    Path | None,
    typer.Option("--file", "-f", help="Read the query from this file ('-': standard input)."),
]
TimeoutOption = Annotated[
    float,
    typer.Option(
        "--timeout",
        min=0,
        help="Stop the query this many seconds after it starts, rows printed or not (0: no limit).",
    ),
]
ArchivedOption = Annotated[
    str | None,
    typer.Option(
        "--archived",
        metavar="DIR|URL",
        help="Query the runs archived there (artstore archive --to), not the database.",
        show_default=False,
    ),
]
# Rows per table printed at a time: a table needs its rows to size its columns.
TABLE_PAGE = 500


def sql(
    statement: QueryArgument = None,
    file: FileOption = None,
    output: FormatOption = OutputFormat.table,
    timeout: TimeoutOption = 30.0,
    archived: ArchivedOption = None,
    url: UrlOption = None,
) -> None:
    """Run one read-only SQL query over the views and print its rows.

    Query the v_* views (docs/views.md): the same on SQLite and PostgreSQL.
    Anything that writes is refused; rows are printed as the database sends them, at
    most 16 MiB a row and 64 MiB in 1,000 rows. With --archived, the same views over the
    runs archived there (restored into a temporary SQLite file for the query).
    """
    if statement is not None and file is not None:
        raise fail("give the query as an argument or with --file, not both")
    if statement is None and file is None:
        raise fail('give a query: artstore sql "SELECT * FROM v_runs" (or --file q.sql)')
    if file is not None:
        try:
            statement = read_text_file(file)
        except UsageError as exc:
            raise fail(str(exc)) from None
    assert statement is not None

    async def work() -> None:
        import artstore
        from artstore.analysis.sql import read_only_statement
        from artstore.urls import resolve_url

        if archived is not None:
            from artstore.archive.querying import archived_store

            read_only_statement(statement, "sqlite")
            async with archived_store(archived) as store:
                await _print_rows(store, statement, output, timeout)
            return
        # Refused before anything is opened.
        read_only_statement(statement, resolve_url(url, create_folder=False).get_backend_name())
        async with await artstore.open_store(url, read_only=True) as store:
            await _print_rows(store, statement, output, timeout)

    run(work)


Batches = AsyncIterator[list[tuple[Any, ...]]]


async def _print_rows(store: Any, statement: str, output: OutputFormat, timeout: float) -> None:
    from artstore.analysis import stream_query

    async with stream_query(store, statement, timeout=timeout or None) as rows:
        if output is OutputFormat.csv:
            await _print_csv(rows.columns, rows.batches())
        elif output is OutputFormat.json:
            await _print_json(rows.columns, rows.batches())
        else:
            await _print_table(rows.columns, rows.batches())


async def _print_csv(columns: list[str], batches: Batches) -> None:
    writer = csv.writer(sys.stdout, lineterminator="\n")
    writer.writerow(columns)
    async for batch in batches:
        writer.writerows(["" if value is None else value for value in row] for row in batch)
    sys.stdout.flush()


async def _print_json(columns: list[str], batches: Batches) -> None:
    """A list of objects, one per row. The views' JSON columns (`config`, `metrics`,
    `tool_calls`...) are JSON values, not strings (as csv and tables show their text)."""
    from artstore.schema.views import json_column_names

    holds_json = json_column_names()
    sys.stdout.write("[")
    first = True
    async for batch in batches:
        for row in batch:
            record = {
                name: _json_value(value) if name in holds_json else value
                for name, value in zip(columns, row, strict=True)
            }
            text = json.dumps(record, ensure_ascii=False, indent=2)
            sys.stdout.write(("\n  " if first else ",\n  ") + text.replace("\n", "\n  "))
            first = False
    sys.stdout.write("]\n" if first else "\n]\n")
    sys.stdout.flush()


def _json_value(value: Any) -> Any:
    """The JSON a column's text holds; text that is not JSON stays as it is."""
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except ValueError:
        return value


async def _print_table(columns: list[str], batches: Batches) -> None:
    """Pages of rows, each a table with the widths of the widest values so far; on a
    terminal too narrow for them, every row as a record (`column  value` lines, as psql's
    expanded display) instead, so that no value is split. The row count goes to stderr."""
    from rich.table import Table

    from artstore.cli.output import print_records
    from artstore.cli.shared import console, err_console

    count, widths = 0, [len(column) for column in columns]
    pending: list[tuple[Any, ...]] = []
    headed = records = False

    def flush() -> None:
        nonlocal widths, headed, records
        cells = [[_cell(value) for value in row] for row in pending]
        for row in cells:
            widths = [max(width, cell.cell_len) for width, cell in zip(widths, row, strict=True)]
        # A table with a rule between columns: " │ " between them.
        if console.is_terminal and sum(widths) + 3 * (len(widths) - 1) > console.width:
            records = True
        if records:
            print_records(cells, columns, start=count - len(pending) + 1)
        elif pending or not headed:
            table = Table(show_edge=False, header_style="bold", show_header=not headed)
            for column, width in zip(columns, widths, strict=True):
                table.add_column(column, no_wrap=True, min_width=width)
            for row in cells:
                # Text, not markup: a value such as "[bold]" or a JSON list prints as it is.
                table.add_row(*row)
            print_table(table)
            headed = True
        pending.clear()

    try:
        async for batch in batches:
            for row in batch:
                pending.append(row)
                count += 1
                if len(pending) >= TABLE_PAGE:
                    flush()
    finally:  # a query stopped on the way (its bounds) shows the rows before, then why
        flush()
    err_console.print(f"{count} row{'s' if count != 1 else ''}", highlight=False)


def _cell(value: Any):
    from rich.text import Text

    if value is None:
        return Text("NULL", style="dim")
    if isinstance(value, float):  # 0.6, not 0.6000000000000001 (csv and json stay exact)
        text = format(value, ".10g")
        return Text(text if any(c in text for c in ".eni") else f"{text}.0")
    return Text(str(value))
