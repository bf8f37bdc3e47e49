"""Printing rows the same way in every command: `--format table|csv|json`, and progress bars.

Tables are rich tables on stdout, fitted to the terminal's width: short headers that never
break inside a word, numbers and ids on one line, long texts wrapped or cut with an
ellipsis. When stdout is not a terminal (piped, redirected) a table is plain columns
instead: no borders, no colour, nothing wrapped or cut, one line per row. csv and json are
written raw, so that they can be piped; JSON columns are JSON. Progress bars go to stderr
and only when it is a terminal, so that piped output stays clean.
"""

from __future__ import annotations

import csv
import io
import json
import math
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from enum import StrEnum
from typing import Annotated, Any, NamedTuple

import typer
from rich import box
from rich.console import Console
from rich.measure import Measurement
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
        metavar="FORMAT",
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
    if isinstance(value, dict):  # a value that is itself a dict or a list stays JSON: `a={}`
        return ", ".join(
            f"{k}={json.dumps(v, default=str) if isinstance(v, dict | list) else text(v)}"
            for k, v in value.items()
        )
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


# A text column wraps (on a terminal) when its cells are longer than this.
_WRAP_ABOVE = 24
SPARK_BARS = "▁▂▃▄▅▆▇█"


def sparkline(values: Sequence[float | None]) -> str:
    """One bar per value, from the lowest (▁) to the highest (█); a gap for None."""
    known = [v for v in values if v is not None and math.isfinite(v)]
    if not known:
        return ""
    low, high = min(known), max(known)
    bars = []
    for value in values:
        if value is None or not math.isfinite(value):
            bars.append(" ")
        elif high == low:
            bars.append(SPARK_BARS[3])
        else:
            bars.append(SPARK_BARS[round((value - low) / (high - low) * (len(SPARK_BARS) - 1))])
    return "".join(bars)


def table(
    rows: Sequence[Row],
    columns: Sequence[str] | None = None,
    *,
    title: str | None = None,
    headers: dict[str, str] | None = None,
    cells: dict[str, Any] | None = None,
    wide: Sequence[str] = (),
    caption: str | None = None,
) -> Table | None:
    """A rich table of `rows`; `headers` renames columns, `cells` formats some of them.

    On a terminal too narrow for it, the table gives up width in this order: the `wide`
    columns (free text, cut with an ellipsis), then long texts (wrapped between words),
    then headers (wrapped between words). Numbers, ids, names, statuses and times are never
    cut nor wrapped. None when even that does not fit: print the rows as records instead.
    """
    names = _columns(rows, columns)
    plain = not console.is_terminal
    result = Table(
        title=title,
        title_justify="left",
        caption=caption,
        caption_justify="left",
        box=None if plain else box.SIMPLE_HEAD,
        show_edge=False,
        pad_edge=False,
        collapse_padding=not plain,  # a rule under the headers, two spaces between columns
        header_style="" if plain else "bold",
    )
    shown = _shown(rows, names, cells)
    titles = _titles(names, headers)
    specs = []
    for index, name in enumerate(names):
        numeric = any(
            isinstance(row.get(name), int | float) and not isinstance(row.get(name), bool)
            for row in rows
        )
        longest = max((len(line) for r in shown for line in r[index].splitlines()), default=0)
        # Free text has spaces between words; a value without any (an id, a name, a status)
        # or a short one (a time, "8/8") is kept whole.
        spaced = any(" " in r[index] for r in shown)
        fixed = numeric or longest <= _WRAP_ABOVE or not spaced
        kind = "wide" if name in wide and not fixed else "short" if fixed else "text"
        specs.append(_ColumnFit(titles[index], longest, kind, numeric))
    if plain:
        widths: list[int | None] = [None] * len(names)
    else:
        fitted = _fit(specs, console.width)
        if fitted is None:
            return None
        widths = fitted
    for spec, width in zip(specs, widths, strict=True):
        result.add_column(
            spec.header,
            justify="right" if spec.numeric else "left",
            no_wrap=spec.kind == "short",
            overflow="fold" if spec.kind == "text" else "ellipsis",
            width=width,
            min_width=spec.least if spec.kind == "short" else None,
        )
    for values in shown:
        # Text, not markup: "[...]" in a value (an error message) prints as it is.
        result.add_row(
            *(
                Text(value, no_wrap=True, overflow="ellipsis")
                if spec.kind == "wide" and not plain
                else Text(value)
                for spec, value in zip(specs, values, strict=True)
            )
        )
    return result


def _shown(rows: Sequence[Row], names: list[str], cells: dict[str, Any] | None) -> list[list[str]]:
    formatters = cells or {}
    return [
        [
            formatters[name](row.get(name)) if name in formatters else text(row.get(name))
            for name in names
        ]
        for row in rows
    ]


def _titles(names: list[str], headers: dict[str, str] | None) -> list[str]:
    return [(headers or {}).get(name, name.replace("_", " ")) for name in names]


def print_records(
    rows: Sequence[Sequence[str | Text]],
    titles: Sequence[str],
    *,
    title: str | None = None,
    start: int = 1,
) -> None:
    """Rows as records, one `column  value` line per column (psql's expanded display), for
    a terminal too narrow for the table: every value whole, long ones wrapped."""
    from rich.table import Table as Grid

    if title:
        console.print(f"[bold]{title}[/]", highlight=False)
    for number, values in enumerate(rows, start):
        console.print(f"[dim]-[ record {number} ]-[/]", highlight=False)
        grid = Grid.grid(padding=(0, 2))
        grid.add_column(style="bold", no_wrap=True)
        grid.add_column(overflow="fold")
        for name, value in zip(titles, values, strict=True):
            grid.add_row(name, value if isinstance(value, Text) else Text(value))
        console.print(grid)


class _ColumnFit(NamedTuple):
    header: str
    longest: int  # the longest line of its cells
    kind: str  # "wide" (cut first), "text" (wraps), "short" (never cut; its header may wrap)
    numeric: bool

    @property
    def natural(self) -> int:
        return max(len(self.header), self.longest, 1)

    @property
    def least(self) -> int:
        word = max((len(w) for w in self.header.split()), default=1)
        if self.kind == "wide":
            return min(self.natural, max(word, 8))
        if self.kind == "text":
            return min(self.natural, max(word, 12))
        return max(word, self.longest, 1)


def _fit(specs: list[_ColumnFit], terminal_width: int) -> list[int | None] | None:
    """Column widths for a terminal of `terminal_width` (None: the column's own width), or
    None when the table cannot fit without cutting a value that must stay whole."""
    widths = [spec.natural for spec in specs]
    gaps = 2 * (len(specs) - 1)
    if sum(spec.least for spec in specs) + gaps > terminal_width:
        return None
    excess = sum(widths) + gaps - terminal_width
    for kind in ("wide", "text", "short"):
        if excess <= 0:
            break
        shrinkable = {
            i: widths[i] - spec.least for i, spec in enumerate(specs) if spec.kind == kind
        }
        room = sum(shrinkable.values())
        if room <= 0:
            continue
        take = min(excess, room)
        for i, slack in sorted(shrinkable.items(), key=lambda item: -item[1]):
            cut = min(slack, -(-take * slack // room), excess)
            widths[i] -= cut
            excess -= cut
    return [
        None if width == spec.natural else width for width, spec in zip(widths, specs, strict=True)
    ]


def print_table(table: Table) -> None:
    """Print a table: fitted to the terminal, or as plain columns when stdout is not one.

    Piped, only the rows go to stdout: a caption (a legend, a count) goes to stderr, so
    that `| wc -l` counts rows and `| cut` sees only columns.
    """
    if console.is_terminal:
        console.print(table)
        return
    caption, table.caption = table.caption, None
    # Plain columns: each row on one line, as wide as it needs (no terminal to fit).
    table.box = None
    table.show_edge = False
    table.pad_edge = False
    table.header_style = ""
    for column in table.columns:
        column.no_wrap = True
    width = Measurement.get(console, console.options.update_width(1_000_000), table).maximum
    # Rendered as wide as the table (the shared console is as wide as the terminal it
    # lacks), without the spaces that pad the last column.
    rendered = io.StringIO()
    Console(file=rendered, width=max(width, 1), color_system=None, highlight=False).print(table)
    lines = rendered.getvalue().splitlines()
    sys.stdout.write("".join(line.rstrip() + "\n" for line in lines))
    sys.stdout.flush()
    if caption:
        err_console.print(caption, highlight=False, markup=False, soft_wrap=True)


def print_rows(
    rows: Sequence[Row],
    format: OutputFormat,
    *,
    columns: Sequence[str] | None = None,
    title: str | None = None,
    empty: str = "nothing to show",
    headers: dict[str, str] | None = None,
    cells: dict[str, Any] | None = None,
    wide: Sequence[str] = (),
    caption: str | None = None,
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
        fitted = table(
            rows, columns, title=title, headers=headers, cells=cells, wide=wide, caption=caption
        )
        if fitted is not None:
            print_table(fitted)
            return
        names = _columns(rows, columns)
        print_records(_shown(rows, names, cells), _titles(names, headers), title=title)
        if caption:
            console.print(f"\n{caption}", highlight=False, markup=False)


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


def counted(n: int, noun: str, plural: str | None = None) -> str:
    """`1 group`, `2 groups` (`plural` where adding an s is wrong)."""
    return f"{n} {noun}" if n == 1 else f"{n} {plural or noun + 's'}"
