"""What the capture tests share: models served by the local inference server, and a tool.

The models talk to a LocalInferenceServer over real HTTP; the trainable one is registered
with CheckOnlyBackend, so `model.openai_client()` is ART's own client, as in training.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import art
from sqlalchemy import select

from artstore.art_versions import trainable_model
from artstore.backends.check_only import CheckOnlyBackend
from artstore.schema import tables as t
from artstore.testing.inference_server import LocalInferenceServer

# Neither the tool's keys nor its parameters are in alphabetical order: a store that sorted
# them would be caught.
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"zone": {"type": "string"}, "city": {"type": "string"}},
            "required": ["zone", "city"],
        },
        "description": "The weather in a city.",
    },
}


def served_model(server: LocalInferenceServer, name: str = "agent") -> art.Model:
    """A plain `art.Model` whose inference is the local server."""
    return art.Model(
        name=name,
        project="tests",
        inference_base_url=server.base_url,
        inference_api_key=server.api_key,
        inference_model_name="test-model",
    )


async def served_trainable_model(
    server: LocalInferenceServer, tmp_path: Path, name: str = "agent"
) -> tuple[Any, CheckOnlyBackend]:
    """A trainable model registered with CheckOnlyBackend under `tmp_path`, and the backend."""
    model = trainable_model(name=name, project="tests", base_model="Qwen/Qwen2.5-0.5B-Instruct")
    backend = CheckOnlyBackend(
        path=tmp_path / ".art", inference_base_url=server.base_url, inference_api_key=server.api_key
    )
    await model.register(backend)
    return model, backend


async def events_of(store: Any, rollout_id: str) -> list[Any]:
    """The rollout's events, decoded."""
    return [e.decode() for e in await store.read_stream(f"rollout-{rollout_id}")]


async def calls_of(store: Any, rollout_id: str) -> list[Any]:
    """The rollout's `llm.call` events, and checks that its projection holds each once.

    A call recorded twice (from HTTP, then by a LangChain chat model's logger, whose record
    names the first in `supersedes`) counts once: as its later record, as `v_llm_calls`."""
    events = [e for e in await events_of(store, rollout_id) if e.type == "llm.call"]
    superseded = {e.supersedes for e in events if e.supersedes}
    calls = [e for e in events if e.call_id not in superseded]
    async with store.database.read() as connection:
        indexes = await connection.execute(
            select(t.llm_calls.c.call_index).where(t.llm_calls.c.rollout_id == rollout_id)
        )
        projected = sorted(indexes.scalars())
    assert projected == [c.index for c in calls], (projected, [c.index for c in calls])
    return calls


async def recorded_and_received(store: Any, *servers: LocalInferenceServer) -> tuple[list, list]:
    """(the calls `v_llm_calls` holds, the calls the servers received), comparable.

    Each call is its number of input messages, sorted: a call recorded twice and another
    never recorded differ from the requests, not only in number. Every request a server
    authenticated counts, failed ones included (they are recorded too).
    """
    from sqlalchemy import text

    async with store.database.read() as connection:
        rows = await connection.execute(text("SELECT num_input_messages FROM v_llm_calls"))
        recorded = sorted(row.num_input_messages for row in rows)
    received = sorted(len(r["messages"]) for server in servers for r in server.requests)
    return recorded, received


async def assert_each_call_recorded_once(store: Any, *servers: LocalInferenceServer) -> None:
    """`v_llm_calls` holds exactly the calls the inference servers received, each once."""
    recorded, received = await recorded_and_received(store, *servers)
    assert recorded == received, f"v_llm_calls holds {recorded}, the servers got {received}"
