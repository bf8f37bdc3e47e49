"""One trainer per run: a second trainer started on the same run gets a clear error.

The lease is a lock the operating system or the database releases when the process dies
(SIGKILL included), so a crashed trainer never blocks its own resume:
- PostgreSQL: a session-level advisory lock held on a dedicated connection;
- SQLite: an exclusive `flock` on a file beside the database.

`trainers_gone` tells, without taking any lock, which runs recorded as running have lost
their trainer (`artstore runs` shows them as `stale`).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import socket
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from pathlib import Path

from sqlalchemy import text

from artstore.errors import TrainerConflictError
from artstore.eventstore.database import Database


def _lock_key(model: str) -> int:
    digest = hashlib.sha256(f"artstore-trainer:{model}".encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1  # a positive bigint


def _conflict(run: str, model: str) -> TrainerConflictError:
    return TrainerConflictError(
        f"{model} is being trained by another process, so run {run!r} cannot train it now: "
        "one trainer per model at a time. Wait for it to finish or stop it (a crashed "
        "trainer releases the model by itself)"
    )


@asynccontextmanager
async def trainer_lease(database: Database, run: str, model: str) -> AsyncIterator[None]:
    """Hold the trained model for this process, or raise TrainerConflictError at once.

    One trainer per model: its steps and their reconciliation after a crash depend on
    nobody else moving the model's step. Training model B on run A's groups (a replay)
    does not conflict with A's trainer; a replay into A's own model does.
    """
    key = _lock_key(model)
    if database.dialect == "postgresql":
        async with database.write_engine.connect() as connection:
            got = (await connection.execute(text(f"SELECT pg_try_advisory_lock({key})"))).scalar()
            await connection.commit()
            if not got:
                raise _conflict(run, model)
            try:
                yield
            finally:
                try:
                    await connection.execute(text(f"SELECT pg_advisory_unlock({key})"))
                    await connection.commit()
                except Exception:
                    # Never hand a connection that may still hold the lock back to the
                    # pool: closing it makes the server release the lock.
                    await connection.invalidate()
        return
    database_file = Path(database.url.database or "artstore.db")
    lock_path = database_file.with_name(f"{database_file.name}.run-{key:x}.lock")
    handle = os.open(lock_path, os.O_CREAT | os.O_RDWR, 0o644)
    try:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise _conflict(run, model) from None
        yield
    finally:
        os.close(handle)  # closing releases the lock


async def trainers_gone(
    database: Database, runs: Iterable[tuple[str, str, str | None]]
) -> set[str]:
    """Which of `runs`, given as (run, "project/model", trainer "host:pid"), have no live
    trainer. Only a lock-free look: a starting trainer is never disturbed.

    PostgreSQL: no session holds the model's trainer lock (on any host). SQLite: the
    trainer ran on this host and its process is gone (a trainer on another host is
    presumed alive: this host cannot see its processes).
    """
    runs = list(runs)
    if not runs:
        return set()
    if database.dialect == "postgresql":
        async with database.read() as connection:
            held = {
                (row.classid << 32) | row.objid
                for row in await connection.execute(
                    text(
                        "SELECT classid::bigint AS classid, objid::bigint AS objid FROM pg_locks "
                        "WHERE locktype = 'advisory' AND objsubid = 1 AND granted"
                    )
                )
            }
        return {run for run, model, _ in runs if _lock_key(model) not in held}
    return {run for run, _, trainer in runs if _process_gone(trainer)}


def _process_gone(trainer: str | None) -> bool:
    """True when `trainer` ("host:pid") names a process of this host that no longer runs."""
    host, _, pid = (trainer or "").rpartition(":")
    if host != socket.gethostname() or not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)  # signal 0: only asks whether the process exists
    except ProcessLookupError:
        return True
    except PermissionError:  # it exists, under another user
        return False
    return False
