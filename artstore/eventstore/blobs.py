"""Content-addressed bodies: a JSON document is stored once, under the sha256 of its text.

LLM-call inputs repeat the whole conversation every turn; storing each distinct message
once makes storage grow with the conversation instead of with its square.

A blob's text keeps the document as it was: keys in their order (a tool schema whose
parameters are not in alphabetical order is rendered by the chat template in the order
given, so the order is part of what the model saw) and every float, non-finite ones
included (`-Infinity`, `Infinity`, `NaN`, as Python's `json` and pydantic read them; a
token's logprob can be `-inf`). Two documents that differ only in key order are two
blobs. Event payloads are another matter: they are queried with SQL (JSONB on
PostgreSQL, which orders keys its own way), so `canonical_json` sorts their keys and
refuses what standard JSON cannot hold.

How a blob's text is kept in the `blobs` table is a codec layer under this: the row holds
either the text itself (`codec` NULL, every blob written before codecs existed) or a
form that reads back as exactly that text (`blob_codec.py`: token logprobs as columns;
`blob_deflate.py`: the text or that form compressed). The hash is always the sha256 of
the text, never of the stored form: a blob has one hash whatever form it is stored in,
the same document sent twice is stored once, and the text read back can be checked
against its hash. Code that reads blob bodies reads them through `read_blob_texts`
(their texts) or `read_stored_blobs` (each blob's text or document on demand: a rebuild
takes the documents, decoded from the compact form without a detour through the text),
never `blobs.body` itself.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

import orjson
import pydantic_core
from sqlalchemy import Connection, select

from artstore.errors import BlobReadError
from artstore.eventstore import blob_codec, blob_deflate
from artstore.schema.tables import blobs

# `json.dumps` with these arguments builds this encoder on every call; made once, it
# writes the same text (~1 us less per event).
_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), allow_nan=False)


def canonical_json(value: Any) -> str:
    """One text per value: sorted keys, no spaces, and no NaN (not JSON, refused by PostgreSQL)."""
    return _CANONICAL.encode(value)


def blob_json(value: Any) -> str:
    """The text of a blob: key order kept, no spaces, ASCII, non-finite floats kept.

    Written by pydantic's serializer (twice as fast as `json.dumps` on a response with
    hundreds of logprob entries); by `json.dumps` for what it refuses (a lone surrogate).
    """
    try:
        return pydantic_core.to_json(value, ensure_ascii=True, inf_nan_mode="constants").decode()
    except pydantic_core.PydanticSerializationError:
        return json.dumps(value, separators=(",", ":"))


def load_blob(body: str | bytes) -> Any:
    """The document a blob's text holds (non-finite floats come back as floats)."""
    return json.loads(body)


# orjson writes sorted keys 4-7x faster than `json` (a 2 KB string: 3.7 against 13.6 us).
# Types `json` refuses (datetime, dataclass, subclasses of str or int) go to `default`,
# which refuses them too, so the stdlib encoder says why.
_PAYLOAD_OPTIONS = (
    orjson.OPT_SORT_KEYS
    | orjson.OPT_PASSTHROUGH_DATETIME
    | orjson.OPT_PASSTHROUGH_DATACLASS
    | orjson.OPT_PASSTHROUGH_SUBCLASS
)


def _refuse(value: Any) -> Any:
    raise TypeError(f"{type(value).__name__} is not JSON")


def payload_json(value: Any) -> str:
    """An event payload's text: `canonical_json`'s document (sorted keys, no spaces, NaN
    refused), written faster. It is the same document, not always the same text:
    non-ASCII characters are written as themselves and an exponent without padding
    (1e-7, not 1e-07). Nothing compares payload texts (ids come from `canonical_json`).
    """
    try:
        text = orjson.dumps(value, default=_refuse, option=_PAYLOAD_OPTIONS)
    except (TypeError, orjson.JSONEncodeError):  # a lone surrogate, a 65-bit int, ...
        return canonical_json(value)  # which writes it, or says why it cannot
    # orjson writes NaN and infinities as null; only a text with a null can hold one.
    if b"null" in text and _has_non_finite(value):
        return canonical_json(value)  # raises ValueError
    return text.decode()


def _has_non_finite(value: Any) -> bool:
    """Whether a float in `value` is NaN or infinite (pydantic writes them as constants;
    neither word in its text means there is none)."""
    written = pydantic_core.to_json(value, inf_nan_mode="constants")
    return b"NaN" in written or b"Infinity" in written


def load_payload(text: str) -> Any:
    """A payload's document from its text (`payload_json`'s): exactly, integers of any
    size, every float's bits, the keys in their order. pydantic's parser is about as fast
    as orjson's, which reads a 65-bit integer as a float; `json` takes the lone
    surrogates both refuse.

    The store queues an append's payloads as text, and the projector reads each document
    back from it in the writer, as a rebuild reads the stored payload. Holding the dumped
    documents of every queued event instead kept hundreds of thousands of containers
    alive for the cyclic collector to traverse: recording a 10,000-rollout run queued in
    bulk ran three full collections, 1.5 s of 7.3 s (tools/bench_queries.py, 2026-12-02).
    """
    try:
        return pydantic_core.from_json(text)
    except ValueError:
        return json.loads(text)


def serialize(value: Any) -> str:
    """The engines' JSON serializer."""
    return canonical_json(value)


def blob_hash(body: str) -> str:
    return hashlib.sha256(body.encode()).hexdigest()


def encode_blob(value: Any) -> tuple[str, str]:
    """The (hash, body) under which `value` is stored."""
    body = blob_json(value)
    return blob_hash(body), body


def blob_row(digest: str, text: str) -> dict[str, Any]:
    """The `blobs` row that stores `text`: its compact form where it has one, deflated
    where that is shorter (`blob_deflate.py`)."""
    body, codec = blob_deflate.deflate(*blob_codec.compact(text, blob_json))
    return {"hash": digest, "body": body, "codec": codec, "size": len(body)}


def blob_text(body: str, codec: str | None) -> str:
    """A blob's text from its row's `body` and `codec`."""
    return blob_codec.expand(*blob_deflate.inflate(body, codec), blob_json)


class StoredBlob(NamedTuple):
    """A `blobs` row as stored: the text itself (`codec` None) or another form of it."""

    hash: str
    body: str
    codec: str | None

    def text(self) -> str:
        """The blob's text, character for character."""
        if self.codec is None:
            return self.body
        text = blob_text(self.body, self.codec)
        self._check(text)
        return text

    def document(self) -> Any:
        """The document the text holds, as parsing the text gives it.

        A compact body is decoded straight to the document (keys in order, every float's
        bits), not written out as text and parsed again; the text is still written out
        once to check its hash, as `text()` does.
        """
        if self.codec is None:
            try:
                return pydantic_core.from_json(self.body)  # ~2x as fast as json.loads
            except ValueError:  # a lone surrogate, which only Python's json reads
                return load_blob(self.body)
        body, codec = blob_deflate.inflate(self.body, self.codec)
        if codec is None:  # the text, deflated
            self._check(body)
            return StoredBlob(self.hash, body, None).document()
        document = blob_codec.expand_document(body, codec)
        self._check(blob_json(document))
        return document

    def _check(self, text: str) -> None:
        # A stored form is turned back into text on reading (blob_codec's docstring): its
        # hash is checked, so that no other text is ever handed out under it.
        if blob_hash(text) != self.hash:
            raise BlobReadError(
                f"blob {self.hash} ({self.codec}) does not read back as the text it was stored for"
            )


def read_stored_blobs(
    connection: Connection, hashes: Iterable[str], at_hand: Mapping[str, str] | None = None
) -> dict[str, StoredBlob]:
    """The blobs stored under `hashes`, as stored (hashes not stored are left out).

    `at_hand`: texts by hash that the caller holds already, each known to hash to its
    key (the blobs of an append's own transaction, given to its projection: an append is
    refused unless every blob's SHA-256 is its key), read from memory instead of the
    database.
    """
    found: dict[str, StoredBlob] = {}
    wanted = []
    for digest in dict.fromkeys(hashes):
        text = at_hand.get(digest) if at_hand else None
        if text is not None:
            found[digest] = StoredBlob(digest, text, None)
        else:
            wanted.append(digest)
    for start in range(0, len(wanted), 500):
        query = select(blobs.c.hash, blobs.c.body, blobs.c.codec).where(
            blobs.c.hash.in_(wanted[start : start + 500])
        )
        for row in connection.execute(query):
            found[row.hash] = StoredBlob(row.hash, row.body, row.codec)
    return found


def read_blob_texts(
    connection: Connection, hashes: Iterable[str], at_hand: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The texts of the blobs stored under `hashes` (hashes not stored are left out)."""
    found = read_stored_blobs(connection, hashes, at_hand)
    return {digest: blob.text() for digest, blob in found.items()}
