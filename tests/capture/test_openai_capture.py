"""Agents that call their model through an OpenAI client, recorded without being changed.

The agents are written the ART way: `art.Trajectory(messages_and_choices=[system, user])`,
`completion.choices[0]` appended after each call, tool results after it, and
`trajectory.messages()` sent next. Each runs inside `store.rollout(...)` against the
LocalInferenceServer over real HTTP, through ART's `model.openai_client()` (a trainable
model on the CPU backend), a plain `openai.AsyncOpenAI`, or a sync `openai.OpenAI` in a
thread; streamed or not. What they built and what the store projects must be equal,
field for field (Choice objects with their logprobs and token ids, tools in their key
order, additional histories).
"""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

import art
import httpx
import openai
import pytest
from art.openai import consume_chat_completion_stream, consume_sync_chat_completion_stream
from capture_helpers import WEATHER_TOOL, served_model, served_trainable_model
from openai.types.chat.chat_completion import Choice
from sqlalchemy import select

from artstore.art_versions import history_class
from artstore.capture.http import unrecorded
from artstore.schema import tables as t
from artstore.testing.inference_server import LocalInferenceServer, ScriptedReply

# Keys deliberately not in alphabetical order: a store that sorted them would be caught.
TOOLS = [
    WEATHER_TOOL,
    {
        "type": "function",
        "function": {
            "name": "get_population",
            "parameters": {
                "type": "object",
                "properties": {"year": {"type": "integer"}, "city": {"type": "string"}},
                "required": ["year", "city"],
            },
            "description": "The population of a city in a year.",
        },
    },
]


def parallel_tools_policy(request: dict[str, Any], sample_index: int) -> ScriptedReply:
    """Both tools at once (parallel tool calls), then an answer quoting their results."""
    messages = request["messages"]
    last_user = max(i for i, m in enumerate(messages) if m["role"] == "user")
    question = messages[last_user]["content"]
    results = [m["content"] for m in messages[last_user:] if m["role"] == "tool"]
    if request.get("tools") and not results:
        return ScriptedReply(
            tool_calls=[
                ("get_weather", {"zone": "CET", "city": question}),
                ("get_population", {"year": 2020, "city": question}),
            ]
        )
    return ScriptedReply(content=f"Answer to {question}: " + "; ".join(results or ["none"]))


class Caller:
    """One way to call the model: a client kind, streamed or not."""

    def __init__(self, kind: str, stream: bool, server: LocalInferenceServer, model: Any):
        self.kind, self.stream, self.model = kind, stream, model
        if kind == "art":
            self.client: Any = model.openai_client()
        elif kind == "sync":
            self.client = openai.OpenAI(base_url=server.base_url, api_key=server.api_key)
        else:
            self.client = openai.AsyncOpenAI(base_url=server.base_url, api_key=server.api_key)

    async def __call__(self, messages: list[Any], tools: list[Any] | None) -> Choice:
        options: dict[str, Any] = {
            "model": self.model.get_inference_name(),
            "messages": messages,
            "logprobs": True,
            **({"tools": tools} if tools else {}),
        }
        if self.stream:
            options |= {"stream": True, "stream_options": {"include_usage": True}}
        if self.kind == "sync":

            def call() -> Any:
                response = self.client.chat.completions.create(**options)
                return consume_sync_chat_completion_stream(response) if self.stream else response

            completion = await asyncio.to_thread(call)
        else:
            completion = await self.client.chat.completions.create(**options)
            if self.stream:
                completion = await consume_chat_completion_stream(completion)
        return completion.choices[0]


async def research_agent(call: Caller, question: str) -> art.Trajectory:
    """A tool-calling conversation, then a sub-agent (a second conversation) that summarises."""
    trajectory = art.Trajectory(
        messages_and_choices=[
            {"role": "system", "content": "You are a weather researcher."},
            {"role": "user", "content": question},
        ],
        tools=TOOLS,
        reward=0.0,
    )
    while True:
        choice = await call(trajectory.messages(), TOOLS)
        trajectory.messages_and_choices.append(choice)
        if not choice.message.tool_calls:
            break
        for tool_call in choice.message.tool_calls:
            arguments = json.loads(tool_call.function.arguments)
            trajectory.messages_and_choices.append(
                {
                    "role": "tool",
                    "tool_call_id": tool_call.id,
                    "content": f"{tool_call.function.name}: {sorted(arguments.items())}",
                }
            )
    summary = history_class()(
        messages_and_choices=[
            {"role": "system", "content": "Summarise in one line."},
            {"role": "user", "content": choice.message.content},
        ]
    )
    summary.messages_and_choices.append(await call(summary.messages(), None))
    trajectory.additional_histories.append(summary)
    return trajectory


def dump(value: Any) -> str:
    """Order-sensitive JSON of a trajectory's items: key order and every float count."""

    def plain(item: Any) -> Any:
        if isinstance(item, Choice):
            return {"Choice": item.model_dump()}
        return item

    return json.dumps(value, default=plain)


def histories(trajectory: art.Trajectory) -> list[tuple[str, str]]:
    return [
        (dump(trajectory.messages_and_choices), dump(trajectory.tools)),
        *((dump(h.messages_and_choices), dump(h.tools)) for h in trajectory.additional_histories),
    ]


async def rows(store: Any, query: Any) -> list[Any]:
    async with store.database.read() as connection:
        return list((await connection.execute(query)).all())


# --- the trajectory the agent built is the trajectory the store projects ----------------------


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("kind", ["art", "async", "sync"])
async def test_projected_trajectory_equals_the_agents(store, tmp_path, kind, stream) -> None:
    async with LocalInferenceServer(parallel_tools_policy) as server:
        model, _ = await served_trainable_model(server, tmp_path)
        call = Caller(kind, stream, server, model)
        async with store.rollout(model, scenario={"city": "Oslo"}) as rollout:
            built = await research_agent(call, "Oslo")
        sent = server.requests

    projected = await store.trajectory(rollout.id)
    assert histories(projected) == histories(built)
    assert projected.messages_and_choices == built.messages_and_choices
    assert projected.additional_histories == built.additional_histories
    choices = [item for item in built.messages_and_choices if isinstance(item, Choice)]
    assert len(choices[0].message.tool_calls) == 2  # parallel tool calls
    assert all(c.logprobs and c.logprobs.content for c in choices)
    assert [type(item).__name__ for item in projected.messages_and_choices] == [
        type(item).__name__ for item in built.messages_and_choices
    ]

    calls = await rows(store, select(t.llm_calls).order_by(t.llm_calls.c.call_index))
    assert len(calls) == len(sent) == 3
    assert [c.source for c in calls] == ["http"] * 3
    assert [c.streamed for c in calls] == [stream] * 3
    assert [c.num_input_messages for c in calls] == [len(r["messages"]) for r in sent]
    assert [c.finish_reason for c in calls] == ["tool_calls", "stop", "stop"]
    assert calls[0].tool_calls == [
        {"name": "get_weather", "args": {"zone": "CET", "city": "Oslo"}},
        {"name": "get_population", "args": {"year": 2020, "city": "Oslo"}},
    ]
    assert all(c.has_logprobs and c.latency_s > 0 and c.prompt_tokens > 0 for c in calls)
    assert all(c.model == model.get_inference_name() for c in calls)


async def test_the_request_is_stored_as_sent(store, tmp_path) -> None:
    """Every request body comes back equal to what the server received, key order included."""
    from artstore.projections.trajectories import StoredCalls

    async with LocalInferenceServer(parallel_tools_policy) as server:
        model, _ = await served_trainable_model(server, tmp_path)
        async with store.rollout(model) as rollout:
            await research_agent(Caller("art", False, server, model), "Lima")
        sent = server.requests
    async with store.database.read() as connection:
        stored = (await connection.run_sync(StoredCalls.load, [rollout.id])).rollout(rollout.id)
    assert [json.dumps(call.request) for call in stored.http] == [json.dumps(r) for r in sent]
    # The conversation grows: each distinct message and the tool list are stored once.
    events = [e.data for e in await store.read_stream(rollout.stream_id) if e.type == "llm.call"]
    assert events[1]["input"][:2] == events[0]["input"] and events[1]["tools"] == events[0]["tools"]


async def test_many_rollouts_at_once_never_mix_calls(store, tmp_path) -> None:
    tokens = [f"zz{i:03d}x{i * 7919 % 100000:05d}" for i in range(24)]
    async with LocalInferenceServer(parallel_tools_policy) as server:
        model, _ = await served_trainable_model(server, tmp_path)
        callers = [
            Caller(kind, stream, server, model)
            for kind in ("art", "async", "sync")
            for stream in (False, True)
        ]

        async def one(index: int) -> tuple[str, art.Trajectory]:
            async with store.rollout(model, scenario={"token": tokens[index]}) as rollout:
                built = await research_agent(callers[index % len(callers)], tokens[index])
            return rollout.id, built

        done = await asyncio.gather(*(one(i) for i in range(len(tokens))))

    projected = await store.trajectories([rollout_id for rollout_id, _ in done])
    token_re = re.compile(r"zz\d{3}x\d{5}")
    for (rollout_id, built), token in zip(done, tokens, strict=True):
        assert histories(projected[rollout_id]) == histories(built)
        assert set(token_re.findall(dump(projected[rollout_id].messages_and_choices))) == {token}
    counts = await rows(store, select(t.rollouts.c.num_llm_calls))
    assert [c.num_llm_calls for c in counts] == [3] * len(tokens)


# --- failures ---------------------------------------------------------------------------------


async def test_failed_calls_are_recorded_and_the_agent_gets_the_exception(store) -> None:
    async with LocalInferenceServer(fail_when=lambda request: True) as failing:
        client = openai.AsyncOpenAI(base_url=failing.base_url, api_key=failing.api_key)
        async with store.rollout("agent") as rollout:
            with pytest.raises(openai.InternalServerError):
                await client.with_options(max_retries=1).chat.completions.create(
                    model="test-model", messages=[{"role": "user", "content": "hi"}]
                )
    async with LocalInferenceServer(latency_s=1.0) as slow:
        client = openai.AsyncOpenAI(base_url=slow.base_url, api_key=slow.api_key, max_retries=0)
        async with store.rollout("agent") as timed_out:
            with pytest.raises(openai.APITimeoutError):
                await client.chat.completions.create(
                    model="test-model",
                    messages=[{"role": "user", "content": "hi"}],
                    # The answer is late, not the connection: a busy machine may take
                    # longer than the read timeout to connect.
                    timeout=httpx.Timeout(0.2, connect=30.0),
                )
    unreachable = openai.AsyncOpenAI(base_url="http://127.0.0.1:9/v1", api_key="x", max_retries=0)
    async with store.rollout("agent") as refused:
        with pytest.raises(openai.APIConnectionError):
            await unreachable.chat.completions.create(
                model="test-model", messages=[{"role": "user", "content": "hi"}]
            )

    calls = await rows(store, select(t.llm_calls).order_by(t.llm_calls.c.position))
    by_rollout = {
        r.id: [c for c in calls if c.rollout_id == r.id] for r in (rollout, timed_out, refused)
    }
    failed = by_rollout[rollout.id]
    assert len(failed) == 2  # the SDK retried once: two real calls
    assert all(c.error_type == "HTTPStatusError" for c in failed)
    assert all("500" in c.error_message and "Injected failure" in c.error_message for c in failed)
    assert [c.error_type for c in by_rollout[timed_out.id]] == ["ReadTimeout"]
    assert [c.error_type for c in by_rollout[refused.id]] == ["ConnectError"]
    assert all(not c.has_logprobs and c.source == "http" for c in calls)
    assert (await store.trajectory(rollout.id)).messages_and_choices == []


async def long_story(client: openai.AsyncOpenAI) -> Any:
    """A streamed chat completion, long enough to be cut off while it streams."""
    return await client.chat.completions.create(
        model="test-model",
        messages=[{"role": "user", "content": "Tell me a long story please"}],
        stream=True,
    )


async def test_a_stream_closed_early_is_a_failed_call(store) -> None:
    async with LocalInferenceServer(chunk_interval_s=0.05) as server:
        client = openai.AsyncOpenAI(base_url=server.base_url, api_key=server.api_key)
        async with store.rollout("agent"):
            stream = await long_story(client)
            async for _ in stream:
                break
            await stream.close()
    (call,) = await rows(store, select(t.llm_calls))
    assert call.error_type == "IncompleteStreamError" and call.streamed


# --- what is recorded, and only once ----------------------------------------------------------


async def test_only_calls_inside_a_rollout_are_recorded(store) -> None:
    async with LocalInferenceServer() as server:
        client = openai.AsyncOpenAI(base_url=server.base_url, api_key=server.api_key)
        ask = {"model": "test-model", "messages": [{"role": "user", "content": "hi"}]}
        await client.chat.completions.create(**ask)  # no rollout
        async with store.rollout("agent") as rollout:
            await client.chat.completions.create(**ask)
            with unrecorded():  # e.g. a judge that is not the agent's model
                await client.chat.completions.create(**ask)
            await client.models.list()  # not an LLM call
        await client.chat.completions.create(**ask)  # after the block
    calls = await rows(store, select(t.llm_calls))
    assert [c.rollout_id for c in calls] == [rollout.id]


async def test_artstores_chat_model_is_recorded_once(store) -> None:
    from artstore.langgraph import init_chat_model

    async with LocalInferenceServer() as server:
        model = served_model(server)
        async with store.rollout(model) as rollout:
            await init_chat_model().ainvoke("Weather in Oslo?")
            await asyncio.to_thread(init_chat_model().invoke, "Weather in Rome?")
    events = [e.data for e in await store.read_stream(rollout.stream_id) if e.type == "llm.call"]
    assert [e["source"] for e in events] == ["langchain", "langchain"]


async def test_projections_rebuild_the_same_with_superseded_calls(store) -> None:
    """ART's wrapper (a record superseding the HTTP one) next to a plain client."""
    import warnings

    from art.langgraph import init_chat_model as art_init_chat_model
    from langchain_core.tools import tool
    from langgraph.prebuilt import create_react_agent

    @tool
    def get_weather(city: str) -> str:
        """Get the weather for a city."""
        return f"sunny in {city}"

    async with LocalInferenceServer() as server:
        model = served_model(server)
        client = openai.AsyncOpenAI(base_url=server.base_url, api_key=server.api_key)
        async with store.rollout(model) as rollout:
            with warnings.catch_warnings():  # create_react_agent: deprecated in LangGraph 1
                warnings.simplefilter("ignore")
                agent = create_react_agent(art_init_chat_model(), [get_weather])
            await agent.ainvoke({"messages": [("user", "Weather in Oslo?")]})
            await client.chat.completions.create(
                model="test-model", messages=[{"role": "user", "content": "And Rome?"}]
            )

    async def tables() -> list[Any]:
        calls = await rows(store, select(t.llm_calls).order_by(t.llm_calls.c.call_index))
        messages = await rows(
            store,
            select(t.trajectory_messages).order_by(
                t.trajectory_messages.c.history_index, t.trajectory_messages.c.message_index
            ),
        )
        counts = await rows(store, select(t.rollouts.c.num_llm_calls))
        return [tuple(r) for r in calls + messages + counts]

    before = await tables()
    calls = await rows(store, select(t.llm_calls).order_by(t.llm_calls.c.call_index))
    assert [(c.call_index, c.source) for c in calls] == [
        (0, "langchain"),
        (1, "langchain"),
        (2, "http"),
    ]
    trajectory = await store.trajectory(rollout.id)
    assert len(trajectory.messages_and_choices) == 4  # user, tool call, tool, answer
    assert trajectory.additional_histories[0].messages_and_choices[0] == {
        "role": "user",
        "content": "And Rome?",
    }
    await store.rebuild_projections()
    assert await tables() == before


async def test_a_stream_left_open_when_the_block_exits_is_a_failed_call(store) -> None:
    async with LocalInferenceServer(chunk_interval_s=0.05) as server:
        client = openai.AsyncOpenAI(base_url=server.base_url, api_key=server.api_key)
        async with store.rollout("agent"):
            stream = await long_story(client)
            async for _ in stream:
                break  # and never closed in the block
        await stream.close()
    (call,) = await rows(store, select(t.llm_calls))
    assert call.error_type == "IncompleteStreamError" and call.streamed
