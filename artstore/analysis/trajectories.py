"""One trajectory as people read it: turns of a chat, tool calls and their results, and the
tokens of each assistant turn with their logprobs. For the viewer's trajectory page and
`artstore trajectory`.

The conversation is the projected `art.Trajectory` (`store.trajectory(id)`): exactly what
ART trains on, every history included; the rollout, its rewards and its LLM calls come
from the SQL views.
"""

from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING, Any

from sqlalchemy import select

from artstore.errors import NotFoundError
from artstore.schema.views import view_table

if TYPE_CHECKING:
    from artstore.store import Store

Row = dict[str, Any]


async def trajectory_detail(store: Store, rollout_id: str) -> Row:
    """The rollout (`v_rollouts`), every reward recorded for it (`v_rewards`, latest
    flagged), its LLM calls (`v_llm_calls`), and its trajectory as histories of turns."""
    rollouts, rewards, calls = (
        view_table("v_rollouts"),
        view_table("v_rewards"),
        view_table("v_llm_calls"),
    )
    async with store.database.read() as c:
        found = (
            await c.execute(select(rollouts).where(rollouts.c.rollout_id == rollout_id))
        ).first()
        if found is None:
            raise NotFoundError(f"no rollout {rollout_id!r} in this store")
        scored = [
            dict(row._mapping)
            for row in await c.execute(
                select(rewards).where(rewards.c.rollout_id == rollout_id).order_by(rewards.c.id)
            )
        ]
        made = [
            dict(row._mapping)
            for row in await c.execute(
                select(calls).where(calls.c.rollout_id == rollout_id).order_by(calls.c.call_index)
            )
        ]
    trajectory = await store.trajectory(rollout_id)
    histories = [
        {
            "index": 0,
            "tools": trajectory.tools or [],
            "turns": turns(trajectory.messages_and_choices),
        }
    ]
    for index, history in enumerate(trajectory.additional_histories, start=1):
        histories.append(
            {
                "index": index,
                "tools": history.tools or [],
                "turns": turns(history.messages_and_choices),
            }
        )
    return {
        "rollout": dict(found._mapping),
        "rewards": scored,
        "calls": made,
        "histories": histories,
        "metrics": trajectory.metrics,
        "metadata": trajectory.metadata,
        "logs": trajectory.logs,
    }


def turns(messages_and_choices: list[Any]) -> list[Row]:
    """Each message or `Choice` as a turn: role, text, tool calls, and for a trainable
    assistant turn its tokens with their logprobs."""
    return [turn(item) for item in messages_and_choices]


def turn(item: Any) -> Row:
    choice = _field(item, "message") is not None
    message = _field(item, "message") if choice else item
    tokens = []
    logprobs = _field(item, "logprobs") if choice else None
    for token in _field(logprobs, "content") or []:
        logprob = _field(token, "logprob")
        tokens.append(
            {
                "token": _field(token, "token"),
                "logprob": logprob,
                "probability": math.exp(logprob) if isinstance(logprob, int | float) else None,
            }
        )
    content = _text(_field(message, "content"))
    return {
        "role": _field(message, "role") or ("assistant" if choice else "?"),
        "content": content,
        "trainable": bool(tokens),
        "finish_reason": _field(item, "finish_reason") if choice else None,
        "tool_calls": [_tool_call(call) for call in _field(message, "tool_calls") or []],
        "tool_call_id": _field(message, "tool_call_id"),
        "name": _field(message, "name"),
        "tokens": tokens,
        # The tokens spell the text itself (not, say, a tool call's JSON).
        "tokens_are_content": bool(tokens) and "".join(t["token"] or "" for t in tokens) == content,
    }


def _tool_call(call: Any) -> Row:
    function = _field(call, "function") or {}
    arguments = _field(function, "arguments")
    if arguments is None:  # LangChain's form: {"name", "args"}
        arguments = _field(call, "args")
    return {
        "id": _field(call, "id"),
        "name": _field(function, "name") or _field(call, "name"),
        "arguments": _pretty_json(arguments),
    }


def _pretty_json(value: Any) -> str:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return value
    return json.dumps(value, indent=2, ensure_ascii=False)


def _text(content: Any) -> str:
    """A message's content as text: a string as it is, content parts' text joined, and any
    other part (an image...) as its JSON."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, dict) and part.get("type") == "text":
                parts.append(str(part.get("text", "")))
            else:
                parts.append(json.dumps(part, ensure_ascii=False, default=str))
        return "\n".join(parts)
    return json.dumps(content, ensure_ascii=False, default=str)


def _field(value: Any, name: str) -> Any:
    """`value[name]` or `value.name` (messages are dicts, choices are pydantic objects)."""
    if value is None:
        return None
    if isinstance(value, dict):
        return value.get(name)
    return getattr(value, name, None)
