"""A process that takes the store's append lock and keeps its transaction open.

    python tests/support/lock_holder.py URL

Prints "locked" once it holds the lock, then sits idle inside the transaction (the test
stops it with SIGSTOP, as a debugger, a swapped-out machine or a bug would).
"""

from __future__ import annotations

import asyncio
import sys
import time

import artstore


async def main(url: str) -> None:
    store = await artstore.open_store(url)
    async with store.database.write() as connection:
        await connection.run_sync(store.database.lock_appends)
        print("locked", flush=True)
        time.sleep(3600)  # idle in the transaction, holding the lock


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
