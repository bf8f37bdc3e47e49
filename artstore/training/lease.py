"""One trainer per model: a second trainer of the same model gets a clear error at once.

The lease is a lock that the database or the operating system releases when the process
dies (SIGKILL included), so a crashed trainer never blocks its own resume: a session
advisory lock on PostgreSQL, an exclusive `flock` on a file beside a SQLite database
(`Database.try_lock`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from artstore.errors import TrainerConflictError
from artstore.eventstore.database import Database


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
    async with database.try_lock(f"artstore-trainer:{model}") as held:
        if not held:
            raise _conflict(run, model)
        yield
