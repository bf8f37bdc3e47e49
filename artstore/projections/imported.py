"""Imported trajectories: projected from their `trajectory.imported` event, not from LLM calls.

An imported rollout (`artstore import`) has no `llm.call` events: its histories were stored
as they were, each item (a message dict, or an openai `Choice` dumped to JSON) a
content-addressed blob. `imported_trajectory` rebuilds the `art.Trajectory` item for item,
`Choice` objects and their logprobs included, and ART's captured `exchanges` where the
source held them (ART >= 0.5.20 only: on 0.5.18 such a trajectory cannot be built, and
ArtVersionError says so); `imported_message_rows` fills `trajectory_messages` with the same
columns a recorded rollout gets (exchanges give no rows: they are not messages of a history).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from sqlalchemy.engine import Connection

from artstore.art_api import trajectory_class
from artstore.art_versions import history_class, trajectory_exchanges
from artstore.events import TrajectoryImported
from artstore.eventstore.blobs import read_blob_texts

if TYPE_CHECKING:
    import art


def blob_hashes(events: Iterable[TrajectoryImported]) -> set[str]:
    """Every blob an imported trajectory refers to."""
    found: set[str] = set()
    for event in events:
        for history in event.histories:
            found.update(history.items)
            if history.tools:
                found.add(history.tools)
        if event.exchanges:
            found.add(event.exchanges)
    return found


def load_bodies(
    connection: Connection, hashes: Iterable[str], at_hand: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """The JSON documents stored under `hashes` (`at_hand`: as `read_stored_blobs`)."""
    texts = read_blob_texts(connection, hashes, at_hand)
    return {digest: json.loads(text) for digest, text in texts.items()}


def history_items(event: TrajectoryImported, bodies: dict[str, Any]) -> list[tuple[list, Any]]:
    """(messages_and_choices, tools) of each history, `Choice` objects rebuilt."""
    from openai.types.chat.chat_completion import Choice

    histories = []
    for history in event.histories:
        choices = set(history.choices)
        items = [
            Choice.model_validate(bodies[digest]) if index in choices else bodies[digest]
            for index, digest in enumerate(history.items)
        ]
        histories.append((items, bodies[history.tools] if history.tools else None))
    return histories


def imported_trajectory(
    event: TrajectoryImported,
    bodies: dict[str, Any],
    *,
    reward: float = 0.0,
    metrics: dict[str, float | int | bool] | None = None,
    metadata: dict[str, Any] | None = None,
    logs: list[str] | None = None,
    policy_step: int | None = None,
) -> art.Trajectory:
    """The `art.Trajectory` of an imported rollout; reward and metrics as for any rollout."""
    history = history_class()  # LegacyHistory on ART >= 0.5.20

    histories = history_items(event, bodies)
    (main, tools), *additional = histories or [([], None)]
    # ART 0.5.18 has no `exchanges`: ArtVersionError (the event keeps them for a newer ART).
    exchanges = (
        {"exchanges": trajectory_exchanges(bodies[event.exchanges], f"rollout {event.rollout_id}")}
        if event.exchanges
        else {}
    )
    return trajectory_class()(
        **exchanges,
        messages_and_choices=main,
        tools=tools,
        additional_histories=[
            history(messages_and_choices=items, tools=history_tools)
            for items, history_tools in additional
        ],
        reward=reward,
        metrics=dict(metrics or {}),
        metadata=dict(metadata or {}),
        logs=list(logs or []),
        initial_policy_version=event.initial_policy_version,
        final_policy_version=event.final_policy_version,
    )


def imported_message_rows(
    event: TrajectoryImported, bodies: dict[str, Any]
) -> list[dict[str, Any]]:
    """Rows of `trajectory_messages` for an imported trajectory (as `message_rows` makes them).

    `trainable` means what it means for a recorded rollout: a `Choice` carrying logprobs.
    """
    rows = []
    for history_index, history in enumerate(event.histories):
        choices = set(history.choices)
        for message_index, digest in enumerate(history.items):
            item = bodies[digest]
            if message_index in choices:
                message = item.get("message") or {}
                num_logprobs = len((item.get("logprobs") or {}).get("content") or [])
            else:
                message, num_logprobs = item, 0
            content = message.get("content")
            rows.append(
                {
                    "rollout_id": event.rollout_id,
                    "history_index": history_index,
                    "message_index": message_index,
                    "role": message.get("role") or "assistant",
                    "content": content
                    if content is None or isinstance(content, str)
                    else json.dumps(content),
                    "trainable": num_logprobs > 0,
                    "tool_calls": [_tool_call(call) for call in message.get("tool_calls") or []]
                    or None,
                    "tool_call_id": message.get("tool_call_id"),
                    "num_logprobs": num_logprobs,
                }
            )
    return rows


def _tool_call(call: dict[str, Any]) -> dict[str, Any]:
    """`{"id", "name", "args"}` of a tool call in OpenAI's or LangChain's form."""
    function = call.get("function") or {}
    args = call.get("args")
    if args is None and "arguments" in function:
        try:
            args = json.loads(function["arguments"])
        except (TypeError, ValueError):
            args = function["arguments"]
    return {"id": call.get("id"), "name": call.get("name") or function.get("name"), "args": args}
