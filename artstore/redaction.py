"""Keeping credentials out of the store: each one artstore sees is replaced before anything
is written or printed.

Where artstore sees credentials, and learns them (`learn`), before it builds anything
that could hold them:

- every request an httpx client of this process sends, once a store was opened to write
  (`artstore.capture.credentials`): its `Authorization` header (the credential after the
  scheme, and for `Basic` the password it encodes), headers whose name says key, token,
  secret, password or auth (`api-key`, `x-api-key`, `x-goog-api-key`, ...), cookies, the
  password of its URL and the values of key-like query parameters (`?key=`, `api_key=`);
- a model's `inference_api_key` and the secret parts of its `inference_base_url`, when a
  rollout, a run or a recorded group of that model starts;
- the password of the database URL the store was opened with;
- the environment (`secrets_from_environment`): the value of every variable whose name
  ends in KEY, TOKEN, SECRET, PASSWORD or PASSWD (OPENAI_API_KEY, ANTHROPIC_API_KEY,
  WANDB_API_KEY, HF_TOKEN, AWS_SECRET_ACCESS_KEY, PGPASSWORD, ...), and the password of
  every variable whose value is a URL; read again whenever a rollout starts.

What a process has learned holds for all of it: every `Redactor` (the store's, which
rewrites every event before it is queued; each rollout's, which rewrites blobs, error
messages, tracebacks, scenarios, results and logs) and `redact_known` (log lines, error
messages of the command line) replace each known credential with `[REDACTED]`.

Only a string that cannot be ordinary text is a credential (`is_secret`): at least 8
characters, and either 24 characters or more or a mix of at least two kinds among
letters, digits and other characters. "EMPTY", "sk-", "password" or "12345678" as a key
would otherwise redact words and numbers from every conversation.

A model that repeats a key spells it over several tokens (`"sk"`, `"-"`, `"local"`, ...):
each token alone holds no secret, but joined they do. `Redactor.pieces` and
`Redactor.token_logprobs` rewrite text that arrives in pieces (stream deltas, logprob
tokens) so that the pieces join to the redacted text: the piece where a secret starts
holds `[REDACTED]` in its place, the other pieces lose the secret's characters, and the
number of pieces (tokens, with their logprob values) stays the same.
"""

from __future__ import annotations

import logging
import os
import re
import threading
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple
from urllib.parse import parse_qsl, unquote, urlsplit, urlunsplit

REDACTED = "[REDACTED]"
MIN_SECRET_LENGTH = 8  # shorter strings would redact ordinary words
# From this length, a string of one kind of character (a random key of letters only) is
# a credential too; shorter, it could be a word or a number.
LONG_SECRET_LENGTH = 24

_SECRET_NAME = re.compile(r"key|token|secret|password|passwd|auth|signature|sig$", re.I)
_SECRET_VARIABLE = re.compile(r"(KEY|TOKEN|SECRET|PASSWORD|PASSWD)$", re.I)


def is_secret(value: Any) -> bool:
    """Whether `value` is redacted wherever it appears (see the module docstring)."""
    if not isinstance(value, str) or len(value) < MIN_SECRET_LENGTH:
        return False
    if len(value) >= LONG_SECRET_LENGTH:
        return True
    kinds = {"letter" if c.isalpha() else "digit" if c.isdigit() else "other" for c in value}
    return len(kinds) >= 2


def secrets_from_environment() -> set[str]:
    """Credentials in the environment: values of variables named like keys or tokens
    (OPENAI_API_KEY, HF_TOKEN, PGPASSWORD, ...) and passwords of URLs."""
    found: set[str] = set()
    for name, value in os.environ.items():
        if _SECRET_VARIABLE.search(name):
            found.add(value)
        elif "://" in value:
            found |= secrets_in_url(value)
    return {value for value in found if is_secret(value)}


def secrets_in_url(url: str | None) -> set[str]:
    """The password and the values of key-like query parameters of `url`."""
    if not url:
        return set()
    try:
        parts = urlsplit(url)
        # As written in the URL (percent-encoded) and as the password it stands for.
        found = {parts.password, unquote(parts.password)} if parts.password else set()
    except ValueError:
        return set()
    found |= {value for name, value in parse_qsl(parts.query) if _SECRET_NAME.search(name)}
    return {secret for secret in found if secret}


def redact_url(url: str) -> str:
    """`url` with its password and key-like query parameters replaced by `[REDACTED]`."""
    try:
        parts = urlsplit(url)
        netloc = parts.netloc
        if parts.password:
            netloc = netloc.replace(f":{parts.password}@", f":{REDACTED}@", 1)
    except ValueError:
        return REDACTED
    query = "&".join(
        f"{name}={REDACTED if _SECRET_NAME.search(name) else value}"
        for name, value in parse_qsl(parts.query, keep_blank_values=True)
    )
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


# --- what this process knows ----------------------------------------------------------------


class _Known(NamedTuple):
    """The credentials known, grouped by their first characters, each group with the
    prefix its members share: one search for it tells whether any of them can be in a
    text (a test process knows many `sk-local-...` keys; a text that holds none is
    searched once for them all). A group of one is searched for whole (a long needle is
    found or ruled out faster than its prefix)."""

    secrets: frozenset[str]
    groups: tuple[tuple[str, tuple[str, ...]], ...]


_known = _Known(frozenset(), ())
_learning = threading.Lock()


def _grouped(secrets: frozenset[str]) -> _Known:
    groups: dict[str, list[str]] = {}
    for secret in secrets:
        groups.setdefault(secret[:MIN_SECRET_LENGTH], []).append(secret)
    return _Known(
        secrets,
        tuple((_shared_prefix(found), tuple(found)) for found in groups.values()),
    )


def _shared_prefix(texts: list[str]) -> str:
    """The longest prefix of all `texts` (that of the first and last in sorted order)."""
    first, last = min(texts), max(texts)
    pairs = zip(first, last, strict=False)
    size = next((i for i, (a, b) in enumerate(pairs) if a != b), min(len(first), len(last)))
    return first[:size]


def learn(secrets: Iterable[str | None] = (), *, urls: Iterable[str | None] = ()) -> None:
    """Know these credentials (and those of these URLs) from now on, in the whole process."""
    global _known
    found = {secret for secret in secrets if is_secret(secret)}
    for url in urls:
        found |= {secret for secret in secrets_in_url(url) if is_secret(secret)}
    if found <= _known.secrets:  # the usual case: known already, nothing to take
        return
    with _learning:
        _known = _grouped(_known.secrets | found)


def learn_environment() -> None:
    """Know the credentials the environment holds now (`secrets_from_environment`)."""
    learn(secrets_from_environment())


def known_secrets() -> frozenset[str]:
    """Every credential this process knows."""
    return _known.secrets


def _in_text(text: str) -> list[str]:
    """The known credentials that `text` holds, longest first. (A plain loop: this runs
    for every text written, and most texts hold none.)"""
    found: list[str] = []
    for prefix, group in _known.groups:
        if prefix in text:
            found += [secret for secret in group if secret in text]
    if len(found) > 1:  # longest first, so that a key containing another is replaced whole
        found.sort(key=len, reverse=True)
    return found


class Redactor:
    """Replaces every credential this process knows with `[REDACTED]`.

    `Redactor(secrets, urls=...)` and `add(...)` learn more credentials (for the whole
    process, see `learn`); the environment's are learned when a Redactor is made. `own`
    secrets are this Redactor's alone (the token of one served rollout, of which a
    server makes thousands: the process need not search every text for each).
    """

    def __init__(
        self,
        secrets: Iterable[str | None] = (),
        *,
        urls: Iterable[str | None] = (),
        own: Iterable[str | None] = (),
    ):
        learn_environment()
        learn(secrets, urls=urls)
        self.own = tuple(secret for secret in own if is_secret(secret))

    def add(self, secrets: Iterable[str | None] = (), *, urls: Iterable[str | None] = ()) -> None:
        """Know more secrets from now on (a model's key, when a run or rollout starts)."""
        learn(secrets, urls=urls)

    def __bool__(self) -> bool:
        return bool(_known.secrets or self.own)

    def __call__(self, text: str) -> str:
        for secret in self._found(text):
            text = text.replace(secret, REDACTED)
        return text

    def _found(self, text: str) -> list[str]:
        """The credentials `text` holds, the process's and this Redactor's, longest first."""
        found = _in_text(text)
        mine = [secret for secret in self.own if secret in text]
        if mine:
            found = sorted({*found, *mine}, key=len, reverse=True)
        return found

    # --- text in pieces ----------------------------------------------------------------

    def _spans(self, joined: bytes) -> list[tuple[int, int]]:
        """The byte ranges of `joined` that hold a secret, merged where they overlap."""
        found = []
        for secret in self._found(joined.decode(errors="replace")):
            needle = secret.encode()
            start = joined.find(needle)
            while start >= 0:
                found.append((start, start + len(needle)))
                start = joined.find(needle, start + 1)
        merged: list[tuple[int, int]] = []
        for start, end in sorted(found):
            if merged and start <= merged[-1][1]:
                merged[-1] = (merged[-1][0], max(merged[-1][1], end))
            else:
                merged.append((start, end))
        return merged

    def _rewrite(self, pieces: Sequence[bytes]) -> dict[int, bytes]:
        """{index: new bytes} of the pieces that hold part of a secret (none: {})."""
        joined = b"".join(pieces)
        spans = self._spans(joined) if self else []
        if not spans:
            return {}
        rewritten: dict[int, bytes] = {}
        start = 0
        for index, piece in enumerate(pieces):
            end = start + len(piece)
            touching = [(a, b) for a, b in spans if a < end and b > start]
            if touching:
                out, position = bytearray(), start
                for a, b in touching:
                    out += joined[position : max(a, start)]
                    if a >= start:  # the secret starts in this piece: it holds the marker
                        out += REDACTED.encode()
                    position = min(b, end)
                out += joined[position:end]
                rewritten[index] = bytes(out)
            start = end
        return rewritten

    def pieces(self, texts: Sequence[str]) -> list[str] | None:
        """`texts` rewritten so that they join to the redacted join; None if nothing was."""
        rewritten = self._rewrite([text.encode() for text in texts])
        if not rewritten:
            return None
        return [rewritten[i].decode() if i in rewritten else text for i, text in enumerate(texts)]

    def token_logprobs(self, entries: Sequence[dict[str, Any]]) -> list[dict[str, Any]] | None:
        """OpenAI logprob entries whose tokens together spell a secret, rewritten.

        A token's text is its `bytes` (vLLM's `token_id:N` tokens carry the text there
        only), else its `token`. Every token that holds part of a secret gets the
        rewritten text as `token` and `bytes` (a `token_id:N` would give the secret back
        through the tokenizer), and its `top_logprobs` alternatives become `[REDACTED]`
        (the sampled token is usually among them); logprob values are kept. Returns a new
        list, or None when no secret is spelled.
        """
        if not self._may_spell_secret(entries):
            return None
        texts = [_token_bytes(entry) for entry in entries]
        rewritten = self._rewrite(texts)
        if not rewritten:
            return None
        marker = {"token": REDACTED, "bytes": list(REDACTED.encode())}
        result = list(entries)
        for index, text in rewritten.items():
            entry = dict(entries[index])
            entry["token"] = text.decode(errors="replace")
            entry["bytes"] = list(text)
            if entry.get("top_logprobs"):
                entry["top_logprobs"] = [
                    {**alternative, **marker} if isinstance(alternative, dict) else alternative
                    for alternative in entry["top_logprobs"]
                ]
            result[index] = entry
        return result

    def _may_spell_secret(self, entries: Sequence[dict[str, Any]]) -> bool:
        """A quick look at the tokens' joined text (most answers spell no secret)."""
        if not self:
            return False
        try:
            joined = "".join([entry["token"] for entry in entries])
        except (KeyError, TypeError):
            return True  # unusual entries: look at them closely
        if "token_id:" in joined:
            return True  # vLLM's `token_id:N` tokens: their text is in their bytes only
        return bool(self._found(joined))


def _token_bytes(entry: Any) -> bytes:
    if not isinstance(entry, dict):
        return b""
    raw = entry.get("bytes")
    if isinstance(raw, list):
        try:
            return bytes(raw)
        except (TypeError, ValueError):
            pass  # not bytes after all: the token's text says it
    token = entry.get("token")
    return token.encode(errors="surrogatepass") if isinstance(token, str) else b""


def redact_known(text: str) -> str:
    """`text` without any credential this process knows (the environment's read again).
    For log lines and error messages."""
    return Redactor()(text)


class RedactingFilter(logging.Filter):
    """Rewrites each record of a logger with its secrets redacted (`redact_known`)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        redacted = redact_known(message)
        if redacted != message:
            record.msg, record.args = redacted, None
        return True


def redacting_logger(name: str) -> logging.Logger:
    """`logging.getLogger(name)`, whose records never carry a known secret."""
    logger = logging.getLogger(name)
    if not any(isinstance(f, RedactingFilter) for f in logger.filters):
        logger.addFilter(RedactingFilter())
    return logger
