"""Waking up when a run changes: PostgreSQL's LISTEN/NOTIFY, with a timeout as a safety net.

Every run has a channel (`run_channel`). What is announced there, and by whom:

- `sealed`: a group of the run was sealed (a trigger on the event log, whichever process
  sealed it; migration 0005);
- `sealable`: a group's last rollout ended, its seal can be claimed (workers);
- `work`: rollouts can be claimed (the trainer published work or moved on; a worker gave
  a claim back);
- `failed`: a group could not be sealed (workers);
- `closed`: the run's trainer finished or failed.

A notification is a hint to look at the database again, never the data itself: it is
sent when its transaction commits, and one missed while a connection was down is made
up for by the re-check that every wakeup triggers (a lost listening connection counts as
a wakeup). SQLite has no notifications: there, `Wakeups.wait` sleeps a short while, and
callers re-check as they would after a notification.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
from typing import TYPE_CHECKING, Any

from sqlalchemy import func, select

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection
    from sqlalchemy.ext.asyncio import AsyncConnection

    from artstore.eventstore.database import Database

log = logging.getLogger("artstore.workers")

# How often a waiter on SQLite looks again (it has no notifications).
SQLITE_POLL_S = 0.25


def run_channel(run: str) -> str:
    """The notification channel of `run` (the 0005 migration's trigger computes the same)."""
    digest = hashlib.md5(run.encode(), usedforsecurity=False).hexdigest()
    return f"artstore_{digest[:16]}"


def notify_sync(connection: Connection, run: str, what: str) -> None:
    """Announce `what` on the run's channel when the caller's transaction commits."""
    connection.execute(select(func.pg_notify(run_channel(run), what)))


async def notify(connection: AsyncConnection, run: str, what: str) -> None:
    await connection.execute(select(func.pg_notify(run_channel(run), what)))


class Wakeups:
    """What was announced on a run's channel, on a connection of its own.

    `async with Wakeups(database, run) as wakeups:` listens from the start of the block (so
    nothing announced after a check made inside it is missed); `await wakeups.wait(timeout)`
    returns what was announced since the last wait, or an empty list after `timeout`
    seconds. `poke()` wakes the waiter from this process (a task of ours finished).
    """

    def __init__(self, database: Database, run: str) -> None:
        self.database = database
        self.run = run
        self.channel = run_channel(run)
        self._connection: Any = None  # asyncpg's, outside the store's pool
        self._received: list[str] = []
        self._event = asyncio.Event()
        self._lost = False
        self.reconnects = 0

    @property
    def listens(self) -> bool:
        return self.database.many_machines

    async def __aenter__(self) -> Wakeups:
        if self.listens:
            await self._listen()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    def poke(self, what: str = "poke") -> None:
        self._received.append(what)
        self._event.set()

    async def wait(self, timeout: float) -> list[str]:
        """What was announced since the last call; waits up to `timeout` s for something."""
        if not self.listens:
            if not self._received:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._event.wait(), min(timeout, SQLITE_POLL_S))
            return self._take()
        if self._lost:
            await self._reconnect()
            return [*self._take(), "reconnected"]
        if not self._received:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._event.wait(), max(0.0, timeout))
        if self._lost:
            await self._reconnect()
            return [*self._take(), "reconnected"]
        return self._take()

    def _take(self) -> list[str]:
        received, self._received = self._received, []
        self._event.clear()
        return received

    async def close(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(connection.close(), 5)

    # --- the listening connection -----------------------------------------------------

    async def _listen(self) -> None:
        self._connection = await self.database.listen(
            self.channel, self._on_notification, self._on_termination
        )
        self._lost = False

    def _on_notification(self, _connection: Any, _pid: int, _channel: str, payload: str) -> None:
        self._received.append(payload)
        self._event.set()

    def _on_termination(self, _connection: Any) -> None:
        self._lost = True
        self._event.set()

    async def _reconnect(self) -> None:
        """Listen again on a new connection, waiting for the database if it is down."""
        await self.close()
        delay = 0.1
        while True:
            try:
                await self._listen()
                self.reconnects += 1
                return
            except Exception as exc:  # any driver or socket error: the database is away
                log.warning("listening for run %s: cannot reconnect (%s); retrying", self.run, exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)
