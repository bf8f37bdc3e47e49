"""`artstore sql`, the read-only query runner, and tools/queries (issue 5).

Every test runs on SQLite and on PostgreSQL, on the run of tests/support/recorded_run.py.
"""

from __future__ import annotations

import asyncio
import csv
import io
import json
from datetime import UTC, datetime
from pathlib import Path

import pytest
from recorded_run import MODEL, RUN, record_run
from sqlalchemy import text
from typer.testing import CliRunner

import artstore
from artstore.analysis import query
from artstore.analysis.sql import read_only_statement, run_read_only
from artstore.cli import app
from artstore.errors import QueryError, QueryRefusedError
from artstore.events import LLMCall

QUERIES = Path(__file__).parents[2] / "tools" / "queries"
approx = pytest.approx


@pytest.fixture
async def recorded(store):
    await record_run(store)
    return store


def artstore_sql(url: str, *args: str, input: str | None = None):
    return CliRunner().invoke(app, ["sql", "--url", url, *args], input=input)


def one_line(text: str) -> str:
    return " ".join(text.split())  # rich wraps long lines on a narrow terminal


def counts(url: str) -> tuple[int, ...]:
    """How many events, rewards, runs and views the database holds (read as its owner)."""

    async def count() -> tuple[int, ...]:
        async with await artstore.open_store(url) as store:
            async with store.database.read() as connection:
                found = []
                for table in ("events", "rewards", "runs", "v_runs"):
                    result = await connection.execute(text(f"SELECT count(*) FROM {table}"))
                    found.append(result.scalar())
            return tuple(found)

    return asyncio.run(count())


# --- output -------------------------------------------------------------------------------


def test_prints_a_table(recorded_url):
    result = artstore_sql(
        recorded_url,
        "SELECT group_id, scorer, reward_std, consumed_by "
        "FROM v_groups WHERE scorer = 'correct' ORDER BY group_id",
    )
    assert result.exit_code == 0, result.output
    # Piped: plain columns, no borders, one line per row.
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["group_id", "scorer", "reward_std", "consumed_by"]
    assert [line.split() for line in lines[1:4]] == [
        ["g0", "correct", "0.375", MODEL],
        ["g1", "correct", "0.0", MODEL],
        ["g2", "correct", "0.0", "NULL"],
    ]
    # The count goes to stderr: `| wc -l` counts the header and the rows.
    assert len(lines) == 4
    assert result.stderr.strip() == "3 rows"


def test_prints_csv(recorded_url):
    result = artstore_sql(
        recorded_url,
        "--format",
        "csv",
        "SELECT rollout_id, policy_step, reward, tool_names FROM v_rollouts "
        "JOIN (SELECT rollout_id AS r, max(tool_names) AS tool_names FROM v_llm_calls "
        "GROUP BY rollout_id) AS t ON t.r = rollout_id "
        "WHERE group_id = 'g0' ORDER BY rollout_id",
    )
    assert result.exit_code == 0, result.output
    assert list(csv.reader(io.StringIO(result.stdout))) == [
        ["rollout_id", "policy_step", "reward", "tool_names"],
        ["r0a", "0", "1.0", "search, calculator"],
        ["r0b", "0", "0.25", "calculator"],
        ["r0v", "", "0.5", ""],
    ]


def test_a_query_may_begin_with_a_comment(recorded_url):
    # As the README's SQL blocks do: `artstore sql "-- ...` must not be taken for an option.
    result = artstore_sql(
        recorded_url,
        "--format",
        "csv",
        "-- the groups of g0\nSELECT group_id FROM v_groups WHERE group_id = 'g0' LIMIT 1",
    )
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == ["group_id", "g0"]


def test_prints_json(recorded_url):
    result = artstore_sql(
        recorded_url,
        "--format",
        "json",
        "SELECT c.rollout_id, c.policy_step, r.reward, c.has_logprobs, c.tool_calls "
        "FROM v_llm_calls AS c JOIN v_rollouts AS r ON r.rollout_id = c.rollout_id "
        "WHERE c.rollout_id IN ('r0b', 'r0v') ORDER BY c.rollout_id",
    )
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == [
        {
            "rollout_id": "r0b",
            "policy_step": 0,
            "reward": 0.25,
            "has_logprobs": 1,
            # a JSON column of the views is JSON, the same on both databases
            "tool_calls": [{"args": {"expr": "2*2"}, "name": "calculator"}],
        },
        {
            "rollout_id": "r0v",
            "policy_step": None,
            "reward": 0.5,
            "has_logprobs": 0,
            "tool_calls": None,
        },
    ]


def test_reads_the_query_from_a_file_or_standard_input(recorded_url, tmp_path):
    text = "-- how many rollouts failed?\nSELECT count(*) AS failed\nFROM v_rollouts\n"
    text += "WHERE status = 'failed';\n"
    (tmp_path / "q.sql").write_text(text)
    from_file = artstore_sql(recorded_url, "--file", str(tmp_path / "q.sql"), "--format", "csv")
    assert (from_file.exit_code, from_file.stdout) == (0, "failed\n1\n")
    from_stdin = artstore_sql(recorded_url, "-f", "-", "--format", "csv", input=text)
    assert (from_stdin.exit_code, from_stdin.stdout) == (0, "failed\n1\n")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((), "give a query"),
        (("SELECT 1", "--file", "q.sql"), "not both"),
        (("--file", "no-such-file.sql"), "cannot read no-such-file.sql"),
        (("SELECT 1", "--format", "xml"), "'xml' is not one of 'table', 'csv', 'json'"),
    ],
)
def test_usage_errors_exit_with_2(args, message, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = artstore_sql(f"sqlite:///{tmp_path / 'never.db'}", *args)
    assert result.exit_code == 2
    assert message in one_line(result.stderr)


def test_a_missing_sqlite_file_is_not_created(tmp_path):
    path = tmp_path / "missing.db"
    result = artstore_sql(f"sqlite:///{path}", "SELECT 1")
    assert result.exit_code == 1
    assert one_line(result.stderr) == f"error: no artstore database at {path}"
    assert not path.exists()


def test_a_query_error_is_one_line_and_exit_1(recorded_url):
    result = artstore_sql(recorded_url, "SELECT no_such_column FROM v_runs")
    assert result.exit_code == 1
    assert one_line(result.stderr).startswith("error: the query failed:")
    assert "no_such_column" in result.stderr
    assert "Traceback" not in result.output


SYNTAX_ERRORS = [
    ("SELEC 1", "unexpected '1' after 'SELEC' (line 1, column 7)"),
    ("SELECT * FRM v_runs", "unexpected 'v_runs' after 'FRM' (line 1, column 14)"),
    ("SELECT run FROM v_runs WHERE", "WHERE is not complete (line 1, column 24)"),
    ("SELECT run FROM v_runs\nLIMIT", "LIMIT is not complete (line 2, column 1)"),
    ("SELECT (1", "expected ) near '1' (line 1, column 9)"),
    ("SELECT 'abc", "a quote or a comment is not closed (or a character is not SQL)"),
]


@pytest.mark.parametrize(("statement", "said"), SYNTAX_ERRORS)
def test_a_query_that_does_not_parse_is_one_clear_line(recorded_url, statement, said):
    result = artstore_sql(recorded_url, statement)

    assert result.exit_code == 1, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0] == f"error: refused: the query does not parse: {said}"
    assert "Traceback" not in result.output


# --- refusals -----------------------------------------------------------------------------

WRITES = [
    "INSERT INTO runs (run) VALUES ('x')",
    "UPDATE runs SET status = 'finished'",
    "update runs set status = 'finished'",
    "DELETE FROM rewards",
    "DROP TABLE rewards",
    "DROP VIEW v_runs",
    "TRUNCATE rewards",
    "CREATE TABLE t (a INTEGER)",
    "ALTER TABLE runs ADD COLUMN x INTEGER",
    "SELECT 1; DROP TABLE rewards",
    "SELECT 1; DROP TABLE rewards; --",
    "SELECT 1; -- \nDELETE FROM rewards",
    "SELECT ';'; DELETE FROM rewards",
    "SELECT 1 /* ; */; DELETE FROM rewards -- ;",
    "WITH gone AS (DELETE FROM rewards RETURNING *) SELECT count(*) FROM gone",
    "WITH x AS (SELECT 1) DELETE FROM rewards",
    "PRAGMA query_only = OFF",
    "ATTACH DATABASE 'other.db' AS other",
    "VACUUM",
    "",
    "\n-- nothing but a comment",
    "/* nothing; but comments */ ;",
]


@pytest.mark.parametrize("statement", WRITES)
def test_refuses_whatever_writes_and_changes_nothing(recorded_url, statement, tmp_path):
    before = counts(recorded_url)
    result = artstore_sql(recorded_url, statement)
    assert result.exit_code == 1, result.output
    message = one_line(result.stderr)
    assert message.startswith("error: refused") or "empty" in message, message
    assert "Traceback" not in result.output
    assert counts(recorded_url) == before
    assert not (tmp_path / "other.db").exists()


async def test_the_database_refuses_writes_even_past_the_text_check(recorded):
    """The second guard alone: statements handed straight to the read-only connection."""
    statements = [
        "DELETE FROM rewards",
        "UPDATE runs SET status = 'finished'",
        "INSERT INTO runs (run) VALUES ('x')",
        "DROP TABLE rewards",
        "DROP VIEW v_runs",
        "CREATE TABLE t (a INTEGER)",
        "WITH x AS (SELECT 1) DELETE FROM rewards",
        "SELECT 1; DELETE FROM rewards",
    ]
    if recorded.dialect == "postgresql":
        statements += [
            "WITH gone AS (DELETE FROM rewards RETURNING *) SELECT count(*) FROM gone",
            "SELECT nextval('events_position_seq')",
            "EXPLAIN ANALYZE DELETE FROM rewards",
        ]
    else:
        statements += ["ATTACH DATABASE ':memory:' AS other", "PRAGMA query_only = OFF"]
    before = await query(recorded, "SELECT count(*), sum(reward) FROM v_rewards")
    for statement in statements:
        with pytest.raises(QueryRefusedError, match="refused"):
            await run_read_only(recorded.database, statement)
    after = await query(recorded, "SELECT count(*), sum(reward) FROM v_rewards")
    assert after.rows == before.rows
    assert (await query(recorded, "SELECT count(*) FROM v_runs")).rows == [(1,)]
    # The store itself still writes: the guard lived on a connection of its own.
    await recorded.append("run-other", [artstore.events.RunFinished(run="other")])


@pytest.mark.parametrize(
    ("statement", "rows"),
    [
        ("SELECT 'DROP TABLE x; DELETE' AS s -- DELETE ;\n;", [("DROP TABLE x; DELETE",)]),
        ("  SELECT 1 AS a ;; ", [(1,)]),
        ("VALUES (1, 'a')", [(1, "a")]),
        ("WITH t AS (SELECT 2 AS n) SELECT n * 2 AS n FROM t", [(4,)]),
        ('SELECT 1 AS "update; delete"', [(1,)]),
        ("/* ; DROP TABLE rewards; */ SELECT 3 AS n", [(3,)]),
    ],
)
async def test_runs_what_only_reads(recorded, statement, rows):
    assert (await query(recorded, statement)).rows == rows


async def test_explain_is_a_read(recorded):
    assert (await query(recorded, "EXPLAIN SELECT * FROM v_runs")).rows


async def test_a_query_error_is_a_query_error(recorded):
    with pytest.raises(QueryError, match="the query failed"):
        await query(recorded, "SELECT * FROM no_such_table")
    assert (await query(recorded, "SELECT 1 AS one")).rows == [(1,)]  # the store still works


def test_the_text_check_knows_each_dialect_quoting():
    # PostgreSQL: dollar quotes, E'' strings with backslash escapes, nested comments.
    assert read_only_statement("SELECT $$;DELETE$$", "postgresql") == "SELECT $$;DELETE$$"
    assert read_only_statement("SELECT $t$ ; $t$ AS a;", "postgresql") == "SELECT $t$ ; $t$ AS a"
    assert read_only_statement(r"SELECT E'\';' AS a", "postgresql") == r"SELECT E'\';' AS a"
    assert read_only_statement("SELECT 1 /* /* ; */ ; */", "postgresql")
    with pytest.raises(QueryRefusedError, match="2 statements"):
        read_only_statement(r"SELECT E'\'' ; DELETE FROM x", "postgresql")
    # SQLite: [names] and `names`; a comment does not nest.
    assert read_only_statement("SELECT 1 AS [a;b], 2 AS `c;d`", "sqlite")
    with pytest.raises(QueryRefusedError, match="refused"):
        read_only_statement("SELECT 1 /* /* */ ; DELETE FROM x */", "sqlite")


# --- the same values on both databases ------------------------------------------------------


async def test_values_read_the_same_on_both_databases(recorded):
    result = await query(
        recorded,
        "SELECT r.rescored, r.metrics, ro.started_at, ro.imported, "
        "(SELECT avg(prompt_tokens) FROM v_llm_calls) AS mean_prompt, "
        "(SELECT sum(position) FROM v_llm_calls) AS positions, "
        "(r.reward > 0) AS positive "
        "FROM v_rewards AS r JOIN v_rollouts AS ro ON ro.rollout_id = r.rollout_id "
        "WHERE r.scorer = 'judge' AND r.rollout_id = 'r0b'",
    )
    # booleans as 0/1, JSON as text, timestamps as UTC text, numerics as numbers
    ((rescored, metrics, started_at, imported, mean_prompt, positions, positive),) = result.rows
    assert (rescored, metrics, started_at, imported, positive) == (
        0,
        '{"confidence":0.9}',
        "2026-03-01 12:00:00.125000",
        0,
        1,
    )
    assert isinstance(mean_prompt, float) and mean_prompt == approx(1030 / 9)
    assert isinstance(positions, int)


# --- tools/queries ------------------------------------------------------------------------

# Worked out by hand from tests/support/recorded_run.py.
EXPECTED = {
    "reward_curve.sql": [
        # policy step 0: r0a 1.0, r0b 0.25 (re-scored), r1a 0.5; step 1: r2a, r2b 1.0
        (RUN, 0, 3, approx(1.75 / 3), 0.25, 1.0),
        (RUN, 1, 2, 1.0, 1.0, 1.0),
    ],
    "reward_by_scorer.sql": [
        (RUN, "correct", "policy", 5, 0.75, 0.25, 1.0, 2),
        (RUN, "correct", "validation", 1, 0.5, 0.5, 0.5, 1),
        (RUN, "judge", "policy", 3, approx(0.5), 0.3, 0.8, 0),
        (RUN, "judge", "validation", 1, 0.6, 0.6, 0.6, 0),
    ],
    "reward_spread.sql": [
        (RUN, 0, 2, 1, 0.1875),  # g0 std 0.375, g1 a single reward
        (RUN, 1, 1, 1, 0.0),  # g2: 1.0 and 1.0
    ],
    "failure_rate.sql": [(RUN, 0, 4, 1, 0.25), (RUN, 1, 2, 0, 0.0)],
    "tokens_per_step.sql": [
        (RUN, 0, 6, 4, 780, 175, 955, 955 / 4, approx(4.55 / 6)),
        (RUN, 1, 2, 2, 160, 20, 180, 90.0, 0.5),
    ],
    "slowest_tools.sql": [
        # calculator: after c0a1 (2.25 s, shared with search); c0b0 ended its rollout
        ("calculator", 2, 1, 2.25, 2.25, None, approx((0.25 + 1.0) / 2)),
        # search: 1.0 s alone after c0a0, 2.25 s shared after c0a1; c1b0 ended its rollout
        ("search", 3, 2, 1.625, 2.25, 1.0, approx((0.5 + 0.25 + 0.3) / 3)),
    ],
    "train_steps.sql": [
        (
            RUN,
            MODEL,
            0,
            1,
            "completed",
            "correct",
            2,
            3,
            approx(1.75 / 3),
            0.25,
            12.5,
            "s3://bucket/agent-001/0001",
            None,
        ),
        (
            RUN,
            MODEL,
            1,
            None,
            "failed",
            "correct",
            1,
            2,
            1.0,
            None,
            None,
            None,
            "CUDA out of memory",
        ),
    ],
}


def test_every_query_in_tools_has_expected_values():
    assert sorted(path.name for path in QUERIES.glob("*.sql")) == sorted(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
async def test_tools_query(recorded, name):
    result = await query(recorded, (QUERIES / name).read_text())
    assert result.rows == EXPECTED[name]


# What tokens_per_step.sql computes from the rollouts' call totals, over every call.
TOKENS_OVER_CALLS = """
SELECT COALESCE(run, '(no run)') AS run, policy_step, COUNT(*), COUNT(DISTINCT rollout_id),
    SUM(prompt_tokens), SUM(completion_tokens), SUM(total_tokens),
    CAST(SUM(total_tokens) AS DOUBLE PRECISION) / COUNT(DISTINCT rollout_id), AVG(latency_s)
FROM v_llm_calls WHERE role = 'policy' AND policy_step IS NOT NULL
GROUP BY COALESCE(run, '(no run)'), policy_step ORDER BY run, policy_step
"""


async def test_tokens_per_step_equals_the_calls_with_a_call_without_latency(recorded):
    untimed = LLMCall(
        call_id="c2a-untimed",
        index=7,
        input=[],
        prompt_tokens=40,
        completion_tokens=2,
        started_at=datetime(2026, 3, 1, 13, tzinfo=UTC),
    )
    await recorded.append("rollout-r2a", [untimed])
    over_calls = (await query(recorded, TOKENS_OVER_CALLS)).rows
    from_totals = (await query(recorded, (QUERIES / "tokens_per_step.sql").read_text())).rows
    assert from_totals == [tuple(approx(v) for v in row) for row in over_calls]
    # step 1 now has three calls, one of them without latency: the mean is of the two timed
    assert from_totals[1] == (RUN, 1, 3, 2, 200, 22, 222, 111.0, 0.5)


def test_tools_query_through_the_command_line(recorded_url):
    result = artstore_sql(
        recorded_url, "--file", str(QUERIES / "failure_rate.sql"), "--format", "csv"
    )
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == [
        "run,policy_step,num_rollouts,num_failed,failure_rate",
        f"{RUN},0,4,1,0.25",
        f"{RUN},1,2,0,0.0",
    ]
