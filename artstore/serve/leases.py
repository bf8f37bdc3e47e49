"""Leases of served rollouts: a server killed outright leaves no rollout running for long.

Each rollout a server process serves is leased to it (`api_tokens.lease_expires_at` of
the rollout's token); the process renews the leases of its open rollouts every third of
the lease. Every server process also sweeps: a rollout still running whose lease expired
(its server was killed, or lost the database for longer than a lease) is recorded as
failed (`RolloutAbandoned`, `artstore.groups.abandon_rollouts`), appended at the stream's
version it read, so a server that is alive after all and appended meanwhile wins, and its
token dies.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Collection
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from sqlalchemy import select, update

from artstore.errors import ArtstoreError
from artstore.groups import abandon_rollouts
from artstore.schema import tables as t
from artstore.serve.tokens import end_rollout_tokens

if TYPE_CHECKING:
    from artstore.store import Store

logger = logging.getLogger(__name__)

DEFAULT_LEASE_S = 60.0
_tokens = t.api_tokens


async def renew(store: Store, token_hashes: Collection[str], lease_s: float) -> None:
    if not token_hashes:
        return
    until = datetime.now(UTC) + timedelta(seconds=lease_s)

    async def work(connection) -> None:
        await connection.execute(
            update(_tokens)
            .where(_tokens.c.token_hash.in_(list(token_hashes)), _tokens.c.ended_at.is_(None))
            .values(lease_expires_at=until)
        )

    await store.database.run_write(work)


async def sweep(store: Store) -> list[str]:
    """Record the running rollouts whose lease expired as abandoned; their ids."""
    now = datetime.now(UTC)
    query = (
        select(_tokens.c.rollout_id)
        .select_from(_tokens.join(t.rollouts, t.rollouts.c.rollout_id == _tokens.c.rollout_id))
        .where(
            _tokens.c.kind == "rollout",
            _tokens.c.ended_at.is_(None),
            _tokens.c.lease_expires_at < now,
            t.rollouts.c.status == "running",
        )
    )
    async with store.database.read() as connection:
        expired = (await connection.execute(query)).scalars().all()
    abandoned = []
    for rollout_id in expired:
        try:
            await abandon_rollouts(
                store,
                [rollout_id],
                "the server serving this rollout stopped answering for it (killed, or cut "
                "off from the database) before the rollout ended",
            )
        except ArtstoreError:  # its stream moved: its server is alive and recorded on
            continue
        await end_rollout_tokens(store, rollout_id)
        abandoned.append(rollout_id)
    return abandoned


async def keep(store: Store, open_tokens: dict, lease_s: float) -> None:
    """Renew this process's leases and sweep others' expired ones, until cancelled."""
    while True:
        with contextlib.suppress(ArtstoreError, OSError):
            await renew(store, list(open_tokens), lease_s)
            found = await sweep(store)
            if found:
                logger.warning("recorded %d abandoned served rollouts as failed", len(found))
        await asyncio.sleep(lease_s / 3)
