"""No command fails because the machine is slow: what waits, waits as long as it takes.

A pooled connection is waited for as long as the process's other work holds them all (a
re-scoring of many groups whose judge is slow, while every connection is held by other
work for longer than SQLAlchemy's default deadline); a SQLite write waits for another
connection's write lock for as long as it is held; and a pool that does give up (one
configured with a deadline) says so, never that the database is out of reach.
"""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from mixed_run import RUN, record_interleaved
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import create_async_engine

import artstore
from artstore.errors import DatabaseUnavailableError, PoolTimeoutError
from artstore.events import RunFinished
from artstore.eventstore import sqlite as sqlite_module
from artstore.schema import tables as t


async def first_of(condition: asyncio.Event, task: asyncio.Task) -> None:
    """Wait until `condition` is set; if `task` ends first, its error is raised."""
    waiting = asyncio.ensure_future(condition.wait())
    await asyncio.wait({waiting, task}, return_when=asyncio.FIRST_COMPLETED)
    if not waiting.done():
        waiting.cancel()
        task.result()  # raises what stopped it
        raise AssertionError("the task ended before the condition was met")


async def test_a_pool_that_gives_up_says_so_and_not_that_the_database_is_unreachable(store):
    engine = create_async_engine(
        store.database.url.set(query={}), pool_size=1, max_overflow=0, pool_timeout=0.1
    )
    held = await engine.connect()
    try:
        with pytest.raises(PoolTimeoutError) as raised:
            await store.database.open_connection(engine)
    finally:
        await held.close()
        await engine.dispose()

    message = str(raised.value)
    assert "cannot reach" not in message
    assert message.startswith(
        f"waited 0.1 s for one of this process's 1 connections to the database at "
        f"{store.database.display_url}: all were in use by its other work"
    )
    assert isinstance(raised.value, DatabaseUnavailableError)  # a retry may still succeed


async def test_a_rescore_with_a_slow_judge_completes_while_other_work_holds_every_connection(
    store,
):
    group_ids = await record_interleaved(store, seed=7, groups=8, size=2)
    engine = store.database.read_engine
    pool: Any = engine.pool
    in_judge, everyone_in, go = 0, asyncio.Event(), asyncio.Event()

    async def slow_judge(scenario, results, trajectories):
        nonlocal in_judge
        in_judge += 1
        if in_judge == len(group_ids):
            everyone_in.set()
        await go.wait()
        return [0.5] * len(trajectories)

    # Other work of this process holds every connection of the pool...
    held = [await engine.connect() for _ in range(pool.size() + pool._max_overflow)]
    rescoring = asyncio.create_task(
        artstore.rescore(store, RUN, slow_judge, "slow", concurrency=len(group_ids))
    )
    # ...for longer than any deadline the pool has (SQLAlchemy's default: 30 s).
    if pool.timeout() is not None:
        await asyncio.sleep(pool.timeout() + 1)
    for connection in held:
        await connection.close()

    await first_of(everyone_in, rescoring)  # every group waits for the judge at once...
    assert pool.checkedout() == 0  # ...and none holds a connection meanwhile
    go.set()
    assert await rescoring == group_ids
    async with store.database.read() as connection:
        per_rollout = await connection.execute(
            select(func.count())
            .select_from(t.rewards)
            .where(t.rewards.c.scorer == "slow")
            .group_by(t.rewards.c.rollout_id)
        )
        assert per_rollout.scalars().all() == [1] * (2 * len(group_ids))


async def test_a_sqlite_write_waits_for_the_write_lock_as_long_as_another_holds_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """SQLite is told to wait 0.2 s at a time, and another connection holds the file's
    write lock for several of those: the append waits it out, however long."""
    monkeypatch.setattr(sqlite_module, "SQLITE_BUSY_TIMEOUT_S", 0.2)
    busy = 0
    is_busy = sqlite_module.is_busy

    def counting(exc: BaseException) -> bool:
        nonlocal busy
        found = is_busy(exc)
        busy += found
        return found

    monkeypatch.setattr(sqlite_module, "is_busy", counting)
    path = tmp_path / "store.db"
    async with await artstore.open_store(f"sqlite:///{path}") as store:
        holder = sqlite3.connect(path, isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")
        try:
            appending = asyncio.create_task(store.append("run-x", [RunFinished(run="x")]))
            # The writer finds the file busy, waits, and tries again: more often than all
            # of its ways of writing a batch (whole, in savepoints, one by one) try once.
            while busy < 20:
                if appending.done():
                    appending.result()  # raises what stopped it
                    raise AssertionError("appended while another held the write lock")
                await asyncio.sleep(0.05)
        finally:
            holder.execute("ROLLBACK")
            holder.close()
        assert (await appending).written
