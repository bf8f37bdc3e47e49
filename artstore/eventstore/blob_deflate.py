"""The outer layer of a blob's stored form: its body compressed with zlib (issue 29).

SQLite compresses nothing, and PostgreSQL only values over ~2 KB, while a blob's text is
mostly words and JSON keys that zlib shrinks well. So a body, the blob's text or its
compact form (`blob_codec.py`), is stored deflated where that is shorter: zlib's stream
of the body's UTF-8 in base64, so that `blobs.body` stays ASCII text in both databases
(base64 costs a third, still well under the text). On the 1,000-rollout corpus of
tools/corpus.py the `blobs` table went from 57.9 to 38.6 MiB on SQLite and from 43.2 to
37.2 MiB on PostgreSQL (tools/bench_size.py). It costs CPU: recording 200 rollouts of
that corpus into SQLite took 3.4-3.5 s of the process's CPU against 2.8-3.1 s without it
(two rounds each, interleaved); level 1 would save about half of zlib's share for bodies
6% larger. `blobs.codec` names the layers, outer first: `deflate/1` is the text
deflated, `deflate/1:logprob-columns/1` its compact form deflated. No SQL view reads
`blobs`, so nothing a user queries changes; readers get the same text back, checked
against its hash (`blobs.StoredBlob`).
"""

from __future__ import annotations

import base64
import binascii
import zlib

from artstore.errors import BlobReadError

DEFLATE = "deflate/1"
_MIN_BODY = 200  # shorter bodies seldom shrink once zlib's header and base64 are paid
_LEVEL = 6  # level 9 gains <0.1% on blob texts for ~20% more CPU


def deflate(body: str, codec: str | None) -> tuple[str, str | None]:
    """(body, codec) with the deflate layer added where it makes the body shorter."""
    if len(body) < _MIN_BODY:
        return body, codec
    packed = base64.b64encode(zlib.compress(body.encode("utf-8", "surrogatepass"), _LEVEL))
    if len(packed) >= len(body):
        return body, codec
    return packed.decode("ascii"), DEFLATE if codec is None else f"{DEFLATE}:{codec}"


def inflate(body: str, codec: str | None) -> tuple[str, str | None]:
    """(body, codec) with the deflate layer taken off, if the body has one."""
    if codec is None or (codec != DEFLATE and not codec.startswith(DEFLATE + ":")):
        return body, codec
    try:
        text = zlib.decompress(base64.b64decode(body, validate=True))
        inner = text.decode("utf-8", "surrogatepass")
    except (binascii.Error, zlib.error, UnicodeDecodeError, ValueError) as exc:
        raise BlobReadError(f"a {DEFLATE} blob body does not inflate: {exc}") from None
    return inner, codec[len(DEFLATE) + 1 :] or None
