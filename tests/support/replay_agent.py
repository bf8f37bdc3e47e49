"""Deterministic tool-using agents for the replay tests (tests/capture/test_replay_calls.py,
tests/capture/test_resume_storm.py, tests/support/replay_crash_driver.py).

Run against the LocalInferenceServer with `policy_of(calls)`: each call but the last asks
for the `step` tool; the answer quotes the last tool result. `agent` is a plain OpenAI-client
loop that runs the tool itself; `graph_agent` a LangGraph ReAct graph on ART's chat model
(over HTTP: recorded and served back as any client's calls) with the tool recorded
(`artstore.recorded_tool`). `AGENTS` names both for the storm.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

import openai

import artstore
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


def policy_of(calls: int) -> Callable[[dict[str, Any], int], ScriptedReply]:
    """A step tool until `calls - 1` results are in, then an answer quoting the last one."""

    def policy(request: dict[str, Any], sample_index: int) -> ScriptedReply:
        results = [m for m in request["messages"] if m.get("role") == "tool"]
        if len(results) < calls - 1:
            return ScriptedReply(tool_calls=[("step", {"n": len(results)})])
        return ScriptedReply(content="done: " + results[-1]["content"])

    return policy


policy = policy_of(CALLS)


async def agent(
    server: LocalInferenceServer | Any,
    *,
    stream: bool,
    stop_after: int | None = None,
    changed_from: int | None = None,
    on_answer: Callable[[int], Awaitable[None]] | None = None,
    messages: list[Any] | None = None,
    num_calls: int = CALLS,
) -> str:
    """`num_calls` calls to `server` (anything with its `base_url` and `api_key`, answered by
    `policy_of(num_calls)`); raises `Stopped`
    after `stop_after` answers; the tool's result changes from the call `changed_from` on
    (the request after it differs from the recorded one). `await on_answer(i)` runs once the
    i-th answer arrived; `messages` (empty) gets the conversation."""
    client = openai.AsyncOpenAI(base_url=server.base_url, api_key=server.api_key)
    messages = [] if messages is None else messages
    messages.append({"role": "user", "content": "do the task"})
    for call in range(num_calls):
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
        if on_answer is not None:
            await on_answer(call)
        if not calls:
            messages.append({"role": "assistant", "content": content})
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


async def graph_agent(
    *, on_answer: Callable[[int], Awaitable[None]] | None = None, num_calls: int = CALLS
) -> str:
    """A LangGraph ReAct graph of `num_calls` calls of ART's `init_chat_model` (the current
    rollout's model), bound to the `step` tool; run inside a rollout. The tool is
    recorded: a resumed rollout gets the results recorded before served back. `await
    on_answer(n)` runs when the tool runs for the n-th answer, before its result is
    recorded (a kill there leaves call n answered and recorded, its tool not)."""
    import warnings

    from art.langgraph import init_chat_model
    from langchain_core.tools import tool

    with warnings.catch_warnings():  # create_react_agent is deprecated in LangGraph 1.x
        warnings.simplefilter("ignore")
        from langgraph.prebuilt import create_react_agent

    @tool
    @artstore.recorded_tool
    async def step(n: int) -> str:
        """One step of the task."""
        if on_answer is not None:
            await on_answer(n)  # the policy asks for step n in call n
        return f"step {n} ok"

    graph = create_react_agent(init_chat_model().bind_tools([step]), [step])
    # A ReAct step is two super-steps (model, tools): more than LangGraph's default 25.
    state = await graph.ainvoke(
        {"messages": [("user", "do the task")]}, {"recursion_limit": 2 * num_calls + 5}
    )
    return state["messages"][-1].content


async def storm_agent(
    kind: str,
    server: Any,
    *,
    num_calls: int,
    on_answer: Callable[[int], Awaitable[None]] | None = None,
    messages: list[Any] | None = None,
) -> str:
    """The storm's agent `kind` ("openai" or "langgraph"), streamed, inside a rollout."""
    if kind == "openai":
        return await agent(
            server, stream=True, on_answer=on_answer, messages=messages, num_calls=num_calls
        )
    return await graph_agent(on_answer=on_answer, num_calls=num_calls)


AGENTS = ("openai", "langgraph")


def storm_reward(scenario: Any, results: list[Any], trajectories: list[Any]) -> list[float]:
    """The storm trainer's reward function (workers get it by its import path)."""
    return [1.0 if str(result).startswith("done") else 0.0 for result in results]
