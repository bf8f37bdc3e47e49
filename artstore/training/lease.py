"""One trainer per model: a second trainer of the same model gets a clear error at once.

The lease is a lock that the database or the operating system releases when the process
dies (SIGKILL included), so a crashed trainer never blocks its own resume: a session
advisory lock on PostgreSQL, an exclusive `flock` on a file beside a SQLite database
(`Database.try_lock`).

`trainers_gone` tells, without taking any lock, which runs recorded as running have lost
their trainer: `artstore runs` and the viewer show them as `stale`.
"""

from __future__ import annotations

import os
import socket
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager

from artstore.errors import TrainerConflictError
from artstore.eventstore.database import Database


def lock_name(model: str) -> str:
    """The name of the lock a trainer of `model` ("project/name") holds."""
    return f"artstore-trainer:{model}"


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
    async with database.try_lock(lock_name(model)) as held:
        if not held:
            raise _conflict(run, model)
        yield


async def trainers_gone(
    database: Database, runs: Iterable[tuple[str, str, str | None]]
) -> set[str]:
    """Which of `runs`, given as (run, "project/model", trainer "host:pid"), have lost
    their trainer. A look that takes no lock, so a trainer starting now is never refused.

    Gone: nobody holds the model's trainer lock (`Database.lock_held`) and the trainer is
    not a live process of this host. When the database cannot tell who holds its locks,
    only the second half counts: a trainer on another host is then presumed alive.
    """
    gone = set()
    for run, model, trainer in runs:
        held = await database.lock_held(lock_name(model))
        if held:
            continue
        alive = _process_alive(trainer)
        if alive is False or (held is False and alive is None):
            gone.add(run)
    return gone


def trainer_id() -> str:
    """This process, as a run's and a train step's `trainer`: "host:pid"."""
    return f"{socket.gethostname()}:{os.getpid()}"


def _process_alive(trainer: str | None) -> bool | None:
    """Whether `trainer` ("host:pid") is a running process of this host (None: another
    host's, or not a host:pid at all: this host cannot tell)."""
    host, _, pid = (trainer or "").rpartition(":")
    if host != socket.gethostname() or not pid.isdigit():
        return None
    try:
        os.kill(int(pid), 0)  # signal 0 asks whether the process exists, and sends nothing
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, run by another user
        return True
    return True
