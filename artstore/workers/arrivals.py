"""Waiting for sealed groups: the trainer's side of rollouts made elsewhere.

`wait_for_groups(store, run, model, n)` returns the sealed groups of a run that a model
has not consumed yet, as soon as there are `n` of them; `sealed_groups(store, run,
model)` yields them one by one as they are sealed. Whoever sealed them (rollout workers
on other hosts, an in-process training loop, a loop of the user's own), the store is the
truth: a wakeup only says "look again". On PostgreSQL a wakeup is a notification of the
run's channel (a trigger announces every `group.sealed`); on SQLite, which has no
notifications, the waiter looks again every quarter of a second.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from sqlalchemy import exists, select

from artstore.art_versions import model_key
from artstore.schema import tables as t
from artstore.workers.notify import Wakeups

if TYPE_CHECKING:
    from artstore.store import Store

# Longest wait between two looks at the database when no notification comes (a safety net
# for a notification lost with a connection).
SAFETY_NET_S = 5.0


def _key(model: Any) -> str:
    return model if isinstance(model, str) else model_key(model)


async def unconsumed_groups(store: Store, run: str, model: Any) -> list[str]:
    """The sealed groups of `run` that `model` (an ART model or "project/name") has not
    been trained on, in the order they were sealed."""
    consumed = exists().where(
        t.group_consumptions.c.group_id == t.groups.c.group_id,
        t.group_consumptions.c.model == _key(model),
    )
    query = (
        select(t.groups.c.group_id)
        .where(t.groups.c.run == run, ~consumed)
        .order_by(t.groups.c.position)
    )
    async with store.database.read() as connection:
        return [row.group_id for row in await connection.execute(query)]


async def wait_for_groups(
    store: Store, run: str, model: Any, n: int = 1, *, timeout: float | None = None
) -> list[str]:
    """Ids of the sealed groups of `run` not consumed by `model`, once there are `n`.

    Returns all of them (in seal order, possibly more than `n`) as soon as `n` are there;
    raises TimeoutError when `timeout` seconds pass first.
    """
    if n < 1:
        raise ValueError("n must be at least 1")
    loop = asyncio.get_running_loop()
    deadline = None if timeout is None else loop.time() + timeout
    async with Wakeups(store.database, run) as wakeups:  # listening before the first look
        while True:
            found = await unconsumed_groups(store, run, model)
            if len(found) >= n:
                return found
            left = SAFETY_NET_S if deadline is None else deadline - loop.time()
            if left <= 0:
                raise TimeoutError(
                    f"{len(found)} of the {n} sealed groups of run {run!r} that "
                    f"{_key(model)} waited for arrived within {timeout} s"
                )
            await wakeups.wait(min(left, SAFETY_NET_S))


async def sealed_groups(
    store: Store, run: str, model: Any, *, idle_timeout: float | None = None
) -> AsyncIterator[str]:
    """Each sealed, unconsumed group of `run` once, as it arrives (those already there first).

    Ends when `idle_timeout` seconds pass without a new group (never, when None).
    """
    loop = asyncio.get_running_loop()
    seen: set[str] = set()
    async with Wakeups(store.database, run) as wakeups:
        last_arrival = loop.time()
        while True:
            new = [g for g in await unconsumed_groups(store, run, model) if g not in seen]
            for group_id in new:
                seen.add(group_id)
                yield group_id
            if new:
                last_arrival = loop.time()
            left = SAFETY_NET_S
            if idle_timeout is not None:
                left = last_arrival + idle_timeout - loop.time()
                if left <= 0:
                    return
            await wakeups.wait(min(left, SAFETY_NET_S))
