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
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pydantic_core
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from sqlalchemy import select
from sqlalchemy.engine import Connection

from artstore.capture.messages import count_logprobs, from_json
from artstore.schema.tables import blobs, events

if TYPE_CHECKING:
    import art

logger = logging.getLogger(__name__)


@dataclass
class Call:
    """What ART's logger receives for one call: input messages, output, tools offered.

    `input_hashes` / `output_hash` are the blob hashes the messages were read from (None
    for calls built in memory): equal hashes mean equal messages, which spares the merge
    a deep comparison of logprobs.
    """

    input: list[BaseMessage]
    output: AIMessage
    tools: list[dict[str, Any]] | None
    input_hashes: list[str] | None = None
    output_hash: str | None = None


@dataclass
class Conversation:
    messages: list[BaseMessage]
    tools: list[dict[str, Any]] | None
    hashes: list[str | None] | None = None


def _without_tool_messages(
    messages: list[BaseMessage], hashes: list[str | None]
) -> list[tuple[str | None, BaseMessage]]:
    return [(h, m) for h, m in zip(hashes, messages, strict=True) if not isinstance(m, ToolMessage)]


def _same(a: list[tuple[str | None, BaseMessage]], b: list[tuple[str | None, BaseMessage]]) -> bool:
    """`[m for m in a] == [m for m in b]`, deciding by hash where both have one."""
    return len(a) == len(b) and all(
        (ha is not None and ha == hb) or ma == mb for (ha, ma), (hb, mb) in zip(a, b, strict=True)
    )


def merge_conversations(calls: Iterable[Call]) -> list[Conversation]:
    """ART's conversation-merging rule (`create_messages_from_logs`), over one rollout's calls."""
    conversations: list[Conversation] = []
    keys: list[list[tuple[str | None, BaseMessage]]] = []  # each conversation without tools
    for call in calls:
        input_hashes: list[str | None] = list(call.input_hashes or [None] * len(call.input))
        new_non_tool = _without_tool_messages(call.input, input_hashes)
        if new_non_tool and isinstance(new_non_tool[-1][1], HumanMessage):
            new_non_tool = new_non_tool[:-1]
        grown = Conversation(
            [*call.input, call.output], call.tools, [*input_hashes, call.output_hash]
        )
        for index, existing in enumerate(keys):
            if _same(existing, new_non_tool):
                conversations[index] = grown
                keys[index] = _without_tool_messages(grown.messages, grown.hashes or [])
                break
        else:
            conversations.append(grown)
            keys.append(_without_tool_messages(grown.messages, grown.hashes or []))
    return conversations


class StoredCalls:
    """The successful LLM calls of some rollouts, as stored: event payloads and blob texts.

    Read with two queries per 500 rollouts (their `llm.call` events, then the distinct
    blobs they name). `calls(rollout_id)` parses one rollout's messages when asked, each
    message once: a rebuild holds one rollout's parsed messages at a time, not all of
    them (thousands of parsed logprob entries kept alive make Python's garbage collector
    the slowest part of a rebuild).
    """

    def __init__(self, by_rollout: dict[str, list[dict[str, Any]]], bodies: dict[str, str]):
        self.by_rollout = by_rollout
        self.bodies = bodies

    @classmethod
    def load(cls, connection: Connection, rollout_ids: Iterable[str]) -> StoredCalls:
        """Read (synchronously: inside a write, or through `AsyncConnection.run_sync`)."""
        streams = {f"rollout-{rollout_id}": rollout_id for rollout_id in rollout_ids}
        by_rollout: dict[str, list[dict[str, Any]]] = {
            rollout_id: [] for rollout_id in streams.values()
        }
        stream_ids = list(streams)
        for start in range(0, len(stream_ids), 500):
            query = (
                select(events.c.stream_id, events.c.data)
                .where(
                    events.c.stream_id.in_(stream_ids[start : start + 500]),
                    events.c.type == "llm.call",
                )
                .order_by(events.c.stream_id, events.c.version)
            )
            for row in connection.execute(query):
                data = _as_dict(row.data)
                if data.get("output"):  # failed calls: ART never sees them
                    by_rollout[streams[row.stream_id]].append(data)
        hashes = {
            h
            for calls in by_rollout.values()
            for data in calls
            for h in [*data["input"], data["output"], data.get("tools")]
            if h
        }
        return cls(by_rollout, _blob_bodies(connection, hashes))

    def calls(self, rollout_id: str) -> list[Call]:
        """One rollout's calls as LangChain messages, in order."""
        built: dict[str, Any] = {}

        def document(digest: str) -> Any:
            if digest not in built:
                built[digest] = pydantic_core.from_json(self.bodies[digest])
            return built[digest]

        messages: dict[str, BaseMessage] = {}

        def message(digest: str) -> BaseMessage:
            if digest not in messages:
                messages[digest] = from_json([document(digest)])[0]
            return messages[digest]

        return [
            Call(
                input=[message(h) for h in data["input"]],
                output=message(data["output"]),  # type: ignore[arg-type]
                tools=document(data["tools"]) if data.get("tools") else None,
                input_hashes=list(data["input"]),
                output_hash=data["output"],
            )
            for data in self.by_rollout[rollout_id]
        ]


def load_calls(connection: Connection, rollout_ids: Iterable[str]) -> dict[str, list[Call]]:
    """The successful LLM calls of each rollout, rebuilt as LangChain messages."""
    stored = StoredCalls.load(connection, rollout_ids)
    return {rollout_id: stored.calls(rollout_id) for rollout_id in stored.by_rollout}


def _blob_bodies(connection: Connection, hashes: set[str]) -> dict[str, str]:
    wanted = sorted(hashes)
    bodies: dict[str, str] = {}
    for start in range(0, len(wanted), 500):
        query = select(blobs.c.hash, blobs.c.body).where(
            blobs.c.hash.in_(wanted[start : start + 500])
        )
        bodies.update({row.hash: row.body for row in connection.execute(query)})
    return bodies


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
    from art.trajectories import Trajectory

    from artstore.art_versions import history_class

    history = history_class()  # LegacyHistory on ART >= 0.5.20

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
        try:
            converted = convert_langgraph_messages(conversation.messages)
        except Exception as exc:  # ART skips a conversation it cannot convert; so do we
            logger.warning("conversation %d left out, as ART leaves it: %r", index, exc)
            continue
        if index == 0:
            trajectory.messages_and_choices = converted
            trajectory.tools = conversation.tools  # type: ignore[assignment]
        else:
            trajectory.additional_histories.append(
                history(messages_and_choices=converted, tools=conversation.tools)  # type: ignore[arg-type]
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
