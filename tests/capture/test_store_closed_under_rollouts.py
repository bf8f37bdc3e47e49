"""A store closed while rollout blocks are still running leaves none `running`.

ART's `gather_trajectory_groups` raises once `max_exceptions` is exceeded while sibling
rollouts are still waiting for their LLM calls; the loop's `async with open_store(...)`
then closes the store before those tasks are cancelled. The requests those rollouts sent
were received (and paid for): each is recorded, as a call abandoned before its response,
and each rollout as failed, before the store closes.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import openai
from sqlalchemy import text

import artstore
from artstore.testing.inference_server import LocalInferenceServer


class Held:
    """A policy that answers only once released: the request stays in flight."""

    def __init__(self) -> None:
        self.arrived = threading.Event()
        self.release = threading.Event()

    def __call__(self, request: Any, n: int) -> str:
        self.arrived.set()
        self.release.wait(timeout=120)
        return "late answer"


async def close_under_a_waiting_call(url: str, server: LocalInferenceServer, held: Held) -> None:
    store = await artstore.open_store(url)
    client = openai.AsyncOpenAI(base_url=server.base_url, api_key=server.api_key, max_retries=0)

    async def rollout() -> None:
        async with store.rollout("agent", scenario={"q": 1}, run="closing"):
            messages = [{"role": "user", "content": "hello"}]
            await client.chat.completions.create(model="test-model", messages=messages)

    task = asyncio.create_task(rollout())
    await asyncio.to_thread(held.arrived.wait, 60)
    await store.close()
    task.cancel()
    held.release.set()
    await asyncio.gather(task, return_exceptions=True)


def test_closing_the_store_fails_its_running_rollouts_and_records_their_calls(
    database_url: str,
) -> None:
    held = Held()
    with LocalInferenceServer(held) as server:
        asyncio.run(close_under_a_waiting_call(database_url, server, held))
        assert len(server.requests) == 1

    async def read() -> tuple[list[Any], list[Any]]:
        async with await artstore.open_store(database_url) as store:
            async with store.database.read() as connection:
                rollouts = (await connection.execute(text("SELECT status FROM v_rollouts"))).all()
                calls = (
                    await connection.execute(
                        text("SELECT error_type, num_input_messages FROM v_llm_calls")
                    )
                ).all()
            failed = await store.read_all(types=["rollout.failed"])
        assert [e.data["error_type"] for e in failed] == ["StoreClosedError"]
        return rollouts, calls

    rollouts, calls = asyncio.run(read())
    assert [tuple(r) for r in rollouts] == [("failed",)]
    assert [tuple(c) for c in calls] == [("CallAbandonedError", 1)]
