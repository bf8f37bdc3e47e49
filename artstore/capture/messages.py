"""LangChain messages to and from JSON, with LangChain's own serialisation (never pickle)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    convert_to_messages,
    message_to_dict,
    messages_from_dict,
)
from langchain_core.prompt_values import PromptValue


def as_messages(value: Any) -> list[BaseMessage]:
    """The messages of a chat model's input: a list, a PromptValue, a string or tuples."""
    if isinstance(value, PromptValue):
        return value.to_messages()
    if isinstance(value, str):
        return convert_to_messages([("human", value)])
    return convert_to_messages(value)


def to_json(message: BaseMessage) -> dict[str, Any]:
    return message_to_dict(message)


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
