"""The compact stored form of a blob: token logprob lists kept as columns.

An LLM output with logprobs is mostly its token entries, each written out in full:
`{"token":"Hello","logprob":-0.0123,"bytes":[72,101,108,108,111],"top_logprobs":[...]}`.
Stored as columns (the logprobs as one list, the tokens as the lengths that cut the
message's content into them, `bytes` left out where it is the UTF-8 of the token, each
key order written once) a 200-token answer takes a quarter of its text (21.9 KB -> 5.1
KB; tools/bench_capture.py). It is a codec layer under the blob store: writers hand the
store a blob's text, readers get that text back, character for character; only
`blobs.body` holds the compact form, and `blobs.codec` names it (NULL: the body is the
text itself, as every blob written before the codec existed). No SQL view reads `blobs`
(`artstore sql` may read only the views), so SQL users see nothing of the codec.

The stored form, codec `"logprob-columns/1"`, is JSON (Python's dialect, as blob text
is: `-Infinity`, `Infinity`, `NaN` allowed, everything else ASCII):

    {"document": <the document, each encoded list replaced by null>,
     "lists": [[<path>, <columns>], ...]}

`path` is the keys and indexes from the document's root to the list. A list is encoded
when it holds at least two entries, each an object with the same keys in the same order,
among them "token" (a string in every entry) and "logprob". Its columns:

    {"n": <entries>, "keys": [<key order>], "columns": {<key>: <column>, ...}}

and a column is one of

    {"values": [...]}               each entry's value as is
    {"joined": "<text>", "lengths": [...]}
                                      `token`: the tokens joined, and each one's length
                                      (in code points; not for tokens with a lone
                                      surrogate: JSON would read two joined as one)
    {"joined_at": <path>, "lengths": [...]}
                                      `token`: the same, where the joined tokens are a
                                      string of the document (the message's content):
                                      the path to it
    {"f8": "<base64>"} / {"f4": ...}  floats (every value a float), little-endian float64,
                                      or float32 where each value is one exactly: bit for
                                      bit (-0.0, -inf included; NaN is read as JSON NaN)
    {"utf8_of_token": [[i, v], ...]} `bytes`: the UTF-8 of the entry's token (a lone
                                      surrogate as its three `surrogatepass` bytes),
                                      except the entries listed with their value (a
                                      token split inside a character, null bytes)
    {"lists": [<count or null>, ...], "entries": <columns or null>}
                                      `top_logprobs`: every entry's list concatenated
                                      and encoded as columns once, with each entry's
                                      count (null: the value was null; one number:
                                      every entry's count)

The floats column takes whichever of the three forms is shortest.

What the reader gets back is checked when writing: a blob is stored compact only if
decoding the compact form and writing it out as blob text (`blob_json`) gives exactly
the text handed in; otherwise (text not written by `blob_json`, a redaction that left
the text in another form) it is stored as it is. So reading never guesses: the text
read back is the text written, and so its sha256 is the blob's hash. The document comes
back from the compact form exactly (key order, every float's bits); its text is written
again by `blob_json`, so it depends on that serializer writing numbers as it did when the
blob was stored: every read of a compact blob (its text, or its document, which a
rebuild decodes without parsing the text) writes the text out once and checks its hash,
and raises BlobReadError rather than hand out another text or document. A text with
fewer than five token entries is not tried (the compact form would be no shorter).
"""

from __future__ import annotations

import base64
import json
import struct
from collections.abc import Callable
from typing import Any

from artstore.errors import BlobReadError

CODEC = "logprob-columns/1"
_MIN_ENTRIES = 2
_MIN_TEXT = 512  # shorter texts gain too little to be worth a parse
# Below this many token entries in all, the compact form's own keys cost about what it
# saves (an answer of 4 tokens: 536 characters either way; of 5: 613 -> 564), so such a
# text is not parsed at all: recording answers of a few tokens spent ~15% of its time
# building compact forms that were then thrown away as no shorter.
_MIN_LOGPROBS = 5
_MIN_JOINED = 16  # shorter strings are not looked for among the joined tokens

Path = list[str | int]


def compact(text: str, render: Callable[[Any], str]) -> tuple[str, str | None]:
    """(stored body, codec) for a blob's text; (text, None) when it is stored as it is."""
    if len(text) < _MIN_TEXT or text.count('"logprob"') < _MIN_LOGPROBS:
        return text, None
    try:
        document = json.loads(text)
    except ValueError:
        return text, None
    found: list[tuple[Path, list[Any], list[str]]] = []
    skeleton = _replace_lists(document, [], found)
    if not found:
        return text, None
    strings = _long_strings(skeleton, [], {})
    lists = [[path, _columns(entries, keys, strings)] for path, entries, keys in found]
    body = _dumps({"document": skeleton, "lists": lists})
    if len(body) >= len(text) or render(expand_document(body)) != text:
        return text, None
    return body, CODEC


def expand(body: str, codec: str | None, render: Callable[[Any], str]) -> str:
    """A blob's text from its stored body and codec."""
    if codec is None:
        return body
    return render(expand_document(body, codec))


def expand_document(body: str, codec: str = CODEC) -> Any:
    """The document of a compact body."""
    if codec != CODEC:
        raise BlobReadError(f"unknown blob codec {codec!r} (written by a newer artstore?)")
    stored = json.loads(body)
    document = stored["document"]
    for path, columns in stored["lists"]:
        entries = _entries(columns, document)
        if not path:
            return entries  # the document is itself an encoded list
        parent = document
        for step in path[:-1]:
            parent = parent[step]
        parent[path[-1]] = entries
    return document


# --- encoding ----------------------------------------------------------------------------------


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


def _replace_lists(value: Any, path: Path, found: list[tuple[Path, list[Any], list[str]]]) -> Any:
    """`value` with each encodable list replaced by null, added to `found` with its keys."""
    if isinstance(value, dict):
        return {k: _replace_lists(v, [*path, k], found) for k, v in value.items()}
    if isinstance(value, list):
        keys = _shared_keys(value)
        if keys is not None:
            found.append((path, value, keys))
            return None
        return [_replace_lists(v, [*path, i], found) for i, v in enumerate(value)]
    return value


def _long_strings(value: Any, path: Path, strings: dict[str, Path]) -> dict[str, Path]:
    """Where each long string of the document is first (a message's content, which is
    most often its tokens joined)."""
    if isinstance(value, str) and len(value) >= _MIN_JOINED:
        strings.setdefault(value, path)
    elif isinstance(value, dict):
        for k, v in value.items():
            _long_strings(v, [*path, k], strings)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _long_strings(v, [*path, i], strings)
    return strings


def _shared_keys(entries: list[Any], minimum: int = _MIN_ENTRIES) -> list[str] | None:
    """The key order every entry has, when the list is one of token entries."""
    if len(entries) < minimum or not isinstance(entries[0], dict):
        return None
    keys = list(entries[0])
    if "token" not in keys or "logprob" not in keys:
        return None
    for entry in entries:
        if not isinstance(entry, dict) or list(entry) != keys:
            return None
        if not isinstance(entry["token"], str):
            return None
    return keys


def _columns(
    entries: list[dict[str, Any]], keys: list[str], strings: dict[str, Path] | None = None
) -> dict[str, Any]:
    columns: dict[str, Any] = {}
    for key in keys:
        values = [entry[key] for entry in entries]
        if key == "token":
            columns[key] = _token_column(values, strings or {})
        elif key == "bytes":
            columns[key] = _bytes_column(values, [entry["token"] for entry in entries])
        elif key == "top_logprobs" and (nested := _nested_column(values)) is not None:
            columns[key] = nested
        elif values and all(type(v) is float for v in values):
            columns[key] = _float_column(values)
        else:
            columns[key] = {"values": values}
    return {"n": len(entries), "keys": keys, "columns": columns}


def _token_column(tokens: list[str], strings: dict[str, Path]) -> dict[str, Any]:
    joined = "".join(tokens)
    try:
        joined.encode("utf-8")
    except UnicodeEncodeError:
        # A lone surrogate: two of them joined would be read back from JSON as one
        # character, so the tokens are kept apart.
        return {"values": tokens}
    lengths = [len(token) for token in tokens]
    if joined in strings:
        return {"joined_at": strings[joined], "lengths": lengths}
    return {"joined": joined, "lengths": lengths}


def _utf8(token: str) -> list[int]:
    # A lone surrogate gets its 3 bytes: surrogatepass, on both sides of the codec.
    return list(token.encode("utf-8", "surrogatepass"))


def _is_utf8_of(value: Any, token: str) -> bool:
    # `==` would take [72.0] or [True] for [72] / [1]: each byte must be an int.
    return isinstance(value, list) and all(type(b) is int for b in value) and value == _utf8(token)


def _bytes_column(values: list[Any], tokens: list[str]) -> dict[str, Any]:
    pairs = enumerate(zip(values, tokens, strict=True))
    others = [[i, v] for i, (v, t) in pairs if not _is_utf8_of(v, t)]
    if len(others) * 2 > len(values):
        return {"values": values}
    return {"utf8_of_token": others}


def _nested_column(values: list[Any]) -> dict[str, Any] | None:
    """Every entry's top logprobs as one list of columns, when they share a key order."""
    flat: list[Any] = []
    counts: list[int | None] = []
    for value in values:
        if value is None:
            counts.append(None)
        elif isinstance(value, list):
            counts.append(len(value))
            flat.extend(value)
        else:
            return None
    # The same count everywhere (no top logprobs asked for: all empty) is written once.
    lists: Any = counts[0] if len(set(counts)) == 1 and counts[0] is not None else counts
    if not flat:
        return {"lists": lists, "entries": None}
    keys = _shared_keys(flat, minimum=1)
    if keys is None:
        return None
    return {"lists": lists, "entries": _columns(flat, keys)}


def _float_column(values: list[float]) -> dict[str, Any]:
    as_json = {"values": values}
    packed8 = struct.pack(f"<{len(values)}d", *values)
    options = [as_json, {"f8": base64.b64encode(packed8).decode()}]
    try:
        packed4 = struct.pack(f"<{len(values)}f", *values)
    except OverflowError:
        packed4 = None
    if (
        packed4 is not None
        and struct.pack(f"<{len(values)}d", *struct.unpack(f"<{len(values)}f", packed4)) == packed8
    ):
        options.append({"f4": base64.b64encode(packed4).decode()})
    return min(options, key=lambda column: len(_dumps(column)))


# --- decoding ----------------------------------------------------------------------------------


def _entries(columns: dict[str, Any], document: Any) -> list[dict[str, Any]]:
    n, keys = columns["n"], columns["keys"]
    decoded: dict[str, list[Any]] = {}
    for key in keys:
        _column(key, n, columns, document, decoded)
    return _as_dicts(keys, [decoded[key] for key in keys])


def _as_dicts(keys: list[str], values: list[list[Any]]) -> list[dict[str, Any]]:
    """One dict per entry, keys in `keys` order, from the columns' values.

    A rebuild makes one such dict per output token: a dict display is ~2.5x as fast as a
    comprehension over the keys, so the key counts of token entries (token, logprob,
    bytes, top_logprobs) and of top logprobs (without top_logprobs) get one.
    """
    rows = zip(*values, strict=True)  # a column of another length is not read silently
    if len(keys) == 4:
        k0, k1, k2, k3 = keys
        return [{k0: a, k1: b, k2: c, k3: d} for a, b, c, d in rows]
    if len(keys) == 3:
        k0, k1, k2 = keys
        return [{k0: a, k1: b, k2: c} for a, b, c in rows]
    return [dict(zip(keys, row, strict=True)) for row in rows]


def _column(
    key: str, n: int, columns: dict[str, Any], document: Any, decoded: dict[str, list[Any]]
) -> list[Any]:
    """Column `key` of `columns`, decoded once into `decoded` (`bytes` reads the tokens)."""
    if key in decoded:
        return decoded[key]
    column = columns["columns"][key]
    values: list[Any]
    if "values" in column:
        values = column["values"]
    elif "joined" in column or "joined_at" in column:
        joined = column.get("joined")
        if joined is None:
            joined = document
            for step in column["joined_at"]:
                joined = joined[step]
        values, start = [], 0
        for length in column["lengths"]:
            values.append(joined[start : start + length])
            start += length
    elif "f8" in column:
        values = list(struct.unpack(f"<{n}d", base64.b64decode(column["f8"])))
    elif "f4" in column:
        values = list(struct.unpack(f"<{n}f", base64.b64decode(column["f4"])))
    elif "utf8_of_token" in column:
        tokens = _column("token", n, columns, document, decoded)
        # A lone surrogate gets its 3 bytes, as _utf8 wrote them.
        values = [list(token.encode("utf-8", "surrogatepass")) for token in tokens]
        for i, value in column["utf8_of_token"]:
            values[i] = value
    elif "lists" in column:
        counts = column["lists"]
        if column["entries"] is None and isinstance(counts, int) and counts == 0:
            values = [[] for _ in range(n)]  # no top logprobs asked for: the usual case
        else:
            flat = _entries(column["entries"], document) if column["entries"] is not None else []
            if isinstance(counts, int):
                counts = [counts] * n
            values, start = [], 0
            for count in counts:
                if count is None:
                    values.append(None)
                else:
                    values.append(flat[start : start + count])
                    start += count
    else:
        raise ValueError(f"unknown blob column {sorted(column)}")
    decoded[key] = values
    return values
