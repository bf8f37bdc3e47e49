"""A saver keeps the blobs it decoded and hands out copies: each copy equals a new decoding
of the stored bytes (types included), shares nothing with the kept value or another copy,
and a graph changing a value it got in place leaves what the next `get` returns as stored."""

from __future__ import annotations

import datetime
import uuid

import pytest
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

from artstore.langgraph import checkpointer
from artstore.langgraph.decoded import DecodedBlobs, Kept

SERDE = JsonPlusSerializer()


def messages() -> list:
    return [
        SystemMessage("be brief", id="s"),
        HumanMessage(
            [{"type": "text", "text": "look"}, {"type": "image_url", "image_url": {"url": "x"}}],
            id="h",
            name="ann",
        ),
        AIMessage(
            "",
            id="a",
            tool_calls=[{"name": "search", "args": {"q": "x", "n": [1, 2.5]}, "id": "c1"}],
            usage_metadata={"input_tokens": 3, "output_tokens": 4, "total_tokens": 7},
            response_metadata={"model": "m", "logprobs": None},
            additional_kwargs={"refusal": None, "nested": {"deep": [True, b"raw"]}},
        ),
        ToolMessage("found", tool_call_id="c1", artifact={"rows": [[1, "a"]]}, id="t"),
        AIMessage("done", id="d", custom_field="kept as an extra"),
        {"plain": ["data", 1]},
        "text",
        None,
    ]


def decoded(value):
    """A new decoding of what LangGraph's serializer writes of `value`."""
    return SERDE.loads_typed(SERDE.dumps_typed(value))


def mutable_parts(value, found=None) -> dict[int, object]:
    """Every list, dict, set and model reachable from `value`, by id."""
    found = {} if found is None else found
    if isinstance(value, list | dict | set) or hasattr(value, "__dict__"):
        found[id(value)] = value
    children = []
    if isinstance(value, dict):
        children = list(value.values())
    elif isinstance(value, list | tuple | set):
        children = list(value)
    elif hasattr(value, "__pydantic_fields_set__"):
        children = [value.__dict__, value.__pydantic_extra__]
    elif hasattr(value, "__dict__"):
        children = [vars(value)]
    for child in children:
        mutable_parts(child, found)
    return found


def assert_a_new_decoding(copy, kept_value, original) -> None:
    expected = decoded(original)
    assert copy == expected
    assert [type(item) for item in copy] == [type(item) for item in expected]
    for got, want in zip(copy, expected, strict=True):
        if hasattr(want, "__pydantic_fields_set__"):
            assert got.__pydantic_fields_set__ == want.__pydantic_fields_set__
            assert got.__pydantic_extra__ == want.__pydantic_extra__
            assert list(got.__dict__) == list(want.__dict__)
    assert not mutable_parts(copy).keys() & mutable_parts(kept_value).keys()


def test_a_list_of_messages_and_plain_data_is_copied_through_msgpack():
    original = messages()
    value = decoded(original)
    kept = Kept(value, 100)
    assert kept.packed is not None and kept.value is None  # the fast way, bytes only
    first, second = kept.copy(), kept.copy()
    assert_a_new_decoding(first, value, original)
    assert not mutable_parts(first).keys() & mutable_parts(second).keys()


def test_values_msgpack_would_not_give_back_as_they_are_are_copied_one_by_one():
    others = [
        {1: "an integer key"},
        datetime.datetime(2026, 12, 5, tzinfo=datetime.UTC),
        uuid.UUID(int=7),
        {"ids": {3, 4}},
        ToolMessage("x", tool_call_id="c", artifact={"when": datetime.date(2026, 1, 1)}),
    ]
    for other in others:
        original = [*messages(), other]
        value = decoded(original)
        kept = Kept(value, 100)
        assert kept.packed is None and kept.value is value, other
        assert_a_new_decoding(kept.copy(), value, original)
    too_large = Kept([HumanMessage("x"), 2**70], 100)  # beyond msgpack's integers
    assert too_large.packed is None and too_large.copy() == too_large.value
    plain = {"rows": [[1, "a", None, 2.5, True]], "by": {"x": b"raw"}}
    kept = Kept(decoded(plain), 100)
    assert kept.packed is not None
    copies = [kept.copy(), kept.copy()]
    assert copies[0] == decoded(plain) and copies[0]["rows"] is not copies[1]["rows"]
    not_a_list = {"messages": messages()}
    kept = Kept(decoded(not_a_list), 100)
    copy = kept.copy()
    assert copy == decoded(not_a_list)
    assert not mutable_parts(copy).keys() & mutable_parts(kept.value).keys()


def test_decoded_blobs_keep_the_newest_up_to_their_size():
    value = Kept([HumanMessage("x")], 100)
    kept = DecodedBlobs(size=2 * value.size + 1)
    for name in "abc":
        kept.add(name, value)
    assert list(kept) == ["b", "c"] and kept.held == 2 * value.size
    kept.add("as objects", Kept([{1: "an integer key"}], kept.size))
    assert "as objects" not in kept  # counted at OBJECT_BYTES_PER_CHAR per character


def test_a_value_is_kept_from_its_second_decoding():
    kept = DecodedBlobs(size=1000, seen=2)
    assert [kept.decoded_before(key) for key in ("a", "a", ("b", "t"), "c", "a")] == [
        False,
        True,
        False,
        False,
        False,  # forgotten: the last 2 first decodings are remembered
    ]


def long_text(n: int) -> str:
    """Text that compresses little: a chunk of such messages is kept in a blob."""
    return " ".join(str(n * k * 7919 % 100_003) for k in range(80))


def short_text(n: int) -> str:
    """Text that compresses well: a chunk of such messages is kept in the event."""
    return f"step {n} " * 30


@pytest.mark.parametrize(("text", "kept"), [(long_text, 3), (short_text, 2)])
async def test_a_value_changed_in_place_after_a_get_is_read_back_as_stored(store, text, kept):
    saver = checkpointer(store)
    conversation = [AIMessage(text(n), id=str(n), additional_kwargs={"n": [n]}) for n in range(40)]
    config = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
    checkpoint = {
        "v": 4,
        "id": "1ef00000001",
        "ts": "2026-12-05T00:00:00+00:00",
        "channel_values": {"messages": conversation},
        "channel_versions": {"messages": 1},
        "versions_seen": {},
        "updated_channels": ["messages"],
    }
    await saver.aput(config, checkpoint, {}, {"messages": 1})
    for _ in range(3):  # read, decoded and kept, then copies of what was kept
        found = await saver.aget_tuple(config)
        got = found.checkpoint["channel_values"]["messages"]
        assert got == conversation
        got[0].content = "changed"
        got[1].additional_kwargs["n"].append("changed")
        got.append(HumanMessage("changed"))
    # Its chunks, kept: blobs (the last one of 8 messages too), or typed forms in the event
    # (each over DECODED_INLINE_FROM_CHARS, the last one under it).
    assert len(saver._decoded) == kept
    assert all(isinstance(key, str) == (text is long_text) for key in saver._decoded)
