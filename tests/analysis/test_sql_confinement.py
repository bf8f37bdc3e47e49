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
from command_line import run_artstore, run_artstore_in_thread
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
                "SELECT pg_catalog.set_config('statement_timeout', '0', false)",
                "SELECT query_to_xml('SELECT set_config(''role'', ''none'', true)', true, true, "
                "'')",
                "SELECT pg_advisory_lock(7021802808247546469)",
                "SELECT pg_try_advisory_xact_lock(1)",
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
    attack = f"SELECT dblink_exec('dbname={name} user=postgres', 'DELETE FROM rewards')"
    # A new extension's functions are PUBLIC's: artstore sql runs nothing until the reader
    # is confined again, and says how.
    async with await artstore.open_store(url, read_only=True) as store:
        with pytest.raises(QueryError, match=r"dblink\w*\(.*artstore db upgrade"):
            await query(store, "SELECT count(*) FROM v_rewards")
    async with await artstore.open_store(url) as store:  # what `artstore db upgrade` does
        assert await store.database.confine_reader() == []
    async with await artstore.open_store(url, read_only=True) as store:
        with pytest.raises(QueryRefusedError, match="permission denied for function dblink"):
            await run_read_only(store.database, attack)
        assert (await query(store, "SELECT count(*) FROM v_rewards")).rows[0][0] > 0


async def test_a_query_cannot_take_the_append_lock(recorded):
    """While a user query is under way, holding whatever a reader of its database holds,
    the store still appends; and the query cannot take the append lock for itself."""
    long_query = COUNTING.format(rows=100_000) + "SELECT n.i, r.run FROM n, v_runs r"
    async with stream_query(recorded, long_query) as result:
        batches = result.batches()
        assert len(await anext(batches)) == 1000  # under way, with rows still to come
        appended = await asyncio.wait_for(
            recorded.append("run-during", [RunFinished(run="during")]), timeout=30
        )
        assert appended.written
        assert sum([len(batch) async for batch in batches]) == 99_000
    if recorded.dialect == "postgresql":  # not even an advisory lock of its own
        with pytest.raises(QueryRefusedError, match="permission denied for function"):
            await run_read_only(recorded.database, "SELECT pg_advisory_lock(7021802808247546469)")
    else:  # no write lock from a read-only file
        with pytest.raises(QueryRefusedError):
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
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])}
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
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])}
    # No time limit: the rows take as long as the machine needs.
    command = artstore_command("sql", "--url", url, "--format", "csv", "--timeout", "0", statement)
    done = subprocess.run(
        [sys.executable, "-c", code, *command], capture_output=True, text=True, env=env
    )
    returncode, lines, peak = (int(word) for word in done.stdout.split())
    assert returncode == 0, done.stderr
    return lines - 1, peak  # less the header


@pytest.mark.slow
def test_a_million_rows_are_not_held_in_memory(database_url):
    url = asyncio.run(recorded_url_of(database_url))
    few_rows, few_peak = _peak_memory_of(url, 10)
    many_rows, many_peak = _peak_memory_of(url, 1_000_000)
    assert (few_rows, many_rows) == (10, 1_000_000)
    # Held as Python tuples, a million rows of three values take 125 MB and more.
    assert many_peak - few_peak < 60 * 1024, (few_peak, many_peak)


def test_the_command_line_stops_a_query_at_its_timeout(database_url):
    url = asyncio.run(recorded_url_of(database_url))
    stopped = run_artstore("sql", "--url", url, "--timeout", "1", FOREVER)
    assert stopped.exit_code == 1
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
    """A user who is not a superuser cannot confine the reader (the built-in functions are
    the bootstrap superuser's): artstore sql refuses to run, in one line that says what to
    do; once a superuser ran `artstore db upgrade`, it runs, confined, and the store's own
    user still appends, trains and reads (its functions were given back to it)."""
    import psycopg

    from artstore.training.lease import trainer_lease

    async with await artstore.open_store(plain_user_url) as store:  # the migration runs
        await store.append("run-a", [RunFinished(run="a")])
    async with await artstore.open_store(plain_user_url, read_only=True) as store:
        with pytest.raises(QueryError, match="may not act as artstore_reader"):
            await query(store, "SELECT count(*) FROM v_runs")
    url = make_url(plain_user_url)
    admin = url.set(drivername="postgresql", username="postgres")
    with psycopg.connect(admin.render_as_string(hide_password=False), autocommit=True) as db:
        db.execute(f"GRANT artstore_reader TO {url.username}")
    async with await artstore.open_store(plain_user_url, read_only=True) as store:
        with pytest.raises(QueryError, match=r"superuser.*\n?") as refused:
            await query(store, "SELECT count(*) FROM v_runs")
    assert "\n" not in str(refused.value) and "artstore db upgrade" in str(refused.value)

    superuser_url = url.set(username="postgres").render_as_string(hide_password=False)
    upgraded = await run_artstore_in_thread("db", "upgrade", "--url", superuser_url)
    assert upgraded.exit_code == 0 and not upgraded.stderr, upgraded.stderr
    async with await artstore.open_store(plain_user_url) as store:
        await store.append("run-b", [RunFinished(run="b")])
        async with trainer_lease(store.database, "b", "project/b"):
            pass
        assert len(await store.read_all()) == await store.last_position() == 2
        assert (await query(store, "SELECT count(*) FROM v_runs")).rows == [(0,)]
        with pytest.raises(QueryRefusedError, match="permission denied for function"):
            await run_read_only(store.database, "SELECT pg_advisory_lock(1)")


async def test_a_kept_query_connection_keeps_its_guards(recorded):
    """Query connections are kept between queries: what one query did or took does not
    outlive it, and the next query on that connection is as confined as the first."""
    if recorded.dialect == "postgresql":
        from artstore.eventstore.postgres import lock_key

        # A session-level setting survives its transaction (the session's reset takes it
        # back); an advisory lock would too, and the reader may not take one.
        await run_read_only(recorded.database, "SET statement_timeout = 0")
        with pytest.raises(QueryRefusedError, match="permission denied for function"):
            await run_read_only(recorded.database, f"SELECT pg_advisory_lock({lock_key('kept')})")
        assert await recorded.database.lock_held("kept") is False
    for _ in range(3):  # the same few connections, again and again
        await refused_by_the_database(recorded, "SELECT count(*) FROM events")
        with pytest.raises(QueryError, match="time limit"):
            await query(recorded, FOREVER, timeout=0.5)
        assert (await query(recorded, "SELECT count(*) FROM v_runs")).rows == [(1,)]
        assert (await query(recorded, "SELECT count(*) FROM v_runs", timeout=None)).rows == [(1,)]


# --- functions: an allow-list, granted by the database ------------------------------------

# What a function is handed for each argument type in the sweep below: a text is a query
# that says so if anything runs it, a relation is a view that says so if anything reads it.
PROBE_QUERY = "SELECT ran FROM artstore_probe"
SAMPLE_ARGUMENTS = {
    "text": f"CAST('{PROBE_QUERY}' AS text)",
    "regclass": "CAST('artstore_probe' AS regclass)",
    "refcursor": "CAST('artstore_probe' AS refcursor)",
    "boolean": "false",
    "smallint": "CAST(1 AS smallint)",
    "integer": "1",
    "bigint": "CAST(1 AS bigint)",
    "double precision": "CAST(1 AS double precision)",
    "numeric": "CAST(1 AS numeric)",
    "name": "CAST('artstore_probe' AS name)",
    "tsquery": "CAST('x' AS tsquery)",
    "regconfig": "CAST('simple' AS regconfig)",
    "json": "CAST('{}' AS json)",
    "jsonb": "CAST('{}' AS jsonb)",
    "xml": "CAST('<x/>' AS xml)",
    "oid": "CAST(0 AS oid)",
    '"any"': f"CAST('{PROBE_QUERY}' AS text)",
    "anyelement": f"CAST('{PROBE_QUERY}' AS text)",
    "anycompatible": f"CAST('{PROBE_QUERY}' AS text)",
    "anynonarray": f"CAST('{PROBE_QUERY}' AS text)",
    "anyarray": "CAST(ARRAY['x'] AS text[])",
    "text[]": "CAST(ARRAY['x'] AS text[])",
}
# Pseudo-types that no SQL expression is of (or whose functions only the server calls).
UNCALLABLE = (
    "internal",
    "cstring",
    "trigger",
    "event_trigger",
    "language_handler",
    "fdw_handler",
    "index_am_handler",
    "table_am_handler",
    "tsm_handler",
    "record",
)


def _call(name: str, types: list[str], kind: str) -> str:
    arguments = ", ".join(SAMPLE_ARGUMENTS.get(t, f"CAST(NULL AS {t})") for t in types)
    return f"SELECT {name}({arguments})" + (" OVER ()" if kind == "w" else "")


async def _functions_taking_text(store) -> list[tuple[str, str, str]]:
    """(signature, call, name) of every function the reader's schemas hold that takes a
    text, a relation or a cursor, with arguments that name the probe."""
    async with store.database.read() as connection:
        found = await connection.execute(
            text(
                "SELECT p.oid::regprocedure::text, quote_ident(n.nspname) || '.' || "
                "quote_ident(p.proname), p.proname, p.prokind, "
                "ARRAY(SELECT format_type(t, NULL) FROM unnest(p.proargtypes) AS t) "
                "FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace "
                "WHERE has_schema_privilege('artstore_reader', p.pronamespace, 'USAGE') "
                "AND p.prokind IN ('f', 'a', 'w') "
                "AND p.proargtypes::oid[] && ARRAY['text', 'regclass', 'refcursor', "
                "'\"any\"']::regtype[]::oid[]"
            )
        )
        return [
            (signature, _call(qualified, types, kind), name)
            for signature, qualified, name, kind, types in found
            if not any(t in UNCALLABLE for t in types)
        ]


@pytest.fixture
async def probed(postgres_url):
    """A recorded store with `artstore_probe`, a view that the reader may read and that
    fails, saying `artstore_probe_ran`, whoever reads it (the reader may not run the
    function, and is told so by name)."""
    async with await artstore.open_store(postgres_url) as store:
        await record_run(store)
        async with store.database.read() as connection:
            for statement in (
                "CREATE FUNCTION artstore_probe_ran() RETURNS integer LANGUAGE plpgsql "
                "AS $$ BEGIN RAISE EXCEPTION 'artstore_probe_ran'; END $$",
                "REVOKE EXECUTE ON FUNCTION artstore_probe_ran() FROM PUBLIC",
                "CREATE VIEW artstore_probe AS SELECT artstore_probe_ran() AS ran",
                "GRANT SELECT ON artstore_probe TO artstore_reader",
            ):
                await connection.execute(text(statement))
            await connection.commit()
        yield store


async def _running_the_probe(store, calls: list[tuple[str, str, str]]) -> set[str]:
    """The signatures of the `calls` that, made by the store's own user, run the probe's
    query: each in a savepoint of one transaction that rolls back (nothing stays)."""
    running = set()
    async with store.database.read() as connection:
        await connection.execute(text("SET LOCAL statement_timeout = 5000"))
        for signature, call, _ in calls:
            try:
                async with connection.begin_nested():
                    await connection.execute(text(call.replace(":", "\\:")))
            except Exception as exc:
                if "artstore_probe_ran" in str(exc):
                    running.add(signature)
        await connection.rollback()
    return running


async def test_no_function_runs_sql_given_as_text_for_the_reader(probed):
    """Every function with a text, relation or cursor argument, called by the reader with
    a query that says so when it runs: those that run it for the store's own user are
    refused to the reader by privilege, and none runs it for the reader."""
    functions = await _functions_taking_text(probed)
    running = await _running_the_probe(probed, functions)
    # The sweep finds them (it would pass vacuously if its calls ran nothing).
    assert {
        "ts_stat(text)",
        "ts_rewrite(tsquery,text)",
        "query_to_xml(text,boolean,boolean,text)",
        "table_to_xml(regclass,boolean,boolean,text)",
    } <= running
    ran_for_the_reader, allowed = [], []
    for signature, call, name in functions:
        try:
            await run_read_only(probed.database, call, timeout=5)
        except (QueryError, QueryRefusedError) as exc:
            said = str(exc)
            if "artstore_probe_ran" in said:
                ran_for_the_reader.append(f"{signature}: {said}")
            if signature in running and f"permission denied for function {name}" not in said:
                allowed.append(f"{signature}: {said}")
        else:
            if signature in running:
                allowed.append(signature)
    assert ran_for_the_reader == []
    assert allowed == []


async def test_a_query_cannot_hold_what_trainers_and_readers_wait_for(postgres_url):
    """A trainer's lock and the watermark of concurrent appends are advisory locks: a user
    query cannot take one, however it calls the function, while trainers and readers
    carry on."""
    from artstore.eventstore.postgres import lock_key
    from artstore.training.lease import lock_name, trainer_lease

    store = await artstore.open_store(postgres_url)
    running: list[asyncio.Task] = []
    try:
        await record_run(store)
        events = await store.last_position()
        trainer = lock_key(lock_name("arith/agent-001"))
        watermark = 0x4172_7400_0000_0000 + 1  # a concurrent append below position 2
        attacks = []
        for key in (trainer, watermark):
            take = f"SELECT pg_advisory_lock({key}), pg_sleep(60)"
            attacks += [
                take,
                f"SELECT ts_stat('SELECT to_tsvector(''x'') FROM ({take}) AS held')",
                "SELECT ts_rewrite('a'::tsquery, 'SELECT ''a''::tsquery, ''b''::tsquery "
                f"FROM ({take}) AS held')",
                f"SELECT query_to_xml('{take}', true, true, '')",
            ]
        running += [
            asyncio.create_task(run_read_only(store.database, attack, timeout=120))
            for attack in attacks
        ]
        # Until every attack was refused, or one holds its lock.
        for _ in range(600):
            if all(task.done() for task in running) or await _advisory_locks_held(store):
                break
            await asyncio.sleep(0.1)
        async with trainer_lease(store.database, "arith-001", "arith/agent-001"):
            pass
        assert await store.last_position() == events
        assert len(await store.read_all(limit=10_000)) == events
        for task in running:
            with pytest.raises(QueryRefusedError, match="permission denied for function"):
                await task
    finally:
        for task in running:
            task.cancel()
        await store.close()


async def _advisory_locks_held(store) -> int:
    async with store.database.read() as connection:
        found = await connection.execute(
            text(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted "
                "AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
            )
        )
        return found.scalar()


# --- every view answers -------------------------------------------------------------------


async def test_every_view_answers_counts_aggregates_joins_and_explain(recorded):
    from artstore.schema.views import VIEWS, json_column_names

    views = [view.name for view in VIEWS]
    holds_json = json_column_names()
    for view in views:
        every = await query(recorded, f"SELECT * FROM {view}")
        assert (await query(recorded, f"SELECT count(*) FROM {view}")).rows == [(len(every.rows),)]
        plain = [c for c in every.columns if c not in holds_json]
        aggregates = ", ".join(f"count({c}), min({c}), max({c})" for c in plain)
        assert (await query(recorded, f"SELECT count(*), {aggregates} FROM {view}")).rows
        first = plain[0]
        grouped = await query(
            recorded, f"SELECT {first}, count(*) AS n FROM {view} GROUP BY {first}"
        )
        assert sum(n for _, n in grouped.rows) == len(every.rows)
        other_explain = (
            "EXPLAIN QUERY PLAN" if recorded.dialect == "sqlite" else "EXPLAIN (COSTS OFF)"
        )
        for explain in ("EXPLAIN", other_explain):
            assert (await query(recorded, f"{explain} SELECT count(*) FROM {view}")).rows
        for other in views:
            joined = await query(
                recorded, f"SELECT count(*) FROM {view} AS a CROSS JOIN {other} AS b"
            )
            count_other = (await query(recorded, f"SELECT count(*) FROM {other}")).rows[0][0]
            assert joined.rows == [(len(every.rows) * count_other,)]
    # A table is still refused, counted or read.
    for statement in ("SELECT count(*) FROM train_steps", "SELECT count(*) FROM v_runs, events"):
        with pytest.raises(QueryRefusedError):
            await query(recorded, statement)
