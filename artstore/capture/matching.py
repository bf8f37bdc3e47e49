"""Which records are the same LLM call: an HTTP call and the LangChain message made of it.

Several capture routes can see one call: the HTTP hook records the request and response,
then ART's LangGraph wrapper (or artstore's, inside ART's own capture) logs the
`AIMessage` LangChain built from that response. The later record supersedes the HTTP one
(`Rollout.record_llm_call`), and for that it must find it. Two keys are tried, in order:

- the response id: LangChain keeps it in `response_metadata["id"]` for a response it got
  whole, but not for one it streamed (the message then has no trace of it);
- the answer: how many messages the model was given, what it answered and the ids and
  names of the tool calls it asked for. A tool call's id is new for every response, so
  with tool calls this key names one call. Two calls that return the same text to
  prompts of the same length have one key: the newest HTTP record with it is taken (a
  wrapper logs its call as soon as the call returns).
"""

from __future__ import annotations

import json
from typing import Any

from langchain_core.messages import AIMessage


def keys(response_id: Any, answer: str | None) -> list[str]:
    """The keys of a record, in the order they are tried."""
    found = [f"id:{response_id}"] if isinstance(response_id, str) else []
    return found + ([f"answer:{answer}"] if answer is not None else [])


def answer_key(num_messages: int, content: Any, tool_calls: list[tuple[Any, Any]]) -> str:
    """The key of an answer: prompt length, the answer's text, its tool calls' (id, name)."""
    text = content if isinstance(content, str) else json.dumps(content, sort_keys=True)
    calls = [[call_id or "", name or ""] for call_id, name in tool_calls]
    return json.dumps([num_messages, text, calls])


def answer_key_of_message(num_messages: int, output: AIMessage) -> str:
    """The answer key of the `AIMessage` LangChain returned for a prompt of `num_messages`."""
    calls = [*output.tool_calls, *output.invalid_tool_calls]
    return answer_key(num_messages, output.content or "", [(c["id"], c["name"]) for c in calls])


def answer_key_of_response(request: dict[str, Any], document: dict[str, Any]) -> str | None:
    """The answer key of a stored chat-completion response (its first choice), or None."""
    messages = request.get("messages")
    if not isinstance(messages, list):
        return None
    answer = first_answer(document)
    if answer is None:
        return None
    content, calls = answer
    return answer_key(len(messages), content, calls)


def first_answer(document: dict[str, Any]) -> tuple[str, list[tuple[Any, Any]]] | None:
    """(text, [(tool call id, name)]) of a chat completion's first choice, streamed or not."""
    if "json" in document:
        body = document["json"]
        choices = body.get("choices") if isinstance(body, dict) else None
        first = next(
            (c for c in choices or [] if isinstance(c, dict) and c.get("index", 0) == 0), None
        )
        if first is None or not isinstance(message := first.get("message"), dict):
            return None
        calls = [
            (c.get("id"), (c.get("function") or {}).get("name"))
            for c in message.get("tool_calls") or []
            if isinstance(c, dict)
        ]
        return message.get("content") or "", calls
    text, streamed, seen = [], {}, False
    for _, data in document.get("sse", []):
        for choice in data.get("choices") or [] if isinstance(data, dict) else []:
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            seen = True
            delta = choice.get("delta") if isinstance(choice.get("delta"), dict) else {}
            if isinstance(delta.get("content"), str):
                text.append(delta["content"])
            for call in delta.get("tool_calls") or []:
                index = call.get("index") if isinstance(call.get("index"), int) else 0
                known = streamed.setdefault(index, ["", ""])
                known[0] += call.get("id") or ""
                known[1] += (call.get("function") or {}).get("name") or ""
    if not seen:
        return None
    return "".join(text), [tuple(streamed[i]) for i in sorted(streamed)]


def choice_key(choice: Any) -> str:
    """The key of an openai `Choice`: its text and its tool calls' (id, name).

    What finds the call a trajectory's `Choice` came from (`artstore.capture.group`): the
    choice an agent appends is the client's, or one built from the same response (ART's
    LangGraph wrapper writes the arguments again, so they are left out).
    """
    message = choice.message
    calls = [
        [call.id or "", getattr(getattr(call, "function", None), "name", None) or ""]
        for call in message.tool_calls or []
    ]
    return json.dumps([message.content or "", calls])
