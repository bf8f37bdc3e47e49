"""A user query's result, bounded in bytes by the database that runs it.

A query can make rows of any size: one value of 500 MB (`repeat('x', 5e8)`), or rows
of a megabyte each, a thousand of which a fetch hands over at once. Checking the rows
once they have arrived is too late: they are in memory already. So the query runs
wrapped in one that measures each row as the database makes it and, past the bounds,
sends that row empty with a flag (the last column) instead of its values:

    WITH artstore_result(c1, c2) AS (
    <the query>
    )
    SELECT CASE WHEN artstore_over THEN NULL ELSE c1 END, ..., artstore_over
    FROM (SELECT *, artstore_row_bytes > <row bound>
                    OR sum(artstore_row_bytes) OVER (ROWS <batch - 1> PRECEDING) > <batch bound>
          FROM (SELECT *, <size of c1> + <size of c2> AS artstore_row_bytes FROM ...))

so that any `batch_rows` consecutive rows (what one fetch takes) hold at most
`batch_bytes`, and one row at most `row_bytes`. Rows come in the query's order
(a window without ORDER BY keeps it, and streams). The query is the body of a CTE, so
the database's own grammar refuses anything but a query there.

EXPLAIN cannot be a CTE's body; its rows are the plan, as long as the query's text at
most, and it runs as it is. Which statement is an EXPLAIN is told as the database's own
lexer would (`first_word`): comments as it ends them, so that no query hides behind one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from artstore.eventstore.database import USER_QUERY_ROW_BYTES, ResultColumn, SQLSyntax

MiB = 2**20


@dataclass(frozen=True)
class Bounds:
    """How much of a result a query may hand over (see the module's docstring)."""

    batch_rows: int = 1000
    batch_bytes: int = 64 * MiB
    row_bytes: int = USER_QUERY_ROW_BYTES

    def describe(self) -> str:
        return (
            f"at most {self.row_bytes // MiB} MiB a row and {self.batch_bytes // MiB} MiB "
            f"in {self.batch_rows} consecutive rows"
        )


def bounded_statement(statement: str, columns: list[ResultColumn], bounds: Bounds) -> str | None:
    """`statement` wrapped to flag its rows past `bounds` (see above); None when its rows
    need no measuring (every column a few bytes at most)."""
    sized = [
        column.size.format(column=f"c{index}")
        for index, column in enumerate(columns, start=1)
        if column.size is not None
    ]
    if not sized:
        return None
    names = [f"c{index}" for index in range(1, len(columns) + 1)]
    shown = ", ".join(f"CASE WHEN artstore_over THEN NULL ELSE {name} END" for name in names)
    # The newlines: a `--` comment at the query's end stops at its own line.
    return (
        f"WITH artstore_result({', '.join(names)}) AS (\n{statement}\n)\n"
        f"SELECT {shown}, artstore_over FROM ("
        f"SELECT artstore_sized.*, (artstore_row_bytes > {bounds.row_bytes} OR "
        f"sum(artstore_row_bytes) OVER (ROWS BETWEEN {bounds.batch_rows - 1} PRECEDING "
        f"AND CURRENT ROW) > {bounds.batch_bytes}) AS artstore_over FROM ("
        f"SELECT artstore_result.*, {' + '.join(sized)} AS artstore_row_bytes "
        "FROM artstore_result) AS artstore_sized) AS artstore_checked"
    )


# A word as both databases read one: any character past ASCII belongs to it too.
_WORD = re.compile(r"[A-Za-z_\x80-\U0010ffff][A-Za-z0-9_$\x80-\U0010ffff]*")


def first_word(statement: str, syntax: SQLSyntax) -> str:
    """The first word of `statement` as the database reads it, upper-cased ("" if none):
    past the blanks and comments it skips (`syntax`; an unclosed comment runs to the end)."""
    at = 0
    while at < len(statement):
        if statement[at] in syntax.blanks:
            at += 1
        elif statement.startswith("--", at):
            ends = [statement.find(end, at) for end in syntax.line_ends]
            at = min((end for end in ends if end >= 0), default=len(statement))
        elif statement.startswith("/*", at):
            at = _comment_end(statement, at, nested=syntax.nested_comments)
        else:
            word = _WORD.match(statement, at)
            return word.group(0).upper() if word else ""
    return ""


def _comment_end(statement: str, at: int, *, nested: bool) -> int:
    depth, at = 1, at + 2
    while at < len(statement) and depth:
        if statement.startswith("*/", at):
            depth, at = depth - 1, at + 2
        elif nested and statement.startswith("/*", at):
            depth, at = depth + 1, at + 2
        else:
            at += 1
    return at if not depth else len(statement)
