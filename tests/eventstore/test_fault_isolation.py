"""One bad input fails only itself (invariant 9), on SQLite and PostgreSQL.

The failures are real: a value the database cannot store, the server dropping the store's
connections in the middle of a rollout, a database that stops accepting connections, and
a full disk (SQLite's page limit; PostgreSQL writing to a tablespace on a small tmpfs).
"""

from __future__ import annotations

import asyncio
import base64
import os
import subprocess
import tempfile
import uuid
from pathlib import Path

import pytest
from langchain_core.messages import AIMessage, HumanMessage
from sqlalchemy import event, select
from sqlalchemy.engine import make_url
from waiting import eventually

import artstore
from artstore.errors import (
    AppendRefusedError,
    DatabaseUnavailableError,
    StorageFullError,
    WrongExpectedVersionError,
)
from artstore.events import RunFinished, TrainStepStarted
from artstore.eventstore import NO_STREAM
from artstore.schema import tables as t
from artstore.testing.inference_server import token_logprobs

# An integer neither database can hold (SQLite: 64 bits, PostgreSQL's integer: 32).
TOO_BIG = 2**70


def answer(text: str, prompt_tokens: int = 3) -> AIMessage:
    metadata = {
        "logprobs": {"content": token_logprobs(text), "refusal": None},
        "finish_reason": "stop",
        "model_name": "test-model",
        "token_usage": {"prompt_tokens": prompt_tokens, "completion_tokens": 1},
    }
    return AIMessage(content=text, response_metadata=metadata)


async def rollouts_by_status(store) -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    async with store.database.read() as connection:
        for row in await connection.execute(select(t.rollouts.c.rollout_id, t.rollouts.c.status)):
            found.setdefault(row.status, set()).add(row.rollout_id)
    return found


async def run_rollout(store, name: str, release: asyncio.Event, *, calls: int, bad: bool = False):
    """A rollout whose calls are all recorded at once, when `release` is set."""
    async with store.rollout("agent", scenario={"name": name}, rollout_id=name) as rollout:
        await release.wait()
        for n in range(calls):
            poisoned = bad and n == 1
            rollout.record_llm_call(
                [HumanMessage(f"{name} question {n}")],
                answer(f"{name} answer {n}", prompt_tokens=TOO_BIG if poisoned else 3),
            )
        rollout.result = {"name": name}
    return rollout


# --- a value the database refuses --------------------------------------------------------


async def test_an_append_the_database_refuses_fails_alone(store):
    good = [store.append(f"run-{n}", [RunFinished(run=str(n))], NO_STREAM) for n in range(31)]
    too_big = TrainStepStarted(
        run="x", model="m", step=TOO_BIG, group_ids=["g"], scorer="s", trainer="t"
    )
    refused = store.append("train-x", [too_big])
    more = [store.append(f"run-{n}", [RunFinished(run=str(n))], NO_STREAM) for n in range(31, 63)]
    before = store.transactions
    outcomes = await asyncio.gather(*good, refused, *more, return_exceptions=True)

    errors = [o for o in outcomes if isinstance(o, BaseException)]
    assert len(errors) == 1 and isinstance(outcomes[31], AppendRefusedError)
    assert "train-x" in str(outcomes[31]) and "nothing of it was written" in str(outcomes[31])
    assert len(await store.read_all(limit=1000)) == 63
    assert await store.read_stream("train-x") == []
    assert store.transactions - before <= 4  # still group commit, not 63 transactions


async def _all_running(store, names: list[str]) -> bool:
    return await rollouts_by_status(store) == {"running": set(names)}


async def test_a_refused_llm_call_fails_its_rollout_only_with_the_real_cause(store):
    release = asyncio.Event()
    names = [f"r{n}" for n in range(8)]
    tasks = [
        asyncio.create_task(run_rollout(store, name, release, calls=3, bad=name == "r3"))
        for name in names
    ]
    # Every rollout.started stored first, so that the calls come together.
    await eventually(lambda: _all_running(store, names), "every rollout to be recorded as running")
    release.set()
    outcomes = await asyncio.gather(*tasks, return_exceptions=True)

    raised = outcomes[3]
    assert isinstance(raised, AppendRefusedError), raised
    assert not isinstance(raised, WrongExpectedVersionError)
    assert all(not isinstance(o, BaseException) for n, o in enumerate(outcomes) if n != 3)
    status = await rollouts_by_status(store)
    assert status == {"finished": set(names) - {"r3"}, "failed": {"r3"}}
    for name in set(names) - {"r3"}:  # neighbours in the same transactions lost nothing
        types = [e.type for e in await store.read_stream(f"rollout-{name}")]
        assert types == ["rollout.started", "llm.call", "llm.call", "llm.call", "rollout.finished"]
    stream = await store.read_stream("rollout-r3")
    assert [e.type for e in stream] == ["rollout.started", "llm.call", "rollout.failed"]
    failed = stream[-1].decode()
    assert failed.error_type == "AppendRefusedError" and "refused" in failed.error_message


async def test_a_result_the_database_refuses_ends_the_rollout_failed(store):
    # The block ran to its end, but its end cannot be stored: recorded as failed, never
    # left running, and the caller sees why.
    with pytest.raises(AppendRefusedError):
        async with store.rollout("agent", scenario={}, rollout_id="big-index") as rollout:
            rollout.record_llm_call([HumanMessage("q")], answer("a"))
            rollout.record_llm_call([HumanMessage("q")], answer("b", prompt_tokens=TOO_BIG))
            rollout.result = "done"
    assert await rollouts_by_status(store) == {"failed": {"big-index"}}


async def test_a_rollout_whose_start_is_refused_leaves_nothing(store):
    with pytest.raises(AppendRefusedError):
        async with store.rollout("agent", scenario={}, scenario_index=TOO_BIG, rollout_id="r"):
            pass
    assert await store.read_stream("rollout-r") == []
    assert await rollouts_by_status(store) == {}


# --- PostgreSQL: connections dropped, or the database gone -------------------------------


def postgres_admin(url: str):
    import psycopg

    admin = make_url(url).set(drivername="postgresql", database="postgres")
    return psycopg.connect(admin.render_as_string(hide_password=False), autocommit=True)


def terminate_connections(url: str) -> int:
    """What a server restart or a network cut does to the store: every connection dies."""
    name = make_url(url).database
    with postgres_admin(url) as admin:
        rows = admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s",
            (name,),
        ).fetchall()
    return len(rows)


async def test_connections_dropped_mid_rollout_lose_nothing(postgres_url):
    database_url = postgres_url
    async with await artstore.open_store(database_url) as store:
        async with store.rollout("agent", scenario={"q": 1}, rollout_id="cut") as rollout:
            rollout.record_llm_call([HumanMessage("before")], answer("one"))
            await store.flush()
            assert await asyncio.to_thread(terminate_connections, database_url) >= 1
            rollout.record_llm_call([HumanMessage("after")], answer("two"))
            rollout.result = "ok"
        types = [e.type for e in await store.read_stream("rollout-cut")]
        assert types == ["rollout.started", "llm.call", "llm.call", "rollout.finished"]
        assert await rollouts_by_status(store) == {"finished": {"cut"}}
        async with store.database.read() as connection:
            calls = await connection.execute(select(t.llm_calls.c.call_index))
            assert sorted(row.call_index for row in calls) == [0, 1]


async def test_a_database_gone_mid_rollout_gives_the_real_error(postgres_url):
    database_url = postgres_url
    name = make_url(database_url).database
    store = await artstore.open_store(database_url)
    try:
        with pytest.raises(DatabaseUnavailableError, match="not currently accepting") as raised:
            async with store.rollout("agent", scenario={}, rollout_id="gone") as rollout:
                rollout.record_llm_call([HumanMessage("before")], answer("one"))
                await store.flush()
                with postgres_admin(database_url) as admin:
                    admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false')
                await asyncio.to_thread(terminate_connections, database_url)
                rollout.record_llm_call([HumanMessage("after")], answer("two"))
        assert not isinstance(raised.value.__context__, WrongExpectedVersionError)
    finally:
        with postgres_admin(database_url) as admin:
            admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')
        await store.close()
    async with await artstore.open_store(database_url) as again:
        types = [e.type for e in await again.read_stream("rollout-gone")]
        assert types == ["rollout.started", "llm.call"]  # what was committed, nothing more


# --- a full disk -------------------------------------------------------------------------

BIG_MESSAGE = "x" * 3_000_000  # larger than the space left


async def test_a_full_sqlite_database_fails_the_big_append_and_records_why(tmp_path):
    url = f"sqlite:///{tmp_path / 'full.db'}"
    async with await artstore.open_store(url) as store:
        pages = await _sqlite_pages(store)

        # The disk is full beyond 64 more pages (256 KiB), for the writer's connection.
        @event.listens_for(store.database.writer_engine, "connect")
        def limit(dbapi_connection, _record) -> None:
            dbapi_connection.execute(f"PRAGMA max_page_count = {pages + 64}")

        release = asyncio.Event()
        small = asyncio.create_task(run_rollout(store, "small", release, calls=2))
        with pytest.raises(StorageFullError, match="no space left") as full:
            async with store.rollout("agent", scenario={}, rollout_id="huge") as rollout:
                release.set()
                rollout.record_llm_call([HumanMessage(BIG_MESSAGE)], answer("a"))
        assert str(full.value).count("no space left") == 1, str(full.value)  # said once
        await small
        assert await rollouts_by_status(store) == {"finished": {"small"}, "failed": {"huge"}}
        failed = (await store.read_stream("rollout-huge"))[-1].decode()
        assert failed.error_type == "StorageFullError"
        assert failed.error_message.count("no space left") == 1, failed.error_message


async def _sqlite_pages(store) -> int:
    async with store.database.read() as connection:
        return (await connection.exec_driver_sql("PRAGMA page_count")).scalar()


@pytest.fixture
def small_tablespace(empty_postgres_url: str):
    """The test database's tables on a 24 MiB tmpfs: PostgreSQL runs out of disk for real."""
    database_url = empty_postgres_url
    if os.geteuid() != 0:
        pytest.skip("mounting a small filesystem for the server's tablespace needs root")
    import pwd

    postgres = pwd.getpwnam("postgres")
    mount = Path(tempfile.mkdtemp(prefix="artstore-space-"))  # a path the server can reach
    mount.chmod(0o755)
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size=24m,mode=0700,uid={postgres.pw_uid}", "tmpfs", mount],
        check=True,
    )
    tablespace = f"artstore_small_{uuid.uuid4().hex[:8]}"
    name = make_url(database_url).database
    try:
        with postgres_admin(database_url) as admin:
            admin.execute(f"CREATE TABLESPACE {tablespace} LOCATION '{mount}'")
            admin.execute(f'ALTER DATABASE "{name}" SET default_tablespace = {tablespace}')
        yield database_url
    finally:
        with postgres_admin(database_url) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            admin.execute(f"DROP TABLESPACE IF EXISTS {tablespace}")
        subprocess.run(["umount", "-l", mount], check=False)
        mount.rmdir()


async def test_a_full_postgresql_disk_fails_the_big_append_and_records_why(small_tablespace):
    url = small_tablespace
    big = base64.b64encode(os.urandom(30_000_000)).decode()  # 40 MB that do not compress
    async with await artstore.open_store(url) as store:
        with pytest.raises(StorageFullError, match="no space left") as full:
            async with store.rollout("agent", scenario={}, rollout_id="huge") as rollout:
                await store.flush()  # started long ago, as rollouts are
                rollout.record_llm_call([HumanMessage(big)], answer("a"))
        assert str(full.value).count("no space left") == 1, str(full.value)  # said once
        # The failed transaction's pages stay allocated, and the disk is full: the failure
        # is recorded without its traceback, which fits in pages already there.
        assert await rollouts_by_status(store) == {"failed": {"huge"}}
        failed = (await store.read_stream("rollout-huge"))[-1].decode()
        assert failed.error_type == "StorageFullError"
        assert failed.error_message.count("no space left") == 1, failed.error_message


# --- another writer ends a rollout while its calls are queued ------------------------------


async def test_calls_queued_after_another_worker_ended_the_rollout_are_refused(database_url):
    # A worker's rollout (fenced: it has a check) whose lease ran out: another worker
    # records it as abandoned while the first one's calls are still queued. Those calls
    # expected the versions they would have had; none may land after the abandonment.
    from artstore.workers.worker import abandon_rollout

    def lease_holds(connection, event) -> None:  # the lease check itself is tested elsewhere
        return None

    async with (
        await artstore.open_store(database_url) as mine,
        await artstore.open_store(database_url) as other,
    ):
        with pytest.raises(WrongExpectedVersionError):
            async with mine.rollout(
                "agent", scenario={}, rollout_id="stale", check=lease_holds
            ) as rollout:
                await mine.flush()  # its start is stored
                assert await abandon_rollout(other, "stale", "its lease ran out")
                rollout.record_llm_call([HumanMessage("q1")], answer("a1"))
                rollout.record_llm_call([HumanMessage("q2")], answer("a2"))
                rollout.result = "too late"
        types = [e.type for e in await other.read_stream("rollout-stale")]
        assert types == ["rollout.started", "rollout.failed"]
        assert (await other.read_stream("rollout-stale"))[-1].decode().error_type == (
            "RolloutAbandoned"
        )
