"""Values a checkpoint saver has decoded, kept to be handed out again as fresh copies.

A blob is content-addressed: the value its hash names never changes, so decoding it again
(base64, zlib, msgpack, and LangChain's messages validated one by one) gives the same
value every time. A saver keeps the first decoding private and hands out copies: LangGraph
gives a checkpoint's values to the graph's channels and nodes as they are, and a node may
change a message in place, which must not change what the next `get` returns, as it does
not with LangGraph's own savers (they decode anew at every read).

A copy is made as a decoding would make it: every list, dict and model new, nothing shared
with the kept value or between two copies. A list of plain data and pydantic models (a
chunk of LangChain's messages) is kept as one msgpack document of the models' fields,
which the C unpacker copies, and the models are rebuilt around those fields without
validating them again (they were validated when first decoded): a sixth of the time a
decoding takes. A dict of plain data is kept as msgpack too; anything else is copied by
`fresh`, a third of the time a decoding takes.
"""

from __future__ import annotations

import copy
from typing import Any

import ormsgpack
from pydantic import BaseModel

# Values that are never changed in place: handed out as they are.
_IMMUTABLE = frozenset({str, int, float, bool, type(None), bytes})
_set = object.__setattr__
# About the bytes a decoded value takes in memory per character of its stored text (LangChain
# messages whose text compresses to a third), to count a value kept as objects.
OBJECT_BYTES_PER_CHAR = 16


def fresh(value: Any) -> Any:
    """A deep copy of `value`, as a new decoding of the bytes it came from would give it."""
    kind = type(value)
    if kind in _IMMUTABLE:
        return value
    # Leaves are tested inline: a call per string cost as much as the copy itself.
    if kind is list:
        return [item if type(item) in _IMMUTABLE else fresh(item) for item in value]
    if kind is dict:
        return _fresh_dict(value)
    if isinstance(value, BaseModel) and kind.__deepcopy__ is BaseModel.__deepcopy__:
        return _fresh_model(value)
    return copy.deepcopy(value)


def _fresh_dict(value: dict[Any, Any]) -> dict[Any, Any]:
    return {key: item if type(item) in _IMMUTABLE else fresh(item) for key, item in value.items()}


def _fresh_model(model: BaseModel) -> BaseModel:
    """What pydantic's `__deepcopy__` makes of `model`, without its memo (a decoding shares
    nothing between values, so there is no reference to keep)."""
    kind = type(model)
    copied = kind.__new__(kind)
    _set(copied, "__dict__", _fresh_dict(model.__dict__))
    _set(copied, "__pydantic_extra__", fresh(model.__pydantic_extra__))
    _set(copied, "__pydantic_fields_set__", set(model.__pydantic_fields_set__))
    private = getattr(model, "__pydantic_private__", None)
    _set(copied, "__pydantic_private__", None if private is None else fresh(private))
    return copied


class Kept:
    """A decoded value, kept to be copied (see the module's docstring): as one msgpack
    document where it can be, which takes a sixth of the memory of the objects, else as
    the value itself. `size`: about the bytes it holds."""

    __slots__ = ("models", "packed", "size", "value")

    def __init__(self, value: Any, text_chars: int) -> None:
        self.value: Any = value
        self.packed: bytes | None = None
        # Per item of the list: None for plain data, else the model's class and fields set;
        # None for a value that is plain data throughout (a dict of lists...).
        self.models: list[tuple[type[BaseModel], set[str]] | None] | None = []
        if type(value) is list:
            self._pack(value)
        elif type(value) is dict and _is_plain(value):
            self._pack_plain(value)
        if self.packed is None:
            self.size = text_chars * OBJECT_BYTES_PER_CHAR
        else:
            self.value, self.size = None, len(self.packed)

    def copy(self) -> Any:
        if self.packed is None:
            return fresh(self.value)
        items = ormsgpack.unpackb(self.packed)
        if self.models is None:
            return items
        return [
            item if model is None else _rebuilt(*model, *item)
            for item, model in zip(items, self.models, strict=True)
        ]

    def _pack_plain(self, value: dict[str, Any]) -> None:
        try:
            self.packed, self.models = ormsgpack.packb(value), None
        except (ormsgpack.MsgpackEncodeError, TypeError):  # an integer beyond 64 bits, ...
            self.packed, self.models = None, []

    def _pack(self, items: list[Any]) -> None:
        plain: list[Any] = []
        for item in items:
            if _is_plain(item):
                plain.append(item)
                self.models.append(None)
            elif _is_plain_model(item):
                plain.append([item.__dict__, item.__pydantic_extra__])
                self.models.append((type(item), set(item.__pydantic_fields_set__)))
            else:
                self.models = []
                return
        try:
            self.packed = ormsgpack.packb(plain)
        except (ormsgpack.MsgpackEncodeError, TypeError):  # an integer beyond 64 bits, ...
            self.models = []


def _is_plain(value: Any) -> bool:
    """Whether msgpack gives `value` back as it is: str-keyed dicts, lists and scalars."""
    kind = type(value)
    if kind in _IMMUTABLE:
        return True
    if kind is list:
        return all(_is_plain(item) for item in value)
    if kind is dict:
        return all(type(key) is str and _is_plain(item) for key, item in value.items())
    return False


def _is_plain_model(value: Any) -> bool:
    """A pydantic model copied as pydantic copies it, whose fields are plain data."""
    return (
        isinstance(value, BaseModel)
        and type(value).__deepcopy__ is BaseModel.__deepcopy__
        and getattr(value, "__pydantic_private__", None) is None
        and _is_plain(value.__dict__)
        and _is_plain(value.__pydantic_extra__)
    )


def _rebuilt(
    kind: type[BaseModel], fields_set: set[str], fields: dict[str, Any], extra: Any
) -> BaseModel:
    """A model of `kind` holding `fields` (a copy): what pydantic's `__deepcopy__` makes."""
    model = kind.__new__(kind)
    _set(model, "__dict__", fields)
    _set(model, "__pydantic_extra__", extra)
    _set(model, "__pydantic_fields_set__", set(fields_set))
    _set(model, "__pydantic_private__", None)
    return model


class DecodedBlobs(dict):
    """Decoded values (`Kept`) by blob hash (or by the typed form an event holds), the
    newest up to `size` bytes in all. Looked up from the thread a read runs on, filled on
    the event loop: single dict operations, each atomic in CPython, never an iteration
    there.

    A value is kept the second time it is decoded: keeping one costs two fifths of a
    decoding, which a value read once (the last, partial chunk of the checkpoint a graph
    resumes from) would pay for nothing. `seen`: the hashes of the keys decoded once."""

    def __init__(self, size: int, seen: int = 4096) -> None:
        super().__init__()
        self.size, self.held = size, 0
        self._seen: dict[int, None] = {}
        self._seen_size = seen

    def decoded_before(self, key: Any) -> bool:
        """Whether `key` was decoded before (among the last `seen` first decodings);
        remembered as decoded from now on."""
        if hash(key) in self._seen:
            return True
        self._seen[hash(key)] = None
        while len(self._seen) > self._seen_size:
            del self._seen[next(iter(self._seen))]
        return False

    def add(self, key: Any, kept: Kept) -> None:
        if key in self or kept.size > self.size:
            return
        self[key] = kept
        self.held += kept.size
        while self.held > self.size:
            self.held -= self.pop(next(iter(self))).size
