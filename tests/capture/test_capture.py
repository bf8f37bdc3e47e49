"""The rollout context: what it records, when it is durable, and that no secret is stored."""

from __future__ import annotations

import asyncio
import json
import warnings
from pathlib import Path
from typing import Any

import art
import pytest
from capture_helpers import served_model
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.tools import tool
from pydantic import BaseModel
from sqlalchemy import inspect, select, text

from artstore.capture.rollout import current_rollout
from artstore.documents import messages as lc
from artstore.errors import InvalidEventError, NoRolloutError
from artstore.langgraph import init_chat_model
from artstore.redaction import REDACTED, Redactor, redact_url, secrets_in_url
from artstore.schema import tables as t
from artstore.testing.inference_server import LocalInferenceServer, token_logprobs


def answer(text: str, **fields: Any) -> AIMessage:
    """An assistant message as langchain-openai returns it, with logprobs."""
    logprobs = {"content": token_logprobs(text), "refusal": None}
    metadata = {"logprobs": logprobs, "finish_reason": "stop", "model_name": "test-model"}
    return AIMessage(content=text, response_metadata=metadata, **fields)


def react_agent(model: Any, tools: list[Any]):
    with warnings.catch_warnings():  # create_react_agent is deprecated in LangGraph 1.x
        warnings.simplefilter("ignore")
        from langgraph.prebuilt import create_react_agent

        return create_react_agent(model, tools)


class Scenario(BaseModel):
    question: str


# --- the rollout context, for a loop of one's own ---------------------------------------------


async def test_own_loop_records_calls_and_result(store) -> None:
    system, user = SystemMessage("Be brief."), HumanMessage("2+2?")
    first = answer("", tool_calls=[{"id": "c1", "name": "add", "args": {"a": 2, "b": 2}}])
    second = answer("4")
    async with store.rollout("my-model", scenario=Scenario(question="2+2?")) as rollout:
        assert current_rollout() is rollout
        rollout.record_llm_call([system, user], first, latency_s=0.25)
        rollout.record_llm_call(
            [system, user, first, ToolMessage("4", tool_call_id="c1")], second, latency_s=0.5
        )
        rollout.result = {"answer": "4"}
        rollout.metrics["correct"] = True
        rollout.log("done")
    assert current_rollout() is None

    events = await store.read_stream(rollout.stream_id)
    assert [e.type for e in events] == [
        "rollout.started",
        "llm.call",
        "llm.call",
        "rollout.finished",
    ]
    assert events[0].data["scenario"] == {"question": "2+2?"}  # a pydantic scenario, dumped
    assert events[2].data["input"][2] == events[1].data["output"]  # stored once
    trajectory = await store.trajectory(rollout.id)
    assert trajectory.metrics == {"correct": True} and trajectory.logs == ["done"]
    assert [type(m).__name__ for m in trajectory.messages_and_choices] == [
        "dict",
        "dict",
        "Choice",
        "dict",
        "Choice",
    ]


async def test_a_result_that_is_not_json_fails_the_rollout(store) -> None:
    with pytest.raises(InvalidEventError, match="agent's result"):
        async with store.rollout("my-model") as rollout:
            rollout.result = object()
    events = await store.read_stream(rollout.stream_id)
    assert [e.type for e in events] == ["rollout.started", "rollout.failed"]


@pytest.mark.parametrize("field", ["metrics", "metadata"])
async def test_an_unstorable_metric_fails_the_rollout_instead_of_losing_its_end(store, field):
    with pytest.raises(InvalidEventError, match=field):
        async with store.rollout("my-model") as rollout:
            rollout.result = "fine"
            getattr(rollout, field)["score"] = float("nan")
    events = await store.read_stream(rollout.stream_id)
    assert [e.type for e in events] == ["rollout.started", "rollout.failed"]


async def test_calls_after_the_block_are_refused(store) -> None:
    async with store.rollout("my-model") as rollout:
        pass
    with pytest.raises(NoRolloutError, match="already ended"):
        rollout.record_llm_call([HumanMessage("late")], answer("late"))


async def test_calls_from_a_thread_are_committed_when_the_block_exits(store) -> None:
    async with store.rollout("my-model") as rollout:
        for n in range(5):
            await asyncio.to_thread(rollout.record_llm_call, [HumanMessage(f"q{n}")], answer("a"))
    calls = [e for e in await store.read_stream(rollout.stream_id) if e.type == "llm.call"]
    assert [c.data["index"] for c in calls] == [0, 1, 2, 3, 4]


async def test_messages_are_recorded_by_value_at_each_call(store) -> None:
    """A message edited in place between two calls is recorded as it was at each call."""
    user = HumanMessage(content=[{"type": "text", "text": "hi"}])
    first = answer("hello", tool_calls=[{"id": "c1", "name": "f", "args": {"zone": 1, "a": 2}}])
    async with store.rollout("my-model") as rollout:
        rollout.record_llm_call([user], first)
        rollout.record_llm_call([user, first, HumanMessage("again")], answer("hello again"))
        user.content[0]["text"] = "hi, edited"  # a dict inside the content list, in place
        user.content.append({"type": "text", "text": "more"})  # the list itself, in place
        first.tool_calls[0]["args"]["zone"] = 3  # the arguments dict, in place
        first.name = "agent"  # a field replaced, as LangGraph's create_react_agent(name=...)
        rollout.record_llm_call([user, first, HumanMessage("more")], answer("more"))
    calls = [e.data for e in await store.read_stream(rollout.stream_id) if e.type == "llm.call"]
    assert calls[1]["input"][:2] == [calls[0]["input"][0], calls[0]["output"]]  # stored once
    bodies = await store.get_blobs(
        [calls[0]["input"][0], calls[2]["input"][0], calls[2]["input"][1]]
    )
    assert json.loads(bodies[calls[0]["input"][0]])["data"]["content"] == [
        {"type": "text", "text": "hi"}
    ]
    assert json.loads(bodies[calls[2]["input"][0]])["data"]["content"] == [
        {"type": "text", "text": "hi, edited"},
        {"type": "text", "text": "more"},
    ]
    edited = json.loads(bodies[calls[2]["input"][1]])["data"]
    assert edited["name"] == "agent"
    assert list(edited["tool_calls"][0]["args"].items()) == [("zone", 3), ("a", 2)]
    trajectory = await store.trajectory(rollout.id)  # by ART's rule: the edit starts a history
    assert trajectory.messages_and_choices[0] == {
        "role": "user",
        "content": [{"type": "text", "text": "hi"}],
    }
    (edited_history,) = trajectory.additional_histories
    assert edited_history.messages_and_choices[0]["content"] == [
        {"type": "text", "text": "hi, edited"},
        {"type": "text", "text": "more"},
    ]


def test_message_json_round_trip() -> None:
    message = answer(
        "ok",
        tool_calls=[{"id": "c1", "name": "f", "args": {"x": [1, 2]}}],
        usage_metadata={"input_tokens": 3, "output_tokens": 1, "total_tokens": 4},
        id="lc_run--1",
    )
    body = lc.dump_message(message)
    assert lc.load_message(body) == message
    assert json.loads(body) == {"type": "ai", "data": message.model_dump()}


# --- secrets ----------------------------------------------------------------------------------


def test_redactor_knows_keys_urls_and_the_environment(monkeypatch) -> None:
    monkeypatch.setenv("SOME_SERVICE_TOKEN", "tok-from-the-environment")
    url = "https://user:pa55word-in-url@host/v1?api_key=key-in-query&region=eu"
    assert secrets_in_url(url) == {"pa55word-in-url", "key-in-query"}
    assert redact_url(url) == f"https://user:{REDACTED}@host/v1?api_key={REDACTED}&region=eu"
    redact = Redactor(["sk-the-api-key"], urls=[url])
    leaked = "sk-the-api-key pa55word-in-url key-in-query tok-from-the-environment short"
    assert redact(leaked) == " ".join([REDACTED] * 4 + ["short"])


async def test_api_key_reaches_no_event_and_no_table(store, database_url, monkeypatch) -> None:
    environment_token = "tok-environment-secret-123"
    monkeypatch.setenv("SOME_SERVICE_TOKEN", environment_token)
    url_password, query_key = "url-password-secret-456", "query-key-secret-789"
    async with LocalInferenceServer() as server:
        key = server.api_key

        @tool
        def lookup(city: str) -> str:
            """Look a city up."""
            return f"{city}: found with key {key} and token {environment_token}"

        # A real agent whose tool leaks the key into the conversation (and the model then
        # repeats it), which fails with the key in its exception message.
        with pytest.raises(RuntimeError):
            async with store.rollout(served_model(server), scenario={"note": key}) as rollout:
                rollout.log(f"calling with {key}")
                rollout.metadata["key"] = key
                agent = react_agent(init_chat_model(), tools=[lookup])
                await agent.ainvoke({"messages": [("user", f"Look up Paris, key {key}")]})
                raise RuntimeError(f"agent gave up; its key was {key}")

        # A model whose inference URL carries credentials, and a call failing with the URL.
        url = f"http://user:{url_password}@127.0.0.1:9/v1?api_key={query_key}"
        model = art.Model(
            name="agent",
            project="tests",
            inference_base_url=url,
            inference_api_key=key,
            inference_model_name="test-model",
        )
        async with store.rollout(model, scenario={"url": url}) as rollout:
            rollout.record_llm_call([HumanMessage(f"see {url}")], answer(f"the key is {key}"))
            rollout.record_llm_call(
                [HumanMessage("hi")], None, error=ConnectionError(f"cannot reach {url} ({key})")
            )
            rollout.result = {"echo": [key, url]}
            rollout.metadata["note"] = f"key {key}"
            rollout.log(f"done with {key}")

    secrets = [key, url_password, query_key, environment_token]
    dump = await dump_database(store)
    assert len(dump) > 10_000 and REDACTED in dump
    for secret in secrets:
        assert secret not in dump
    if database_url.startswith("sqlite"):  # the files themselves, WAL included
        path = Path(database_url.removeprefix("sqlite:///"))
        raw = b"".join(p.read_bytes() for p in path.parent.glob(path.name + "*"))
        for secret in secrets:
            assert secret.encode() not in raw


async def dump_database(store) -> str:
    """SELECT * of every table and view, as text."""
    async with store.database.read() as connection:
        names = await connection.run_sync(
            lambda sync: inspect(sync).get_table_names() + inspect(sync).get_view_names()
        )
        assert {"events", "blobs", "llm_calls", "trajectory_messages"} <= set(names)
        rows = []
        for name in names:
            result = await connection.execute(text(f'SELECT * FROM "{name}"'))
            rows += [repr(tuple(row)) for row in result]
    return "\n".join(rows)


async def test_projection_tables_are_rebuilt_the_same(store) -> None:
    async with store.rollout("my-model") as rollout:
        rollout.record_llm_call([HumanMessage("q")], answer("a"), latency_s=0.1)

    async def tables() -> list[Any]:
        async with store.database.read() as connection:
            calls = (await connection.execute(select(t.llm_calls))).all()
            messages = (await connection.execute(select(t.trajectory_messages))).all()
        return [tuple(r) for r in calls + messages]

    before = await tables()
    await store.rebuild_projections()
    assert await tables() == before and len(before) == 3
