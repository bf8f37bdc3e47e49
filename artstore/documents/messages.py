"""LangChain messages to and from JSON, with LangChain's own serialisation (never pickle).

A message is stored as `message_to_dict(message)`: `{"type": ..., "data": {...fields}}`,
read back by `messages_from_dict`. The text is written by pydantic's serializer rather
than `json.dumps(message_to_dict(m))`: same document, several times faster for an
assistant message carrying hundreds of logprob entries (the cost a caller pays per call).
Dict keys keep their order (tool-call arguments as the model wrote them), and non-finite
floats are written as `-Infinity` / `Infinity` / `NaN` rather than pydantic's default
`null`: a token's logprob can be `-inf`, and `null` there would make ART's `Choice`
invalid.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from typing import Any

import pydantic_core
from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    convert_to_messages,
    messages_from_dict,
)
from langchain_core.prompt_values import PromptValue
from pydantic import BaseModel


def as_messages(value: Any) -> list[BaseMessage]:
    """The messages of a chat model's input: a list, a PromptValue, a string or tuples.

    Message objects are returned as they are (not copied).
    """
    if isinstance(value, PromptValue):
        return value.to_messages()
    if isinstance(value, str):
        return convert_to_messages([("human", value)])
    return convert_to_messages(value)


def _fallback(value: Any) -> Any:
    """JSON for what pydantic cannot serialise on its own (never a pickle)."""
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json", warnings=False)
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    return repr(value)


_serializers: dict[type, pydantic_core.SchemaSerializer] = {}
_serializers_lock = threading.Lock()


def _serializer(cls: type[BaseModel]) -> pydantic_core.SchemaSerializer:
    """The class's own pydantic serializer, writing non-finite floats as JSON constants."""
    found = _serializers.get(cls)
    if found is None:
        found = pydantic_core.SchemaSerializer(
            cls.__pydantic_core_schema__, {"ser_json_inf_nan": "constants"}
        )
        with _serializers_lock:
            found = _serializers.setdefault(cls, found)
    return found


def dump_message(message: BaseMessage) -> str:
    """`message_to_dict(message)` as JSON text.

    Keys keep their order, floats are kept whole (non-finite ones as `-Infinity`,
    `Infinity`, `NaN`), and objects that are not JSON become their `repr`.
    """
    data = dump_model(message).decode()
    return f'{{"type":{json.dumps(message.type)},"data":{data}}}'


def dump_model(model: BaseModel) -> bytes:
    """A pydantic model (an ART `Trajectory`, say) as JSON, non-finite floats kept whole."""
    serializer = _serializer(type(model))
    try:
        return serializer.to_json(model, warnings=False, fallback=_fallback)
    except pydantic_core.PydanticSerializationError:
        # A lone surrogate (a file name decoded with surrogateescape, say), which UTF-8
        # cannot hold: the same document written by `json`, other text as it is (so that
        # redaction finds a secret in it as in any other text), surrogates as \u escapes.
        document = serializer.to_python(model, mode="json", warnings=False, fallback=_fallback)
        written = json.dumps(document, separators=(",", ":"), ensure_ascii=False)
        # Only JSON strings hold surrogates, where Python's \\udcff is JSON's escape too.
        return written.encode("utf-8", "backslashreplace")


def load_message(body: str | bytes) -> BaseMessage:
    """The message a `dump_message` text describes."""
    try:
        document = pydantic_core.from_json(body)
    except ValueError:  # a lone surrogate's escape, which only Python's json reads
        document = json.loads(body)
    (message,) = messages_from_dict([document])
    return message


def from_json(documents: Sequence[dict[str, Any]]) -> list[BaseMessage]:
    return messages_from_dict(list(documents))


def count_logprobs(message: AIMessage) -> int:
    logprobs = (message.response_metadata or {}).get("logprobs") or {}
    return len(logprobs.get("content") or []) if isinstance(logprobs, dict) else 0


def token_usage(message: AIMessage) -> tuple[int | None, int | None]:
    """(prompt, completion) tokens, from usage_metadata or the provider's token_usage."""
    usage = getattr(message, "usage_metadata", None)
    if usage:
        return usage.get("input_tokens"), usage.get("output_tokens")
    raw = (message.response_metadata or {}).get("token_usage") or {}
    return raw.get("prompt_tokens"), raw.get("completion_tokens")


def tool_calls_of(message: BaseMessage) -> list[dict[str, Any]]:
    """`[{"id", "name", "args"}]` of the tool calls an assistant message asked for."""
    return [
        {"id": call.get("id"), "name": call.get("name"), "args": call.get("args")}
        for call in getattr(message, "tool_calls", None) or []
    ]
