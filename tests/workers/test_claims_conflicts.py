"""A transaction on the claims that the server ends to break a deadlock is run again.

A worker's heartbeat, its claims and its trainer update the same claim rows, each in the
order its statement reaches them; PostgreSQL then breaks a deadlock by rolling one of
them back (SQLSTATE 40P01). That must cost a retry, never a worker.
"""

from __future__ import annotations

import asyncio

from sqlalchemy import text

import artstore
from artstore.workers.claims import claims_transaction


async def test_a_transaction_the_server_rolls_back_for_a_deadlock_is_run_again(
    postgres_url: str,
) -> None:
    attempts = {"a": 0, "b": 0}
    both_hold_their_first_lock = asyncio.Barrier(2)

    def locking(name: str, first: int, second: int):
        async def work(connection) -> str:
            attempts[name] += 1
            await connection.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": first})
            if attempts[name] == 1:  # the first attempts wait in a circle: a deadlock
                await both_hold_their_first_lock.wait()
            await connection.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": second})
            return name

        return work

    async with await artstore.open_store(postgres_url) as store:
        done = await asyncio.wait_for(
            asyncio.gather(
                claims_transaction(store.database, locking("a", 9_001, 9_002)),
                claims_transaction(store.database, locking("b", 9_002, 9_001)),
            ),
            timeout=120,
        )

    assert done == ["a", "b"]
    # The server rolled one of them back once; it was run again, and both committed.
    assert sorted(attempts.values()) == [1, 2]
