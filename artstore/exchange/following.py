"""A run's rollouts as they end (finish or fail), each once, read from the event log.

`ended_rollouts(store, run)` yields the run's rollouts that have already ended, then keeps
reading the log and yields each rollout that ends later, in batches, until `stop` is set.
It only reads: a store opened read-only serves it.

Where it stands is an event position: every batch carries one, and once the batch is
handled every rollout of the run whose end event lies at or below it has been yielded.
Started again `after=` that position, it yields only the rollouts that ended later (no
catch-up). The log is read by position, up to the position readers may read
(`EventStore.read_all`), so that an append committing out of position order on
PostgreSQL is never skipped.

How it learns that something ended: it looks at the highest readable position every
`poll_s` seconds (at most `SQLITE_POLL_S` on SQLite), and reads the new end events only
when that moved. On PostgreSQL it also listens on the run's channel
(`artstore.workers.notify`), so a group sealed or a group's last rollout ended wakes it at
once; SQLite has no notifications and is only polled.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sqlalchemy import select

from artstore.errors import NotFoundError
from artstore.events import RolloutFailed, RolloutFinished
from artstore.schema import tables as t
from artstore.workers.notify import Wakeups

if TYPE_CHECKING:
    from artstore.store import Store

END_TYPES = (RolloutFinished.type, RolloutFailed.type)
POLL_S = 0.5  # how long a follower waits for news before looking at the log again
CATCH_UP_BATCH = 500  # rollouts per batch of those that had ended before the follower began


@dataclass
class EndedRollouts:
    """Rollouts of the run that ended, and the position they bring the follower to."""

    rollouts: dict[str, str | None]  # rollout id -> its group id (None: no group), in order
    position: int  # every rollout that ended at or below it has been yielded with this batch


async def ended_rollouts(
    store: Store,
    run: str,
    *,
    after: int | None = None,
    stop: asyncio.Event | None = None,
    poll_s: float = POLL_S,
) -> AsyncIterator[EndedRollouts]:
    """Each rollout of `run` once, as it ends: those that had ended first (unless `after`
    names a position: then only those that end after it), until `stop` is set.

    A batch may hold no rollout: the log moved on (other runs' events, this run's other
    events) and its position says how far."""
    stop = stop or asyncio.Event()
    await _check_run(store, run)
    yielded: set[str] = set()
    async with Wakeups(store.database, run) as wakeups:  # listening before the first look
        position = await store.last_position()
        if after is None:
            async for batch in _ended_before(store, run, position):
                if stop.is_set():
                    return
                yielded.update(batch.rollouts)
                yield batch
        else:
            position = after
        while not stop.is_set():
            batch = await _ended_since(store, run, position)
            batch.rollouts = {r: g for r, g in batch.rollouts.items() if r not in yielded}
            if batch.rollouts or batch.position > position:
                position = batch.position
                yielded.update(batch.rollouts)
                yield batch
            await _pause(wakeups, stop, poll_s)


async def _check_run(store: Store, run: str) -> None:
    async with store.database.read() as connection:
        found = await connection.execute(select(t.runs.c.run).where(t.runs.c.run == run))
        if found.first() is None:
            raise NotFoundError(f"no run {run!r} in this store (see `artstore runs`)")


async def _ended_before(store: Store, run: str, position: int) -> AsyncIterator[EndedRollouts]:
    """The rollouts of `run` that have ended (at `position` or a little later), in the
    order they started; the last batch (an empty one when none has) carries `position`,
    the others 0."""
    query = (
        select(t.rollouts.c.rollout_id, t.rollouts.c.group_id)
        .where(t.rollouts.c.run == run, t.rollouts.c.status.in_(("finished", "failed")))
        .order_by(t.rollouts.c.started_at, t.rollouts.c.rollout_id)
    )
    async with store.database.read() as connection:
        ended = {row.rollout_id: row.group_id for row in await connection.execute(query)}
    ids = list(ended)
    if not ids:
        yield EndedRollouts({}, position)
    for start in range(0, len(ids), CATCH_UP_BATCH):
        chunk = ids[start : start + CATCH_UP_BATCH]
        last = start + CATCH_UP_BATCH >= len(ids)
        yield EndedRollouts({rid: ended[rid] for rid in chunk}, position if last else 0)


async def _ended_since(store: Store, run: str, position: int) -> EndedRollouts:
    """The rollouts of `run` whose end event lies after `position`, in the log's order."""
    upto = await store.last_position()
    if upto <= position:
        return EndedRollouts({}, position)
    ended: list[str] = []
    async for recorded in store.iter_all(position, types=END_TYPES):
        ended.append(recorded.data["rollout_id"])
        upto = max(upto, recorded.position)
    return EndedRollouts(await _of_run(store, run, ended), upto)


async def _of_run(store: Store, run: str, rollout_ids: list[str]) -> dict[str, str | None]:
    """Those of `rollout_ids` that belong to `run`, with their groups, in the given order."""
    groups: dict[str, str | None] = {}
    async with store.database.read() as connection:
        for start in range(0, len(rollout_ids), 500):
            query = select(t.rollouts.c.rollout_id, t.rollouts.c.group_id).where(
                t.rollouts.c.run == run,
                t.rollouts.c.rollout_id.in_(rollout_ids[start : start + 500]),
            )
            for row in await connection.execute(query):
                groups[row.rollout_id] = row.group_id
    return {rid: groups[rid] for rid in rollout_ids if rid in groups}


async def _pause(wakeups: Wakeups, stop: asyncio.Event, seconds: float) -> None:
    """Until a notification of the run, `stop`, or `seconds`, whichever comes first."""
    waiting = asyncio.ensure_future(wakeups.wait(seconds))
    stopping = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({waiting, stopping}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (waiting, stopping):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
