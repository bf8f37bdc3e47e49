"""Blobs stored in a compact form read back as exactly the text written (issue 13 item 4).

Randomized round trips with a fixed seed: documents with token logprob lists carrying
every awkward value (non-finite floats, -0.0, ints, tokens with lone surrogates and NUL,
`bytes` that are not the token's UTF-8, null top logprobs, entries with keys missing or
in another order), first through the codec, then through the store on SQLite and
PostgreSQL; blobs stored before the codec existed (codec NULL) still read back.
"""

from __future__ import annotations

import json
import math
import random
import struct
from typing import Any

import pytest
from sqlalchemy import insert, select

from artstore.errors import BlobReadError
from artstore.events import RunFinished
from artstore.eventstore import NO_STREAM
from artstore.eventstore.blob_codec import CODEC, compact, expand_document
from artstore.eventstore.blob_deflate import DEFLATE, inflate
from artstore.eventstore.blobs import (
    StoredBlob,
    blob_hash,
    blob_json,
    blob_row,
    blob_text,
    read_stored_blobs,
)
from artstore.schema.tables import blobs

SEED = 20261201

ODD_FLOATS = [
    -math.inf,
    math.inf,
    math.nan,
    -0.0,
    0.0,
    5e-324,
    -1.7976931348623157e308,
    1e-7,
    1e16,
    -9.5367431640625e-07,  # exactly a float32
    -0.10000000149011612,  # float32's 0.1, widened
]
ODD_TOKENS = ["\x00", "\ud800", "a\udfffb", "\U0001f600", "é", " ", "", '"\\', "\u2028", "Ġthe"]


ALPHABET = "abcdefghijklmnopqrstuvwxyz ,.'\"\\\n\t\x00é漢\U0001f600\u2028"
SURROGATES = "\ud83d\ude00\udfff"  # a pair split over two tokens joins as one character


def random_token(rng: random.Random, odd: bool) -> str:
    """A token; an `odd` list's tokens may hold lone surrogates and the odd tokens."""
    if odd and rng.random() < 0.15:
        return rng.choice(ODD_TOKENS)
    alphabet = ALPHABET + SURROGATES if odd else ALPHABET
    return "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 6)))


def random_logprob(rng: random.Random) -> Any:
    roll = rng.random()
    if roll < 0.1:
        return rng.choice(ODD_FLOATS)
    if roll < 0.15:
        return rng.choice([0, -3, -(2**70)])  # ints stay ints
    if roll < 0.4:
        return struct.unpack("<f", struct.pack("<f", -rng.random() * 20))[0]  # vLLM's float32
    if roll < 0.7:
        return -round(rng.random() * 5, 6)
    return -rng.random() * 30


def random_bytes(rng: random.Random, token: str) -> Any:
    roll = rng.random()
    if roll < 0.8:
        return list(token.encode("utf-8", "surrogatepass"))
    if roll < 0.9:
        return list(token.encode("utf-8", "surrogatepass"))[:1]  # a character split
    return rng.choice([None, [], [255, 0], [72.0]])


def random_entry(rng: random.Random, keys: list[str], depth: int, odd: bool) -> dict[str, Any]:
    token = random_token(rng, odd)
    values = {
        "token": token,
        "logprob": random_logprob(rng),
        "bytes": random_bytes(rng, token),
        "top_logprobs": random_top(rng, depth, odd),
        "id": rng.randint(0, 150_000),
    }
    return {key: values[key] for key in keys}


def random_top(rng: random.Random, depth: int, odd: bool) -> Any:
    if depth > 0:
        return []
    roll = rng.random()
    if roll < 0.1:
        return None
    if roll < 0.3:
        return []
    keys = ["token", "logprob", "bytes"] if rng.random() < 0.9 else ["token", "bytes", "logprob"]
    return [random_entry(rng, keys, depth + 1, odd) for _ in range(rng.randint(1, 5))]


def random_entries(rng: random.Random) -> list[Any]:
    keys = ["token", "logprob", "bytes", "top_logprobs"]
    if rng.random() < 0.2:
        keys = rng.sample([*keys, "id"], rng.randint(2, 5))
        if "token" not in keys:
            keys.append("token")
    odd = rng.random() < 0.5
    entries = [random_entry(rng, keys, 0, odd) for _ in range(rng.randint(0, 60))]
    if entries and rng.random() < 0.1:  # one entry unlike the others: stored as it is
        odd = dict(entries[-1])
        odd.pop(keys[-1])
        entries[-1] = odd
    if entries and rng.random() < 0.05:
        entries[0] = dict(reversed(list(entries[0].items())))
    return entries


def random_document(rng: random.Random) -> Any:
    """An LLM output in one of the shapes blobs hold them."""
    content = {"content": random_entries(rng), "refusal": rng.choice([None, random_entries(rng)])}
    # Most often a message's text is its tokens joined (the codec points at it then).
    tokens = [e.get("token", "") for e in content["content"] if isinstance(e, dict)]
    text = "".join(tokens) if rng.random() < 0.7 else "answer"
    shape = rng.randrange(4)
    if shape == 0:  # a LangChain AIMessage, as capture dumps it
        return {
            "lc": 1,
            "type": "constructor",
            "kwargs": {"content": text, "response_metadata": {"logprobs": content}},
        }
    if shape == 1:  # an OpenAI response (HTTP capture)
        return {"id": "c", "choices": [{"index": 0, "logprobs": content}, {"logprobs": None}]}
    if shape == 2:  # ART's Choice in a recorded trajectory
        return [{"finish_reason": "stop", "logprobs": content}, {"role": "user", "content": text}]
    return content["content"]  # a bare list


def same(a: Any, b: Any) -> bool:
    """Equal in type, key order and every float's bits (NaN is JSON's one NaN)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return struct.pack("<d", a) == struct.pack("<d", b) or (math.isnan(a) and math.isnan(b))
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def test_compact_form_reads_back_as_the_same_text_and_document():
    rng = random.Random(SEED)
    compacted = 0
    for _ in range(600):
        document = random_document(rng)
        text = blob_json(document)
        row = blob_row(blob_hash(text), text)
        assert blob_text(row["body"], row["codec"]) == text
        assert row["size"] == len(row["body"])
        body, codec = compact(text, blob_json)  # the columns layer alone
        json.loads(body)  # still JSON
        if codec is not None:
            compacted += 1
            assert codec == CODEC and len(body) < len(text)
            assert same(expand_document(body), json.loads(text))
            assert row["codec"] in (CODEC, f"{DEFLATE}:{CODEC}")
    assert compacted > 300  # most of them: the codec is not skipped


def test_a_stored_blob_gives_the_document_its_text_holds():
    """What a rebuild reads: the document, decoded from the compact form without the text."""
    rng = random.Random(SEED + 2)
    for _ in range(600):
        document = random_document(rng)
        text = blob_json(document)
        row = blob_row(blob_hash(text), text)
        stored = StoredBlob(row["hash"], row["body"], row["codec"])
        assert same(stored.document(), json.loads(text))
        assert stored.text() == text
    lone = blob_json(["\ud800", {"a": -math.inf}])  # plain, with what only Python's json reads
    assert same(StoredBlob(blob_hash(lone), lone, None).document(), ["\ud800", {"a": -math.inf}])


def test_a_compact_body_decoded_to_another_document_is_refused():
    entries = [{"token": "a", "logprob": -0.5, "bytes": [97], "top_logprobs": []}] * 40
    text = blob_json({"logprobs": {"content": entries}})
    other = blob_json({"logprobs": {"content": entries[:-1]}})
    row = blob_row(blob_hash(other), other)
    stored = StoredBlob(blob_hash(text), row["body"], row["codec"])  # another list's body
    with pytest.raises(BlobReadError):
        stored.document()
    with pytest.raises(BlobReadError):
        stored.text()


def test_a_logprob_list_is_stored_in_a_fraction_of_its_text():
    rng = random.Random(SEED)
    entries = [
        {
            "token": f" w{i}",
            "logprob": -round(rng.random() * 4, 6),
            "bytes": list(f" w{i}".encode()),
            "top_logprobs": [],
        }
        for i in range(200)
    ]
    entries[3]["logprob"] = -math.inf
    text = blob_json({"logprobs": {"content": entries, "refusal": None}})
    body, codec = compact(text, blob_json)
    assert codec == CODEC and len(body) < 0.3 * len(text)
    row = blob_row(blob_hash(text), text)
    assert len(row["body"]) <= len(body) and blob_text(row["body"], row["codec"]) == text


def test_text_the_codec_cannot_reproduce_is_stored_as_it_is():
    entries = [{"token": "a", "logprob": -1.5, "bytes": [97]}] * 40
    # Spaced like json.dumps' default, not like blob_json: kept as written.
    text = json.dumps({"logprobs": {"content": entries}})
    assert compact(text, blob_json) == (text, None)
    assert blob_row(blob_hash(text), text)["codec"] == DEFLATE  # only deflated
    assert blob_row("h", "[1, 2]") == {"hash": "h", "body": "[1, 2]", "codec": None, "size": 6}


async def test_blobs_round_trip_through_the_store(store):
    rng = random.Random(SEED + 1)
    texts = {}
    for _ in range(120):
        text = blob_json(random_document(rng))
        texts[blob_hash(text)] = text
    hashes = list(texts)
    for n, start in enumerate(range(0, len(hashes), 40)):
        chunk = {h: texts[h] for h in hashes[start : start + 40]}
        await store.append(f"run-{n}", [RunFinished(run=str(n))], NO_STREAM, blobs=chunk)
    assert await store.get_blobs(hashes) == texts
    async with store.database.read() as connection:
        rows = (await connection.execute(select(blobs.c.hash, blobs.c.codec))).all()
    assert sum((row.codec or "").endswith(CODEC) for row in rows) > 60


async def test_blobs_stored_before_the_codec_still_read_back(store):
    """A row as written before codecs existed: the text itself, codec NULL."""
    entries = [{"token": "\ud800", "logprob": -math.inf, "bytes": None, "top_logprobs": None}] * 50
    text = blob_json({"logprobs": {"content": entries}})
    digest = blob_hash(text)
    async with store.database.write() as connection:
        await connection.execute(insert(blobs).values(hash=digest, body=text, size=len(text)))
    assert await store.get_blobs([digest]) == {digest: text}
    # Sent again by a writer that has the codec: stored once, the old row left as it is.
    await store.append("run-x", [RunFinished(run="x")], NO_STREAM, blobs={digest: text})
    async with store.database.read() as connection:
        rows = (await connection.execute(select(blobs.c.body, blobs.c.codec))).all()
    assert [(row.body, row.codec) for row in rows] == [(text, None)]


async def test_a_compact_body_that_does_not_read_back_as_its_text_is_refused(store):
    entries = [{"token": "a", "logprob": -0.5, "bytes": [97], "top_logprobs": []}] * 40
    text = blob_json({"logprobs": {"content": entries}})
    row = blob_row(blob_hash(text), text)
    assert row["codec"] == f"{DEFLATE}:{CODEC}"
    other = blob_json({"logprobs": {"content": entries[:-1]}})
    wrong = {**blob_row(blob_hash(other), other), "hash": row["hash"]}  # another list's body
    async with store.database.write() as connection:
        await connection.execute(insert(blobs).values(**wrong))
    with pytest.raises(BlobReadError):
        await store.get_blobs([row["hash"]])


async def test_texts_at_hand_are_read_from_memory_and_the_rest_from_the_table(store):
    """What an append's projection gets for the blobs the append itself carried (each
    checked to hash to its key when the append was queued: tests/eventstore/test_eventstore.py)."""
    entries = [{"token": "b", "logprob": -0.25, "bytes": [98], "top_logprobs": []}] * 40
    stored = blob_json({"logprobs": {"content": entries}})
    in_memory = blob_json({"role": "user", "content": "only in memory"})
    await store.append(
        "run-m", [RunFinished(run="m")], NO_STREAM, blobs={blob_hash(stored): stored}
    )
    at_hand = {blob_hash(in_memory): in_memory}
    wanted = [blob_hash(stored), blob_hash(in_memory), "0" * 64]  # the last: nowhere
    async with store.database.read() as connection:
        found = await connection.run_sync(read_stored_blobs, wanted, at_hand)
    assert {digest: blob.text() for digest, blob in found.items()} == {
        blob_hash(stored): stored,
        blob_hash(in_memory): in_memory,
    }
    assert found[blob_hash(stored)].codec == f"{DEFLATE}:{CODEC}"  # the row, as stored
    assert found[blob_hash(in_memory)].codec is None  # the text, from memory
    assert found[blob_hash(in_memory)].document() == {"role": "user", "content": "only in memory"}


# --- the deflate layer (issue 29) ---------------------------------------------------------


def test_deflated_bodies_read_back_as_the_same_text_and_document():
    rng = random.Random(SEED + 3)
    deflated = 0
    prose = " ".join(
        rng.choice(["alpha", "beta", "gamma", "\u00e9t\u00e9", "\x00"]) for _ in range(400)
    )
    documents = [random_document(rng) for _ in range(300)]
    documents += [{"role": "tool", "content": prose}, ["\ud800", prose, {"a": -math.inf}]]
    for document in documents:
        text = blob_json(document)
        row = blob_row(blob_hash(text), text)
        stored = StoredBlob(row["hash"], row["body"], row["codec"])
        assert stored.text() == text and blob_text(row["body"], row["codec"]) == text
        assert same(stored.document(), json.loads(text))
        if (row["codec"] or "").startswith(DEFLATE):
            deflated += 1
            assert row["body"].isascii() and len(row["body"]) < len(text)
            assert inflate(row["body"], row["codec"])[1] in (None, CODEC)
    assert deflated > 200


def test_a_deflated_body_that_does_not_inflate_or_hash_is_refused():
    prose = blob_json({"role": "tool", "content": "words and more words " * 40})
    row = blob_row(blob_hash(prose), prose)
    assert row["codec"] == DEFLATE
    for body, digest in ((row["body"][:-8] + "AAAAAAA=", row["hash"]), (row["body"], "0" * 64)):
        stored = StoredBlob(digest, body, row["codec"])
        with pytest.raises(BlobReadError):
            stored.text()
        with pytest.raises(BlobReadError):
            stored.document()


async def test_deflated_blobs_round_trip_byte_identical_through_the_store(store):
    """Both databases: every text read back is the text appended, character for character."""
    rng = random.Random(SEED + 4)
    words = ["the", "of", "tool", "result", "\u00fcber", "\u2603", "page", "row"]
    texts = {}
    for _ in range(60):
        prose = " ".join(rng.choice(words) for _ in range(rng.randrange(10, 3000)))
        for document in ({"type": "tool", "data": {"content": prose}}, random_document(rng)):
            text = blob_json(document)
            texts[blob_hash(text)] = text
    await store.append("run-d", [RunFinished(run="d")], NO_STREAM, blobs=texts)
    assert await store.get_blobs(list(texts)) == texts
    async with store.database.read() as connection:
        rows = (await connection.execute(select(blobs.c.hash, blobs.c.codec))).all()
        found = await connection.run_sync(read_stored_blobs, list(texts))
    assert sum((row.codec or "").startswith(DEFLATE) for row in rows) >= 60
    for digest, blob in found.items():
        assert blob.text() == texts[digest]
        assert same(blob.document(), json.loads(texts[digest]))
