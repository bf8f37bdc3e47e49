"""Content-addressed bodies: a JSON document is stored once, under the sha256 of its text.

LLM-call inputs repeat the whole conversation every turn; storing each distinct message
once makes storage grow with the conversation instead of with its square.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any


def canonical_json(value: Any) -> str:
    """One text per value: sorted keys, no spaces, and no NaN (not JSON, refused by PostgreSQL)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False)


class EncodedJson(str):
    """JSON text already encoded (and checked), with the document it encodes.

    The store encodes each payload once, to refuse what is not JSON before anything is
    queued; the engines' serializer passes this text through instead of encoding again.
    """

    document: Any

    @classmethod
    def of(cls, value: Any) -> EncodedJson:
        encoded = cls(canonical_json(value))
        encoded.document = value
        return encoded


def serialize(value: Any) -> str:
    """The engines' JSON serializer."""
    return value if isinstance(value, EncodedJson) else canonical_json(value)


def blob_hash(body: str) -> str:
    return hashlib.sha256(body.encode()).hexdigest()


def encode_blob(value: Any) -> tuple[str, str]:
    """The (hash, body) under which `value` is stored."""
    body = canonical_json(value)
    return blob_hash(body), body
