"""User SQL is bounded: in bytes (a row, and the rows fetched at a time), and in time (one
deadline for the whole query), on SQLite and PostgreSQL, through `artstore sql` and the
library. Memory is measured for real: the peak resident size of an `artstore sql` process.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest
from recorded_run import record_run

from artstore.analysis import query, stream_query
from artstore.errors import QueryError

# The peak memory `artstore sql` may reach on any query below (it starts near 100 MB).
PEAK_KIB = 500 * 1024
ENDLESS = "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n) SELECT i FROM n"
COUNTING = "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < {rows}) "


@pytest.fixture
async def recorded(store):
    await record_run(store)
    return store


def _run_measured(url: str, *args: str) -> tuple[int, str, int]:
    """(exit code, stderr, peak resident KiB) of `artstore sql --url URL ARGS`, whose
    standard output is read and dropped as it comes."""
    code = (
        "import resource, subprocess, sys; "
        "child = subprocess.Popen(sys.argv[1:], stdout=subprocess.PIPE, stderr=subprocess.PIPE); "
        "[None for _ in child.stdout]; errors = child.stderr.read().decode(); child.wait(); "
        "print(child.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); "
        "print(errors, end='')"
    )
    command = [sys.executable, "-c", "from artstore.cli import main; main()", "sql"]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])}
    done = subprocess.run(
        [sys.executable, "-c", code, *command, "--url", url, *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    first, _, errors = done.stdout.partition("\n")
    returncode, peak = (int(word) for word in first.split())
    return returncode, errors, peak


def _huge_values(dialect: str) -> list[str]:
    """Queries whose one value is 120 MB, made by the database itself."""
    if dialect == "sqlite":
        return [
            "SELECT zeroblob(120000000) AS big",
            "SELECT replace(hex(zeroblob(1000)), '00', printf('%.*c', 120000, 'x')) AS big",
        ]
    return [
        "SELECT repeat('x', 120000000) AS big",
        "SELECT 1 AS small, decode(repeat('00', 60000000), 'hex') AS big",
    ]


def test_a_huge_value_is_refused_in_one_line_and_memory_stays_bounded(database_url):
    dialect = database_url.split(":", 1)[0]
    for statement in _huge_values(dialect):
        returncode, errors, peak = _run_measured(database_url, statement)
        assert returncode == 1, errors
        assert errors.count("\n") == 1 and "MiB" in errors, errors
        assert "Traceback" not in errors
        assert peak < PEAK_KIB, (statement, peak)
    if dialect == "sqlite":
        # SQLite's printf gives an empty text rather than one past its length limit: it
        # makes nothing big either.
        returncode, errors, peak = _run_measured(
            database_url, "SELECT printf('%.*c', 120000000, 'x') AS big"
        )
        assert returncode == 0 and peak < PEAK_KIB, (errors, peak)


def test_many_large_rows_stop_at_the_batch_bound_with_bounded_memory(database_url):
    """200 rows of 1 MB each: more than a batch may hold; the rows before the bound are
    printed, then one line says why the query stopped."""
    dialect = database_url.split(":", 1)[0]
    megabyte = "printf('%.*c', 1000000, 'x')" if dialect == "sqlite" else "repeat('x', 1000000)"
    statement = COUNTING.format(rows=200) + f"SELECT i, {megabyte} AS payload FROM n"
    returncode, errors, peak = _run_measured(database_url, "--format", "csv", statement)
    assert returncode == 1, errors
    assert errors.count("\n") == 1 and "MiB" in errors, errors
    assert peak < PEAK_KIB, peak


async def test_a_bounded_result_comes_whole_in_order_with_its_names(recorded):
    rows = 5000
    counted = await query(
        recorded,
        COUNTING.format(rows=rows) + "SELECT i, 'row ' || i AS label FROM n ORDER BY i DESC",
    )
    assert counted.columns == ["i", "label"]
    assert counted.rows == [(i, f"row {i}") for i in range(rows, 0, -1)]
    named = await query(recorded, "SELECT 1 AS a, 2 AS b, NULL AS c FROM v_runs")
    assert (named.columns, named.rows) == (["a", "b", "c"], [(1, 2, None)])
    assert (await query(recorded, "EXPLAIN SELECT * FROM v_rollouts ORDER BY reward")).rows


async def test_one_deadline_bounds_the_whole_query(recorded):
    """A query that hands over rows all the time is stopped at its deadline all the same
    (a limit per batch of rows would let it run for ever)."""

    async def read_everything() -> int:
        count = 0
        async with stream_query(recorded, ENDLESS, timeout=2) as rows:
            async for _ in rows:
                count += 1
        return count

    with pytest.raises(QueryError, match="time limit"):
        await asyncio.wait_for(read_everything(), timeout=300)
    # The store answers the next query at once.
    assert (await query(recorded, "SELECT count(*) FROM v_runs")).rows == [(1,)]
