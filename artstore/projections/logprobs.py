"""ART's `ChoiceLogprobs` built straight from a stored logprobs document, without validation.

A rebuilt trajectory holds one `ChatCompletionTokenLogprob` per output token (200 per call
in a typical agent): validating them one by one is most of what building ART's `Choice`
objects costs. `choice_logprobs` builds the same objects directly when the document has
exactly the shape validation would accept unchanged (every key a field, strings, floats,
lists of ints), and returns None for anything else, where the caller lets pydantic
validate as ART does. The objects it builds equal validated ones field by field: the same
`__dict__` (fields in their declared order, defaults filled in), the fields given as
`__pydantic_fields_set__`, no extra fields, no private attributes. Lists are copied,
never shared with the document.
"""

from __future__ import annotations

from typing import Any

from openai.types.chat.chat_completion import ChoiceLogprobs
from openai.types.chat.chat_completion_token_logprob import ChatCompletionTokenLogprob, TopLogprob

_TOKEN_FIELDS = frozenset(
    ChatCompletionTokenLogprob.model_fields
)  # token, bytes, logprob, top_logprobs
_TOP_FIELDS = frozenset(TopLogprob.model_fields)  # token, bytes, logprob
_LOGPROBS_FIELDS = frozenset(ChoiceLogprobs.model_fields)  # content, refusal

_new = object.__new__
_set = object.__setattr__


class _NotPlain(Exception):
    """The document needs pydantic's validation (a coercion, an extra key, a missing field)."""


def _built(cls: type, values: dict[str, Any], given: Any) -> Any:
    """A model instance as pydantic-core leaves it after validating `values`."""
    model = _new(cls)
    _set(model, "__dict__", values)
    _set(model, "__pydantic_fields_set__", set(given))
    _set(model, "__pydantic_extra__", {})
    _set(model, "__pydantic_private__", None)
    return model


def _int_list(value: Any) -> list[int] | None:
    if value is None:
        return None
    if type(value) is not list or not all(type(item) is int for item in value):
        raise _NotPlain
    return value.copy()


def _top_logprob(document: Any) -> TopLogprob:
    if type(document) is not dict or not document.keys() <= _TOP_FIELDS:
        raise _NotPlain
    token, logprob = document.get("token"), document.get("logprob")
    if type(token) is not str or type(logprob) is not float:
        raise _NotPlain
    values = {"token": token, "bytes": _int_list(document.get("bytes")), "logprob": logprob}
    return _built(TopLogprob, values, document)


def _token_logprob(document: Any) -> ChatCompletionTokenLogprob:
    if type(document) is not dict or not document.keys() <= _TOKEN_FIELDS:
        raise _NotPlain
    token, logprob, top = (
        document.get("token"),
        document.get("logprob"),
        document.get("top_logprobs"),
    )
    if type(token) is not str or type(logprob) is not float or type(top) is not list:
        raise _NotPlain
    values = {
        "token": token,
        "bytes": _int_list(document.get("bytes")),
        "logprob": logprob,
        "top_logprobs": [_top_logprob(item) for item in top],
    }
    return _built(ChatCompletionTokenLogprob, values, document)


def _tokens(value: Any) -> list[ChatCompletionTokenLogprob] | None:
    if value is None:
        return None
    if type(value) is not list:
        raise _NotPlain
    return [_token_logprob(item) for item in value]


def choice_logprobs(document: Any) -> ChoiceLogprobs | None:
    """`ChoiceLogprobs.model_validate(document)` where that changes nothing, else None."""
    if type(document) is not dict or not document.keys() <= _LOGPROBS_FIELDS:
        return None
    try:
        values = {
            "content": _tokens(document.get("content")),
            "refusal": _tokens(document.get("refusal")),
        }
    except _NotPlain:
        return None
    return _built(ChoiceLogprobs, values, document)
