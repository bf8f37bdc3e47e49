"""Event payloads are written by orjson (`payload_json`), with the standard library's
encoder where orjson cannot say the same: the document stored is the one `canonical_json`
describes (sorted keys, every character and float as given, NaN refused), on SQLite and
PostgreSQL."""

from __future__ import annotations

import json
import math
import random
from datetime import UTC, datetime

import pytest

from artstore.errors import InvalidEventError
from artstore.events import Event, event_type
from artstore.eventstore.blobs import canonical_json, load_payload, payload_json


@event_type("test.payload_document")
class PayloadDocument(Event):
    document: object  # pydantic's JSON dump writes a NaN in here as null
    score: float | None = None  # and keeps this one a float: the store refuses it


ODD_TEXTS = [
    "",
    "é😀\u2028\x7f\x1f",
    "\ud800 lone surrogate",
    "NaN",
    "Infinity",
    "null",
    'quote " and \\ backslash',
]
ODD_NUMBERS = [0, -0.0, 1e-7, 1e16, 5e-324, 1.7976931348623157e308, 0.1, 2**63, -(2**64) - 1]


def random_document(rng: random.Random, depth: int = 0) -> object:
    """A JSON document: nested objects and lists of odd texts, numbers, booleans and null."""
    choice = rng.randrange(7 if depth < 3 else 4)
    if choice == 0:
        return rng.choice(ODD_TEXTS) + "".join(chr(rng.randrange(1, 0x3000)) for _ in range(3))
    if choice == 1:
        return rng.choice([*ODD_NUMBERS, rng.random() * 10 ** rng.randrange(-20, 20)])
    if choice == 2:
        return rng.choice([True, False, None])
    if choice == 3:
        return rng.randrange(-(2**40), 2**40)
    if choice in (4, 5):  # keys in no particular order, odd ones included
        keys = [rng.choice(ODD_TEXTS) + str(rng.randrange(100)) for _ in range(rng.randrange(5))]
        return {key: random_document(rng, depth + 1) for key in keys}
    return [random_document(rng, depth + 1) for _ in range(rng.randrange(4))]


def _surrogate(document: object) -> bool:
    return any(0xD800 <= ord(c) <= 0xDFFF for c in json.dumps(document, ensure_ascii=False))


def test_the_text_holds_the_canonical_document_with_sorted_keys():
    rng = random.Random(13)
    for _ in range(2000):
        document = {"value": random_document(rng)}
        text = payload_json(document)
        assert json.loads(text) == json.loads(canonical_json(document)) == document
        # Keys come out sorted at every level, as they do from canonical_json.
        assert json.loads(text, object_pairs_hook=_sorted_pairs) is not None


def test_the_document_read_back_from_the_text_is_the_one_encoded():
    """What the projector reads: every value as encoded (a 65-bit integer stays an int, a
    lone surrogate stays a surrogate, a float keeps its bits), keys sorted as stored."""
    rng = random.Random(17)
    documents = [{"value": random_document(rng)} for _ in range(2000)]
    documents += [{"big": 2**70 + 1, "small": -(2**64) - 1}, {"s": "\udc80 lone"}]
    for document in documents:
        read = load_payload(payload_json(document))
        assert json.dumps(read) == json.dumps(document, sort_keys=True)  # bits and order
        assert read == document
    assert type(load_payload(payload_json({"big": 2**70 + 1}))["big"]) is int


def _sorted_pairs(pairs: list[tuple[str, object]]) -> dict:
    keys = [key for key, _ in pairs]
    assert keys == sorted(keys)
    return dict(pairs)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_a_non_finite_float_is_refused_wherever_it_is(bad):
    for document in ({"x": bad}, {"a": None, "b": [1, {"c": bad}]}, [None, bad]):
        with pytest.raises(ValueError, match="JSON"):
            payload_json(document)


def test_what_json_refuses_is_refused():
    with pytest.raises(TypeError):
        payload_json({"when": datetime.now(UTC)})


async def test_odd_payloads_are_stored_as_given_on_each_database(store):
    rng = random.Random(7)
    # An event holding a lone surrogate is refused before it is encoded (pydantic's dump).
    documents = [d for d in (random_document(rng) for _ in range(250)) if not _surrogate(d)]
    documents += [{"n": None, "s": "NaN"}, {"big": 2**70}, {"é": "😀", "tiny": 1e-7}]
    events = [PayloadDocument(document=document) for document in documents]
    await store.append("payloads", events[:100])  # one transaction of 100
    for event in events[100:]:  # and alone, each committed on its own
        await store.append("payloads", [event])
    stored = [recorded.decode().document for recorded in await store.read_stream("payloads")]
    assert stored == documents

    with pytest.raises(InvalidEventError, match="JSON"):
        await store.append("payloads", [PayloadDocument(document={"a": None}, score=math.nan)])
    assert len(await store.read_stream("payloads")) == len(documents)
