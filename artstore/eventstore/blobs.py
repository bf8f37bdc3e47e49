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


def blob_hash(body: str) -> str:
    return hashlib.sha256(body.encode()).hexdigest()


def encode_blob(value: Any) -> tuple[str, str]:
    """The (hash, body) under which `value` is stored."""
    body = canonical_json(value)
    return blob_hash(body), body
