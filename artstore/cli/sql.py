"""`artstore sql`: one read-only SQL statement, printed as a table, CSV or JSON."""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from artstore.cli.output import FormatOption, OutputFormat
from artstore.cli.shared import UrlOption, console, fail, run

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


def sql(
    statement: QueryArgument = None,
    file: FileOption = None,
    output: FormatOption = OutputFormat.table,
    url: UrlOption = None,
) -> None:
    """Run one read-only SQL query and print its rows.

    Query the v_* views (README.md, "SQL views"): the same on SQLite and PostgreSQL.
    Anything that writes is refused.
    """
    if statement is not None and file is not None:
        raise fail("give the query as an argument or with --file, not both")
    if statement is None and file is None:
        raise fail('give a query: artstore sql "SELECT * FROM v_runs" (or --file q.sql)')
    if file is not None:
        try:
            statement = sys.stdin.read() if str(file) == "-" else file.read_text()
        except OSError as exc:
            raise fail(f"cannot read {file}: {exc.strerror or exc}") from None
    assert statement is not None

    async def work() -> tuple[list[str], list[tuple[Any, ...]]]:
        import artstore
        from artstore.analysis import query
        from artstore.analysis.sql import read_only_statement
        from artstore.errors import NotFoundError
        from artstore.urls import resolve_url

        database_url = resolve_url(url)
        if database_url.get_backend_name() == "sqlite":
            read_only_statement(statement, "sqlite")  # refuse before touching anything
            if not Path(database_url.database or "").exists():
                raise NotFoundError(f"no artstore database at {database_url.database}")
        # A read does not migrate: an older schema asks for `artstore db upgrade`.
        async with await artstore.open_store(url, migrate_schema=False) as store:
            return await query(store, statement)

    columns, rows = run(work)
    if output is OutputFormat.csv:
        _print_csv(columns, rows)
    elif output is OutputFormat.json:
        _print_json(columns, rows)
    else:
        _print_table(columns, rows)


def _print_csv(columns: list[str], rows: list[tuple[Any, ...]]) -> None:
    writer = csv.writer(sys.stdout, lineterminator="\n")
    writer.writerow(columns)
    writer.writerows(["" if value is None else value for value in row] for row in rows)
    sys.stdout.flush()


def _print_json(columns: list[str], rows: list[tuple[Any, ...]]) -> None:
    """A list of objects, one per row (JSON columns stay JSON text, as in the database)."""
    records = [dict(zip(columns, row, strict=True)) for row in rows]
    sys.stdout.write(json.dumps(records, indent=2, ensure_ascii=False) + "\n")
    sys.stdout.flush()


def _print_table(columns: list[str], rows: list[tuple[Any, ...]]) -> None:
    from rich.table import Table

    table = Table(show_edge=False, header_style="bold", caption_justify="left")
    for column in columns:
        table.add_column(column, overflow="fold")
    for row in rows:
        # Text, not markup: a value such as "[bold]" or a JSON list prints as it is.
        table.add_row(*(_cell(value) for value in row))
    table.caption = f"{len(rows)} row{'s' if len(rows) != 1 else ''}"
    console.print(table)


def _cell(value: Any):
    from rich.text import Text

    if value is None:
        return Text("NULL", style="dim")
    if isinstance(value, float):  # 0.6, not 0.6000000000000001 (csv and json stay exact)
        text = format(value, ".10g")
        return Text(text if any(c in text for c in ".eni") else f"{text}.0")
    return Text(str(value))
