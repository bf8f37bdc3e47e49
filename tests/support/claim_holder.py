"""A worker's process that stops inside a transaction on its claims.

    python tests/support/claim_holder.py URL RUN WORKER

Locks the rows of the slots WORKER holds in RUN, as its heartbeat's renewal does, prints
"locked" and sits idle inside the transaction (the test stops it with SIGSTOP, as a
debugger, a frozen machine or a bug would).
"""

from __future__ import annotations

import asyncio
import sys
import time

from sqlalchemy import select

import artstore
from artstore.schema.tables import rollout_claims
from artstore.workers import claims


async def main(url: str, run: str, worker: str) -> None:
    store = await artstore.open_store(url)

    async def hold(connection) -> None:
        held = select(rollout_claims.c.slot).where(
            rollout_claims.c.run == run, rollout_claims.c.worker == worker
        )
        assert (await connection.execute(held.with_for_update())).all()
        print("locked", flush=True)
        time.sleep(3600)  # idle in the transaction, holding the rows

    await claims.claims_transaction(store.database, hold)


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:4]))
