"""Printing rows the same way in every command: `--format table|csv|json`, and progress bars.

Tables are rich tables on stdout; csv and json are written raw to stdout (no wrapping,
no colour), so that they can be piped. Progress bars go to stderr and only when it is a
terminal, so that piped output stays clean.
"""

from __future__ import annotations

import csv
import json
import math
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from enum import StrEnum
from typing import Annotated, Any

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from artstore.cli.shared import console, err_console

Row = dict[str, Any]


class OutputFormat(StrEnum):
    table = "table"
    csv = "csv"
    json = "json"


FormatOption = Annotated[
    OutputFormat,
    typer.Option(
        "--format",
        case_sensitive=False,
        help="How to print rows: table (for people), csv or json (for programs).",
    ),
]


def text(value: Any) -> str:
    """A cell for people: numbers rounded, lists joined, dicts as key=value, None empty."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if math.isnan(value) or math.isinf(value):
            return str(value)
        return f"{value:.4g}"
    if isinstance(value, dict):
        return ", ".join(f"{k}={text(v)}" for k, v in value.items())
    if isinstance(value, (list, tuple)):
        if value and all(isinstance(v, float) for v in value):  # rewards, advantages
            return " ".join(f"{v:.3g}" for v in value)
        return ", ".join(text(v) for v in value)
    return str(value)


def _csv_cell(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, (dict, list, tuple)):
        return json.dumps(value, default=str)
    return value


def _columns(rows: Sequence[Row], columns: Sequence[str] | None) -> list[str]:
    if columns is not None:
        return list(columns)
    found: dict[str, None] = {}
    for row in rows:
        found.update(dict.fromkeys(row))
    return list(found)


def write_json(value: Any) -> None:
    sys.stdout.write(json.dumps(value, indent=2, default=str) + "\n")
    sys.stdout.flush()


def write_csv(rows: Sequence[Row], columns: Sequence[str] | None = None) -> None:
    names = _columns(rows, columns)
    writer = csv.writer(sys.stdout, lineterminator="\n")
    writer.writerow(names)
    for row in rows:
        writer.writerow([_csv_cell(row.get(name)) for name in names])
    sys.stdout.flush()


def table(
    rows: Sequence[Row],
    columns: Sequence[str] | None = None,
    *,
    title: str | None = None,
    headers: dict[str, str] | None = None,
    cells: dict[str, Any] | None = None,
) -> Table:
    """A rich table of `rows`; `headers` renames columns, `cells` formats some of them."""
    names = _columns(rows, columns)
    result = Table(title=title, title_justify="left", show_lines=False)
    for name in names:
        numeric = any(isinstance(row.get(name), (int, float)) for row in rows)
        result.add_column(
            (headers or {}).get(name, name.replace("_", " ")),
            justify="right" if numeric else "left",
            overflow="fold",
        )
    for row in rows:
        formatters = cells or {}
        # Text, not markup: "[...]" in a value (an error message) prints as it is.
        result.add_row(
            *(
                Text(formatters[name](row.get(name)) if name in formatters else text(row.get(name)))
                for name in names
            )
        )
    return result


def print_rows(
    rows: Sequence[Row],
    format: OutputFormat,
    *,
    columns: Sequence[str] | None = None,
    title: str | None = None,
    empty: str = "nothing to show",
    headers: dict[str, str] | None = None,
    cells: dict[str, Any] | None = None,
) -> None:
    """Print `rows` as a table (only `columns`), or every field as csv / json."""
    if format is OutputFormat.json:
        write_json(list(rows))
    elif format is OutputFormat.csv:
        write_csv(rows, columns)
    elif not rows:
        if title:
            console.print(f"[bold]{title}[/]: {empty}", highlight=False)
        else:
            console.print(empty, highlight=False)
    else:
        console.print(table(rows, columns, title=title, headers=headers, cells=cells))


@contextmanager
def progress(description: str, total: int | None = None) -> Iterator[Any]:
    """A rich progress bar on stderr (only on a terminal); yields `advance(n=1)`."""
    bar = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err_console,
        disable=not err_console.is_terminal,
        transient=False,
    )
    with bar:
        task = bar.add_task(description, total=total)

        class Advance:
            def __call__(self, n: int = 1) -> None:
                bar.advance(task, n)

            def total(self, value: int) -> None:
                bar.update(task, total=value)

        yield Advance()
