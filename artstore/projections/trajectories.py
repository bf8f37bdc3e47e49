"""ART trajectories, projected from a rollout's `llm.call` events.

The conversations are merged with ART's own rule (`create_messages_from_logs` in
`art/langgraph/llm_wrapper.py`): a call whose input, without tool messages and without a
trailing human message, equals an earlier conversation without its tool messages
continues that conversation; any other call starts a new one. The first conversation
becomes `messages_and_choices`, the others `additional_histories`, each with the tools
of its latest call. Assistant turns that carried logprobs become trainable `Choice`
objects, built by ART's own `convert_langgraph_messages`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncConnection

from artstore.capture.messages import count_logprobs, from_json
from artstore.schema.tables import blobs, events

if TYPE_CHECKING:
    import art


@dataclass
class Call:
    """What ART's logger receives for one call: input messages, output, tools offered."""

    input: list[BaseMessage]
    output: AIMessage
    tools: list[dict[str, Any]] | None


@dataclass
class Conversation:
    messages: list[BaseMessage]
    tools: list[dict[str, Any]] | None


def merge_conversations(calls: Iterable[Call]) -> list[Conversation]:
    """ART's conversation-merging rule, over the calls of one rollout in order."""
    conversations: list[Conversation] = []
    for call in calls:
        new_non_tool = [m for m in call.input if not isinstance(m, ToolMessage)]
        if new_non_tool and isinstance(new_non_tool[-1], HumanMessage):
            new_non_tool = new_non_tool[:-1]
        grown = Conversation([*call.input, call.output], call.tools)
        for index, existing in enumerate(conversations):
            if [m for m in existing.messages if not isinstance(m, ToolMessage)] == new_non_tool:
                conversations[index] = grown
                break
        else:
            conversations.append(grown)
    return conversations


async def load_calls(
    connection: AsyncConnection, rollout_ids: Iterable[str]
) -> dict[str, list[Call]]:
    """The successful LLM calls of each rollout, rebuilt as LangChain messages."""
    streams = {f"rollout-{rollout_id}": rollout_id for rollout_id in rollout_ids}
    found: dict[str, list[Call]] = {rollout_id: [] for rollout_id in streams.values()}
    stream_ids = list(streams)
    rows: list[Any] = []
    for start in range(0, len(stream_ids), 500):
        rows += (
            await connection.execute(
                select(events.c.stream_id, events.c.data)
                .where(
                    events.c.stream_id.in_(stream_ids[start : start + 500]),
                    events.c.type == "llm.call",
                )
                .order_by(events.c.stream_id, events.c.version)
            )
        ).all()
    calls = [(row.stream_id, _as_dict(row.data)) for row in rows]
    calls = [(stream, data) for stream, data in calls if data.get("output")]
    hashes = {h for _, data in calls for h in [*data["input"], data["output"], data.get("tools")]}
    bodies = await _blob_documents(connection, {h for h in hashes if h})
    for stream, data in calls:
        inputs = from_json([bodies[h] for h in data["input"]])
        (output,) = from_json([bodies[data["output"]]])
        tools = bodies[data["tools"]] if data.get("tools") else None
        found[streams[stream]].append(Call(inputs, output, tools))
    return found


async def _blob_documents(connection: AsyncConnection, hashes: set[str]) -> dict[str, Any]:
    wanted = list(hashes)
    documents: dict[str, Any] = {}
    for start in range(0, len(wanted), 500):
        query = select(blobs.c.hash, blobs.c.body).where(
            blobs.c.hash.in_(wanted[start : start + 500])
        )
        for row in await connection.execute(query):
            documents[row.hash] = json.loads(row.body)
    return documents


def _as_dict(data: Any) -> dict[str, Any]:
    return data if isinstance(data, dict) else json.loads(data)


def build_trajectory(
    conversations: list[Conversation],
    *,
    reward: float = 0.0,
    metrics: dict[str, float | int | bool] | None = None,
    metadata: dict[str, Any] | None = None,
    logs: list[str] | None = None,
    policy_step: int | None = None,
) -> art.Trajectory:
    """An `art.Trajectory` with trainable `Choice` objects, exactly as ART builds it."""
    from art.langgraph.message_utils import convert_langgraph_messages
    from art.trajectories import History, Trajectory

    trajectory = Trajectory(
        messages_and_choices=[],
        reward=reward,
        metrics=dict(metrics or {}),
        metadata=dict(metadata or {}),
        logs=list(logs or []),
        initial_policy_version=policy_step,
        final_policy_version=policy_step,
    )
    for index, conversation in enumerate(conversations):
        converted = convert_langgraph_messages(conversation.messages)
        if index == 0:
            trajectory.messages_and_choices = converted
            trajectory.tools = conversation.tools  # type: ignore[assignment]
        else:
            trajectory.additional_histories.append(
                History(messages_and_choices=converted, tools=conversation.tools)  # type: ignore[arg-type]
            )
    return trajectory


_ROLES = {"human": "user", "ai": "assistant", "system": "system", "tool": "tool"}


def message_rows(rollout_id: str, conversations: list[Conversation]) -> list[dict[str, Any]]:
    """Rows of `trajectory_messages`: one per message of every history of the trajectory."""
    rows = []
    for history_index, conversation in enumerate(conversations):
        for message_index, message in enumerate(conversation.messages):
            num_logprobs = count_logprobs(message) if isinstance(message, AIMessage) else 0
            content = message.content
            rows.append(
                {
                    "rollout_id": rollout_id,
                    "history_index": history_index,
                    "message_index": message_index,
                    "role": _ROLES.get(message.type, message.type),
                    "content": content if isinstance(content, str) else json.dumps(content),
                    "trainable": num_logprobs > 0,
                    "tool_calls": [
                        {"id": c.get("id"), "name": c["name"], "args": c.get("args")}
                        for c in getattr(message, "tool_calls", None) or []
                    ]
                    or None,
                    "tool_call_id": getattr(message, "tool_call_id", None),
                    "num_logprobs": num_logprobs,
                }
            )
    return rows
