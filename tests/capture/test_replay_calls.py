"""Resume inside a rollout: an attempt that did not finish, run again, gets its recorded calls
back from the store, and the inference server sees only the calls that were not answered.

The agent: ten calls of an OpenAI client, each but the last asking for a tool that the
agent runs itself, against the LocalInferenceServer with a deterministic policy. The first
attempt stops (raises) after some calls; the second `resumes` it.
"""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest
from capture_helpers import served_model
from sqlalchemy import select

from artstore.schema import tables as t
from artstore.testing.inference_server import LocalInferenceServer, ScriptedReply

CALLS = 10
STEP_TOOL = {
    "type": "function",
    "function": {
        "name": "step",
        "description": "One step of the task.",
        "parameters": {"type": "object", "properties": {"n": {"type": "integer"}}},
    },
}


class Stopped(Exception):
    """The first attempt ends here, as a crash would."""


def policy(request: dict[str, Any], sample_index: int) -> ScriptedReply:
    """A step tool until nine results are in, then an answer quoting the last one."""
    results = [m for m in request["messages"] if m.get("role") == "tool"]
    if len(results) < CALLS - 1:
        return ScriptedReply(tool_calls=[("step", {"n": len(results)})])
    return ScriptedReply(content="done: " + results[-1]["content"])


async def agent(
    server: LocalInferenceServer,
    *,
    stream: bool,
    stop_after: int | None = None,
    changed_from: int | None = None,
) -> str:
    """Ten calls; raises `Stopped` after `stop_after` answers; the tool's result changes
    from the call `changed_from` on (the request after it differs from the recorded one)."""
    client = openai.AsyncOpenAI(base_url=server.base_url, api_key=server.api_key)
    messages: list[Any] = [{"role": "user", "content": "do the task"}]
    for call in range(CALLS):
        if stop_after is not None and call == stop_after:
            raise Stopped
        options: dict[str, Any] = {
            "model": "test-model",
            "messages": messages,
            "tools": [STEP_TOOL],
        }
        if stream:
            chunks = await client.chat.completions.create(**options, stream=True)
            content, tool_calls = "", {}
            async for chunk in chunks:
                delta = chunk.choices[0].delta if chunk.choices else None
                content += (delta.content or "") if delta else ""
                for each in (delta.tool_calls or []) if delta else []:
                    found = tool_calls.setdefault(each.index, {"id": "", "name": "", "args": ""})
                    found["id"] += each.id or ""
                    found["name"] += (each.function.name or "") if each.function else ""
                    found["args"] += (each.function.arguments or "") if each.function else ""
            calls = list(tool_calls.values())
        else:
            completion = await client.chat.completions.create(**options)
            message = completion.choices[0].message
            content = message.content or ""
            calls = [
                {"id": c.id, "name": c.function.name, "args": c.function.arguments}
                for c in message.tool_calls or []
            ]
        if not calls:
            return content
        messages.append(
            {
                "role": "assistant",
                "content": content or None,
                "tool_calls": [
                    {
                        "id": c["id"],
                        "type": "function",
                        "function": {"name": c["name"], "arguments": c["args"]},
                    }
                    for c in calls
                ],
            }
        )
        for c in calls:
            n = json.loads(c["args"])["n"]
            changed = changed_from is not None and call >= changed_from - 1
            result = f"step {n} {'changed' if changed else 'ok'}"
            messages.append({"role": "tool", "tool_call_id": c["id"], "content": result})
    raise AssertionError("the policy never answered")


async def events_of(store: Any, rollout_id: str) -> list[Any]:
    return [e.decode() for e in await store.read_stream(f"rollout-{rollout_id}")]


async def calls_of(store: Any, rollout_id: str) -> list[Any]:
    """The rollout's `llm.call` events, and checks that its projection holds each once."""
    calls = [e for e in await events_of(store, rollout_id) if e.type == "llm.call"]
    async with store.database.read() as connection:
        indexes = await connection.execute(
            select(t.llm_calls.c.call_index).where(t.llm_calls.c.rollout_id == rollout_id)
        )
        assert sorted(indexes.scalars()) == [c.index for c in calls]
    return calls


def asked(call: Any) -> list[Any]:
    return [(c["name"], c["args"]) for c in call.tool_calls]


async def first_attempt(
    store: Any, server: LocalInferenceServer, stream: bool, stop_after: int
) -> str:
    model = served_model(server)
    with pytest.raises(Stopped):
        async with store.rollout(model, scenario="task") as earlier:
            await agent(server, stream=stream, stop_after=stop_after)
    return earlier.id


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
async def test_resumed_attempt_sends_only_what_was_not_answered(store: Any, stream: bool) -> None:
    async with LocalInferenceServer(policy) as server:
        model = served_model(server)
        async with store.rollout(model, scenario="task") as whole:
            whole.result = await agent(server, stream=stream)
        earlier = await first_attempt(store, server, stream, stop_after=6)
        before = len(server.requests)
        async with store.rollout(model, scenario="task", resumes=earlier) as resumed:
            resumed.result = await agent(server, stream=stream)
        sent = server.requests[before:]

    assert len(sent) == CALLS - 6  # each answered call: 0 times at the inference server
    assert [len(r["messages"]) for r in sent] == [1 + 2 * i for i in range(6, CALLS)]
    assert resumed.result == whole.result

    earlier_calls = await calls_of(store, earlier)
    resumed_calls = await calls_of(store, resumed.id)
    whole_calls = await calls_of(store, whole.id)
    assert [c.index for c in resumed_calls] == list(range(CALLS))  # each call once
    assert [asked(c) for c in resumed_calls] == [asked(c) for c in whole_calls]
    assert [c.num_logprobs for c in resumed_calls] == [c.num_logprobs for c in whole_calls]
    # the served calls are the earlier attempt's records: the same output, logprobs, ids
    assert [c.output for c in resumed_calls[:6]] == [c.output for c in earlier_calls]

    events = await events_of(store, resumed.id)
    assert events[0].resumes == earlier
    replayed = [e.replayed_from for e in events if e.type == "llm.call"]
    assert replayed[:6] == [c.call_id for c in earlier_calls] and replayed[6:] == [None] * 4
    assert not [e for e in events if e.type == "llm.replay_diverged"]
    assert len((await store.trajectory(resumed.id)).messages_and_choices) == len(
        (await store.trajectory(whole.id)).messages_and_choices
    )


async def test_first_request_that_differs_goes_live_and_is_recorded(store: Any) -> None:
    async with LocalInferenceServer(policy) as server:
        model = served_model(server)
        earlier = await first_attempt(store, server, False, stop_after=7)
        before = len(server.requests)
        async with store.rollout(model, scenario="task", resumes=earlier) as resumed:
            resumed.result = await agent(server, stream=False, changed_from=3)
        sent = server.requests[before:]

    assert len(sent) == CALLS - 3  # calls 0-2 served; 3 differed: it and all later live
    events = await events_of(store, resumed.id)
    diverged = [e for e in events if e.type == "llm.replay_diverged"]
    earlier_calls = await calls_of(store, earlier)
    assert len(diverged) == 1
    assert diverged[0].index == 3 and diverged[0].recorded_call_id == earlier_calls[3].call_id
    assert diverged[0].fingerprint != diverged[0].recorded_fingerprint
    replayed = [e.replayed_from for e in events if e.type == "llm.call"]
    assert replayed == [c.call_id for c in earlier_calls[:3]] + [None] * (CALLS - 3)
    assert "changed" in resumed.result
