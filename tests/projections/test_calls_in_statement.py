"""An LLM call appended alone to a rollout this process wrote: on PostgreSQL one statement
that commits by itself (its `llm_calls` row and its rollout's counters and totals in it),
on SQLite the writer's transaction. Either way the tables equal a rebuild of the
projections from the log; what only the projector writes (a call that supersedes another,
two calls of one rollout committed together) still goes to it, and a call id stored
already is refused as before. Both databases."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

import pytest
from sqlalchemy import select

from artstore.errors import AppendRefusedError
from artstore.events import LLMCall, RolloutStarted, new_id
from artstore.eventstore.records import NO_STREAM, PendingAppend
from artstore.schema import tables as t


def call(index: int, **fields: Any) -> LLMCall:
    return LLMCall(call_id=new_id(), index=index, input=[], started_at=datetime.now(UTC), **fields)


async def tables(store: Any) -> dict[str, list[tuple[str, ...]]]:
    """The rows of `llm_calls` and `rollouts`, each value as its repr (floats exactly)."""
    async with store.database.read() as connection:
        return {
            table.name: [
                tuple(map(repr, row))
                for row in await connection.execute(
                    select(table).order_by(*table.primary_key.columns)
                )
            ]
            for table in (t.llm_calls, t.rollouts)
        }


async def test_a_lone_call_is_one_statement_and_equals_a_rebuild(store) -> None:
    events = store.events
    started = datetime.now(UTC)
    streams = {}
    for name in ("a", "b"):
        rollout_id = new_id()
        streams[name] = f"rollout-{rollout_id}"
        begun = RolloutStarted(rollout_id=rollout_id, run="calls", model="m", started_at=started)
        await events.append(streams[name], [begun], NO_STREAM)
    before = events.single_statement_transactions

    first = call(
        0,
        model="m",
        prompt_tokens=10,
        completion_tokens=5,
        latency_s=0.1,
        finish_reason="tool_calls",
        tool_calls=[{"id": "1", "name": "look", "args": {"q": "a\x00b"}}],
        num_logprobs=3,
        source="http",
        endpoint="chat_completions",
        stream=True,
    )
    await events.append(streams["a"], [first], expected_version=1)
    failed = call(1, latency_s=0.2, error_type="APIError", error_message="boom\x00")
    await events.append(streams["a"], [failed], expected_version=2)
    await events.append(streams["b"], [call(0, latency_s=0.3, prompt_tokens=7)], expected_version=1)
    alone = events.single_statement_transactions - before
    assert alone == (3 if store.dialect == "postgresql" else 0)

    # Two calls of one rollout in one transaction: the projector adds their latencies one
    # at a time. A call that supersedes another: the projector sums its rollout again.
    together = [
        PendingAppend(streams["a"], [call(2, latency_s=0.7, prompt_tokens=1)], 3),
        PendingAppend(streams["a"], [call(3, latency_s=0.11)], 4),
    ]
    await asyncio.gather(*events.append_together_nowait(together))
    again = call(1, latency_s=0.25, prompt_tokens=2, supersedes=failed.call_id)
    await events.append(streams["a"], [again], expected_version=5)
    assert events.single_statement_transactions - before == alone

    with pytest.raises(AppendRefusedError):  # its call id is stored: the table refuses it
        await events.append(streams["b"], [call(1).model_copy(update={"call_id": first.call_id})])

    written = await tables(store)
    rollouts = {row[0]: row for row in written["rollouts"]}
    assert len(written["llm_calls"]) == 5  # the superseded one went
    columns = [c.name for c in t.rollouts.columns]
    b = rollouts[repr(streams["b"].removeprefix("rollout-"))]
    assert b[columns.index("num_llm_calls")] == "1"
    assert b[columns.index("prompt_tokens")] == "7"
    await store.rebuild_projections()
    assert await tables(store) == written
