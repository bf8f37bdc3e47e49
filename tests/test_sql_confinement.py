"""`artstore sql` is safe by construction: each attack, on SQLite and PostgreSQL.

Two layers are tried apart: `query` (the parser, then the database) and `run_read_only`
(the database alone, as if the parser had been fooled). The database refuses every
attack by itself: PostgreSQL runs the query as `artstore_reader` (the views, nothing
else) in a READ ONLY transaction; SQLite opens the file read-only with an authorizer.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from recorded_run import record_run
from sqlalchemy import text
from sqlalchemy.engine import make_url

import artstore
from artstore.analysis import query, stream_query
from artstore.analysis.sql import read_only_statement, run_read_only
from artstore.errors import QueryError, QueryRefusedError
from artstore.events import RunFinished

COUNTING = "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < {rows}) "
FOREVER = "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n) SELECT count(*) FROM n"


@pytest.fixture
async def recorded(store):
    await record_run(store)
    return store


async def recorded_url_of(database_url: str) -> str:
    async with await artstore.open_store(database_url) as store:
        await record_run(store)
    return database_url


def artstore_command(*args: str) -> list[str]:
    return [sys.executable, "-c", "from artstore.cli import main; main()", *args]


async def refused_by_the_database(store, statement: str) -> None:
    with pytest.raises(QueryRefusedError, match="refused"):
        await run_read_only(store.database, statement)


# --- the parser ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "statement",
    [
        "SELECT tool_name AS call, count(*) AS copy FROM v_tool_calls GROUP BY tool_name",
        'SELECT run AS "update", status AS merge, model AS "delete" FROM v_runs',
        "SELECT 'DROP TABLE x; COPY y' AS s, 1 AS \"set\" FROM v_runs",
        "EXPLAIN SELECT * FROM v_runs",
    ],
)
async def test_valid_queries_whose_words_look_like_writes_run(recorded, statement):
    assert (await query(recorded, statement)).columns


async def test_a_comment_ended_by_a_carriage_return_hides_nothing(recorded, tmp_path):
    marker = tmp_path / "ran"
    attack = f"SELECT 1 AS a -- harmless?\r; COPY (SELECT 1) TO PROGRAM 'touch {marker}'"
    if recorded.dialect == "postgresql":
        # PostgreSQL ends a -- comment at \r: two statements, refused.
        with pytest.raises(QueryRefusedError, match="2 statements"):
            await query(recorded, attack)
        await refused_by_the_database(recorded, attack)
    else:
        # SQLite's comment runs to \n: the COPY is inside it, SQLite never sees it.
        assert (await query(recorded, attack)).rows == [(1,)]
    assert not marker.exists()


@pytest.mark.parametrize(
    "statement",
    [
        "WITH gone AS (DELETE FROM rewards RETURNING *) SELECT count(*) FROM gone",
        "SELECT * INTO copied FROM v_runs",
        "SELECT * FROM v_runs FOR UPDATE",
        "SELECT set_config('role', 'none', true)",
        "SELECT pg_catalog.set_config('statement_timeout', '0', false)",
        "SELECT query_to_xml('SELECT 1', true, true, '')",
        "SELECT dblink_exec('dbname=x', 'DELETE FROM rewards')",
        "SELECT pg_advisory_lock(7021802808247546469)",
        "SELECT pg_try_advisory_xact_lock(1)",
        "EXPLAIN ANALYZE DELETE FROM rewards",
        "COPY (SELECT 1) TO PROGRAM 'id'",
        "LOCK TABLE append_lock IN EXCLUSIVE MODE",
        "SET ROLE NONE",
        "PRAGMA query_only = OFF",
    ],
)
def test_the_parser_refuses_what_writes_or_leaves_the_session(statement):
    for dialect in ("sqlite", "postgresql"):
        with pytest.raises(QueryRefusedError, match="refused"):
            read_only_statement(statement, dialect)


# --- the database -------------------------------------------------------------------------


async def test_only_the_views_can_be_read(recorded):
    for table in ("events", "blobs", "rollouts", "rewards", "append_lock"):
        with pytest.raises(QueryRefusedError, match="the database refused"):
            await query(recorded, f"SELECT count(*) FROM {table}")
    assert (await query(recorded, "SELECT count(*) FROM v_rollouts")).rows == [(7,)]


async def test_the_database_refuses_server_files_programs_and_other_sessions(recorded, tmp_path):
    marker = tmp_path / "ran"
    if recorded.dialect == "postgresql":
        other = await artstore.open_store(str(recorded.database.url))
        try:
            await other.append("run-other", [RunFinished(run="other")])  # a writer's backend
            async with other.database.read() as connection:
                pid = (await connection.execute(text("SELECT pg_backend_pid()"))).scalar()
            for statement in [
                f"COPY (SELECT 1) TO PROGRAM 'touch {marker}'",
                "SELECT pg_read_file('/etc/hostname')",
                "SELECT pg_ls_dir('.')",
                f"SELECT pg_terminate_backend({pid})",
                "SELECT set_config('role', 'none', true)",
                "SELECT query_to_xml('SELECT set_config(''role'', ''none'', true)', true, true, "
                "'')",
                "SELECT lo_import('/etc/hostname')",
                "LOCK TABLE append_lock IN EXCLUSIVE MODE",
                "SELECT nextval('events_position_seq')",
            ]:
                await refused_by_the_database(recorded, statement)
            async with other.database.read() as connection:  # still alive
                assert (await connection.execute(text("SELECT 1"))).scalar() == 1
        finally:
            await other.close()
    else:
        for statement in [
            "SELECT load_extension('mod_spatialite')",
            f"ATTACH DATABASE '{marker}' AS other",
            "PRAGMA writable_schema = ON",
            "SELECT * FROM sqlite_master, events",
        ]:
            await refused_by_the_database(recorded, statement)
    assert not marker.exists()


async def test_dblink_cannot_reach_out_as_the_store(postgres_url):
    import psycopg

    url = await recorded_url_of(postgres_url)
    name = make_url(url).database
    admin = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(admin, autocommit=True) as connection:
        connection.execute("CREATE EXTENSION IF NOT EXISTS dblink")
    async with await artstore.open_store(url, read_only=True) as store:
        with pytest.raises(QueryRefusedError):
            await query(store, f"SELECT dblink_exec('dbname={name}', 'DELETE FROM rewards')")
        await refused_by_the_database(
            store, f"SELECT dblink_exec('dbname={name} user=postgres', 'DELETE FROM rewards')"
        )
        assert (await query(store, "SELECT count(*) FROM v_rewards")).rows[0][0] > 0


async def test_a_query_cannot_take_the_append_lock(recorded):
    """While a user query holds whatever lock it can, the store still appends."""
    grab = (
        "SELECT pg_advisory_lock(7021802808247546469), pg_sleep(2)"
        if recorded.dialect == "postgresql"
        else "SELECT count(*) FROM v_rollouts, v_llm_calls, v_rewards, v_groups"
    )
    holder = asyncio.create_task(run_read_only(recorded.database, grab))
    await asyncio.sleep(0.5)
    appended = await asyncio.wait_for(
        recorded.append("run-during", [RunFinished(run="during")]), timeout=30
    )
    assert appended.written
    await holder
    if recorded.dialect == "sqlite":
        with pytest.raises(QueryRefusedError):  # no write lock from a read-only file
            await run_read_only(recorded.database, "BEGIN IMMEDIATE")


async def test_a_query_that_runs_too_long_is_stopped(recorded):
    statements = [FOREVER]
    if recorded.dialect == "postgresql":
        statements.append("SELECT pg_sleep(600)")
    for statement in statements:
        with pytest.raises(QueryError, match="time limit"):
            await query(recorded, statement, timeout=1)
    if recorded.dialect == "postgresql":
        assert await _running_queries(recorded, "pg_sleep(600)") == 0
    assert (await query(recorded, "SELECT count(*) FROM v_runs")).rows == [(1,)]


async def _running_queries(store, fragment: str) -> int:
    async with store.database.read() as connection:
        found = await connection.execute(
            text(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND state = 'active' AND query LIKE :fragment AND pid <> pg_backend_pid()"
            ),
            {"fragment": f"%{fragment}%"},
        )
        return found.scalar()


async def test_a_killed_client_leaves_no_query_running(postgres_url):
    url = await recorded_url_of(postgres_url)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])}
    client = subprocess.Popen(
        artstore_command("sql", "--url", url, "--timeout", "0", "SELECT pg_sleep(600)"),
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    async with await artstore.open_store(url) as store:
        try:
            for _ in range(300):  # until the server runs it
                if await _running_queries(store, "pg_sleep(600)"):
                    break
                await asyncio.sleep(0.1)
            else:
                pytest.fail("the query never started")
        finally:
            client.send_signal(signal.SIGKILL)
            client.wait()
        for _ in range(300):  # the server notices the closed connection by itself
            if not await _running_queries(store, "pg_sleep(600)"):
                break
            await asyncio.sleep(0.1)
        assert await _running_queries(store, "pg_sleep(600)") == 0


# --- rows streamed ------------------------------------------------------------------------


async def test_rows_are_streamed_in_batches(recorded):
    rows = 25_000
    async with stream_query(recorded, COUNTING.format(rows=rows) + "SELECT i FROM n") as result:
        sizes = [len(batch) async for batch in result.batches()]
    assert sum(sizes) == rows and max(sizes) <= 1000


def _peak_memory_of(url: str, rows: int) -> tuple[int, int]:
    """(rows printed, peak RSS in KiB) of `artstore sql --format csv` over `rows` rows."""
    statement = COUNTING.format(rows=rows) + "SELECT i, i * 2 AS twice, 'row' AS label FROM n"
    code = (
        "import resource, subprocess, sys; "
        "child = subprocess.Popen(sys.argv[1:], stdout=subprocess.PIPE); "
        "lines = sum(1 for _ in child.stdout); child.wait(); "
        "print(child.returncode, lines, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])}
    command = artstore_command("sql", "--url", url, "--format", "csv", statement)
    done = subprocess.run(
        [sys.executable, "-c", code, *command], capture_output=True, text=True, env=env
    )
    returncode, lines, peak = (int(word) for word in done.stdout.split())
    assert returncode == 0, done.stderr
    return lines - 1, peak  # less the header


@pytest.mark.slow
def test_two_million_rows_are_not_held_in_memory(database_url):
    url = asyncio.run(recorded_url_of(database_url))
    few_rows, few_peak = _peak_memory_of(url, 10)
    many_rows, many_peak = _peak_memory_of(url, 2_000_000)
    assert (few_rows, many_rows) == (10, 2_000_000)
    # Held as Python tuples, 2 million rows of three values take 250 MB and more.
    assert many_peak - few_peak < 60 * 1024, (few_peak, many_peak)


def test_the_command_line_stops_a_query_at_its_timeout(database_url):
    url = asyncio.run(recorded_url_of(database_url))
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])}
    stopped = subprocess.run(
        artstore_command("sql", "--url", url, "--timeout", "1", FOREVER),
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert stopped.returncode == 1
    assert stopped.stderr.count("\n") == 1 and "time limit (1 s)" in stopped.stderr


@pytest.fixture
def plain_user_url(empty_postgres_url: str):
    """The test database owned by a user who may neither create roles nor bypass rights."""
    import uuid

    import psycopg

    user = f"artstore_plain_{uuid.uuid4().hex[:8]}"
    url = make_url(empty_postgres_url)
    admin = url.set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(admin, autocommit=True) as connection:
        connection.execute(f"CREATE ROLE {user} LOGIN")
        connection.execute(f'ALTER DATABASE "{url.database}" OWNER TO {user}')
    try:
        yield url.set(username=user).render_as_string(hide_password=False)
    finally:
        with psycopg.connect(admin, autocommit=True) as connection:
            connection.execute(f"REASSIGN OWNED BY {user} TO postgres")
            connection.execute(f"DROP OWNED BY {user}")
            connection.execute(f'ALTER DATABASE "{url.database}" OWNER TO postgres')
            connection.execute(f"DROP ROLE {user}")


async def test_a_store_migrated_by_a_plain_user_works_and_sql_says_what_it_needs(
    plain_user_url,
):
    async with await artstore.open_store(plain_user_url) as store:  # the migration runs
        await store.append("run-a", [RunFinished(run="a")])
    async with await artstore.open_store(plain_user_url, read_only=True) as store:
        with pytest.raises(QueryError, match="artstore_reader"):
            await query(store, "SELECT count(*) FROM v_runs")


async def test_a_kept_query_connection_keeps_its_guards(recorded):
    """Query connections are kept between queries: what one query did or took does not
    outlive it, and the next query on that connection is as confined as the first."""
    if recorded.dialect == "postgresql":
        from artstore.eventstore.postgres import lock_key

        # A session-level advisory lock survives its transaction; the session's reset
        # releases it before the connection serves the next query.
        await run_read_only(recorded.database, f"SELECT pg_advisory_lock({lock_key('kept')})")
        assert await recorded.database.lock_held("kept") is False
    for _ in range(3):  # the same few connections, again and again
        await refused_by_the_database(recorded, "SELECT count(*) FROM events")
        with pytest.raises(QueryError, match="time limit"):
            await query(recorded, FOREVER, timeout=0.5)
        assert (await query(recorded, "SELECT count(*) FROM v_runs")).rows == [(1,)]
        assert (await query(recorded, "SELECT count(*) FROM v_runs", timeout=None)).rows == [(1,)]
