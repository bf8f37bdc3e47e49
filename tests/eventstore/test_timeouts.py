"""PostgreSQL sessions have timeouts: a stopped process cannot freeze the others.

A real process takes the store's append lock and is stopped with SIGSTOP while it holds
it. The server ends its session once it has been idle in its transaction longer than
`idle_in_transaction_session_timeout`, which releases the lock, and the other writers go
on. Locks have no deadline by default (a holder that works is waited for, however slowly);
a `lock_timeout` set in the URL gives a clear error instead of a wait. The timeouts are
shortened here through the URL's libpq `options`.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from urllib.parse import quote

import pytest
from sqlalchemy import text
from waiting import eventually

import artstore
from artstore.errors import DatabaseUnavailableError
from artstore.events import RunFinished

HOLDER = Path(__file__).parents[1] / "support" / "lock_holder.py"


def with_options(url: str, **settings: str) -> str:
    options = " ".join(f"-c {name}={value}" for name, value in settings.items())
    return f"{url}?options={quote(options)}"


class StoppedHolder:
    """tests/support/lock_holder.py, holding the append lock, stopped with SIGSTOP."""

    def __init__(self, url: str) -> None:
        env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])}
        self.process = subprocess.Popen(
            [sys.executable, str(HOLDER), url], stdout=subprocess.PIPE, text=True, env=env
        )
        assert self.process.stdout is not None
        assert self.process.stdout.readline().strip() == "locked"
        os.kill(self.process.pid, signal.SIGSTOP)

    def end(self) -> None:
        self.process.kill()
        os.kill(self.process.pid, signal.SIGCONT)
        self.process.wait()


async def holders_of_the_append_lock(store) -> int:
    async with store.database.read() as connection:
        found = await connection.execute(
            text(
                "SELECT count(*) FROM pg_locks l JOIN pg_class c ON c.oid = l.relation "
                "WHERE c.relname = 'append_lock' AND l.granted AND l.mode = 'ExclusiveLock'"
            )
        )
        return found.scalar()


async def _no_holder(store) -> bool:
    return await holders_of_the_append_lock(store) == 0


async def test_a_stopped_lock_holder_is_ended_and_the_writers_go_on(postgres_url):
    url = with_options(postgres_url, idle_in_transaction_session_timeout="2s", lock_timeout="60s")
    async with await artstore.open_store(url) as store:
        holder = StoppedHolder(url)
        try:
            assert await holders_of_the_append_lock(store) == 1
            appended = await store.append("run-after", [RunFinished(run="after")])
            assert appended.written
            assert await holders_of_the_append_lock(store) == 0
        finally:
            holder.end()
        assert [e.decode().run for e in await store.read_all()] == ["after"]


async def test_a_writer_waits_no_longer_than_lock_timeout(postgres_url):
    url = with_options(postgres_url, lock_timeout="1s")  # the holder keeps the default idle
    async with await artstore.open_store(url) as store:
        holder = StoppedHolder(url)
        try:
            with pytest.raises(DatabaseUnavailableError, match="lock timeout"):
                await store.append("run-blocked", [RunFinished(run="blocked")])
        finally:
            holder.end()
        # The server notices the killed holder's connection and releases its lock.
        await eventually(
            lambda: _no_holder(store), "the killed holder's append lock to be released"
        )
        assert (await store.append("run-later", [RunFinished(run="later")])).written
        assert [e.decode().run for e in await store.read_all()] == ["later"]


async def test_every_session_has_its_timeouts(postgres_url):
    async with await artstore.open_store(postgres_url) as store:
        await store.append("run-x", [RunFinished(run="x")])  # the writer's connection exists
        async with store.database.read() as connection:
            settings = {
                name: (await connection.execute(text(f"SHOW {name}"))).scalar()
                for name in (
                    "lock_timeout",
                    "idle_in_transaction_session_timeout",
                    "statement_timeout",
                )
            }
            writer = await connection.execute(
                text(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                    "AND pid <> pg_backend_pid()"
                )
            )
            assert writer.scalar() >= 1
        async with store.database.writer_engine.connect() as connection:  # as the writer's
            shown = [
                (await connection.execute(text(f"SHOW {name}"))).scalar()
                for name in ("lock_timeout", "idle_in_transaction_session_timeout")
            ]
            assert shown == ["0", "15s"]
            assert (await connection.execute(text("SHOW statement_timeout"))).scalar() == "0"
    # A lock or a statement is waited for as long as it takes; a session idle in its
    # transaction is ended.
    assert settings == {
        "lock_timeout": "0",
        "idle_in_transaction_session_timeout": "10min",
        "statement_timeout": "0",
    }
    url = with_options(postgres_url, lock_timeout="5s")
    async with await artstore.open_store(url) as store:
        async with store.database.read() as connection:
            assert (await connection.execute(text("SHOW lock_timeout"))).scalar() == "5s"
