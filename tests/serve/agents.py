"""The conversation every client of these tests has: a weather question, a tool, an answer."""

from __future__ import annotations

import json
from typing import Any

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


async def python_agent(client: Any, question: str, *, stream: bool) -> list[dict[str, Any]]:
    """The agent with Python's `openai` client (what agent.mjs does with Node's)."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a weather agent."},
        {"role": "user", "content": question},
    ]
    for _ in range(3):
        message = await _ask(client, messages, stream)
        messages.append(message)
        if not message.get("tool_calls"):
            break
        for call in message["tool_calls"]:
            city = json.loads(call["function"]["arguments"])["city"]
            messages.append(
                {"role": "tool", "tool_call_id": call["id"], "content": f"sunny in {city}"}
            )
    return messages


async def _ask(client: Any, messages: list[dict[str, Any]], stream: bool) -> dict[str, Any]:
    request = {"model": "test-model", "messages": messages, "tools": [WEATHER_TOOL]}
    request["logprobs"] = True
    if not stream:
        completion = await client.chat.completions.create(**request)
        return completion.choices[0].message.model_dump(exclude_none=True)
    message: dict[str, Any] = {"role": "assistant", "content": ""}
    calls: dict[int, dict[str, Any]] = {}
    async for chunk in await client.chat.completions.create(**request, stream=True):
        delta = chunk.choices[0].delta if chunk.choices else None
        if delta is None:
            continue
        message["content"] += delta.content or ""
        for call in delta.tool_calls or []:
            known = calls.setdefault(
                call.index,
                {"id": call.id, "type": "function", "function": {"name": "", "arguments": ""}},
            )
            known["function"]["name"] += (call.function and call.function.name) or ""
            known["function"]["arguments"] += (call.function and call.function.arguments) or ""
    if calls:
        message["tool_calls"] = [calls[i] for i in sorted(calls)]
    return message
