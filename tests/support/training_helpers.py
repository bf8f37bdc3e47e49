"""What the training tests share: real agents, a real model on CheckOnlyBackend, and checks.

Agents call the LocalInferenceServer over HTTP through ART's own
`art.langgraph.init_chat_model` (so every call is a trainable Choice with logprobs); the
trained model is a real `art.TrainableModel` registered with CheckOnlyBackend.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import art
from langchain_core.tools import tool
from sqlalchemy import select

from artstore.backends import CheckOnlyBackend
from artstore.events import GroupSealed, RewardsRecorded
from artstore.schema import tables as t
from artstore.testing.inference_server import LocalInferenceServer

PROJECT = "trainer-test"
# The lookup tool as an OpenAI client sends it, for agents that call `model.openai_client()`.
LOOKUP_TOOL = {
    "type": "function",
    "function": {
        "name": "lookup",
        "description": "Look up a fact.",
        "parameters": {
            "type": "object",
            "properties": {"query": {"type": "string"}},
            "required": ["query"],
        },
    },
}


@tool
def lookup(query: str) -> str:
    """Look up a fact about the query."""
    return f"a fact about {query}"


def react_agent():
    """A real LangGraph ReAct agent on ART's chat model, the kind TrainingFramework runs."""
    from art.langgraph import init_chat_model

    with warnings.catch_warnings():  # create_react_agent is deprecated in LangGraph 1.x
        warnings.simplefilter("ignore")
        from langgraph.prebuilt import create_react_agent

        return create_react_agent(init_chat_model().bind_tools([lookup]), [lookup])


async def langgraph_agent(scenario: dict[str, Any], thread_id: str) -> str:
    """The agent shape TrainingFramework calls: `(scenario, thread_id) -> result`."""
    state = await react_agent().ainvoke({"messages": [("user", scenario["question"])]})
    return state["messages"][-1].content


async def scripted_agent(scenario: dict[str, Any], thread_id: str) -> str:
    """One LLM call, no graph: the quickest agent that still yields a trainable trajectory."""
    from art.langgraph import init_chat_model

    reply = await init_chat_model().ainvoke([("user", scenario["question"])])
    return reply.content


def length_reward(scenario: Any, results: list[Any], trajectories: list[Any]) -> list[float]:
    """Deterministic rewards with some spread (the server varies answers across a group)."""
    return [float(len(str(result)) % 5) for result in results]


def scenarios(n: int) -> list[dict[str, Any]]:
    return [{"question": f"What is fact number {i}?", "id": i} for i in range(n)]


async def trainable_model(
    tmp_path: Path,
    server: LocalInferenceServer,
    *,
    name: str = "agent",
    push_dir: Path | None = None,
    backend_class: type[CheckOnlyBackend] = CheckOnlyBackend,
) -> tuple[art.TrainableModel, CheckOnlyBackend]:
    backend = backend_class(
        path=tmp_path / "art",
        inference_base_url=server.base_url,
        inference_api_key=server.api_key,
        push_dir=push_dir,
    )
    model = art.TrainableModel(
        name=name, run_name=name, project=PROJECT, base_model="test-base-model"
    )
    await model.register(backend)
    return model, backend


def validation_model(server: LocalInferenceServer) -> art.Model:
    return art.Model(
        name="validator",
        project=PROJECT,
        inference_base_url=server.base_url,
        inference_api_key=server.api_key,
        inference_model_name="test-model",
    )


async def rows(store: Any, table: Any, *where: Any) -> list[Any]:
    async with store.database.read() as connection:
        return list((await connection.execute(select(table).where(*where))).all())


async def projections(store: Any) -> dict[str, list[tuple]]:
    """Every projection row, order-free, without surrogate ids: a reference to a train
    step's id is shown as the step it names (run, model, step_before). (A rebuild gives
    the ids back as they were; tests/projections/test_deterministic_projections.py compares
    them.)"""
    found = {}
    steps = t.train_steps
    for table in t.PROJECTION_TABLES:
        columns = [c for c in table.columns if c.name not in ("id", "train_step_id")]
        query = select(*columns)
        if "train_step_id" in table.c:
            step = (steps.c.run, steps.c.model, steps.c.step_before)
            query = query.add_columns(*step).join(steps, steps.c.id == table.c.train_step_id)
        async with store.database.read() as connection:
            result = await connection.execute(query)
            found[table.name] = sorted((tuple(map(repr, row)) for row in result), key=repr)
    return found


async def assert_consistent(store: Any) -> None:
    """Projections equal a rebuild from the events, and no group is half-written."""
    await store.flush()
    before = await projections(store)
    await store.rebuild_projections()
    assert await projections(store) == before
    async with store.database.read() as connection:
        streams = (
            await connection.execute(
                select(t.events.c.stream_id, t.events.c.type)
                .where(t.events.c.stream_id.like("group-%"))
                .order_by(t.events.c.position)
            )
        ).all()
    types: dict[str, list[str]] = {}
    for stream_id, type_name in streams:
        types.setdefault(stream_id, []).append(type_name)
    for stream_id, found in types.items():
        # A group stream starts with its rewards and seal, written together (re-scoring
        # may add rewards after them).
        assert found[:2] == [RewardsRecorded.type, GroupSealed.type], (stream_id, found)
