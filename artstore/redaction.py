"""Keeping secrets out of the store: API keys are replaced before anything is written.

A rollout's `Redactor` knows the model's inference API key, the password and the secret
query parameters of its inference URL, and every environment variable that looks like a
key or a token. It rewrites each text that goes into an event or a blob (message bodies,
tool lists, error messages, tracebacks, scenarios, results, logs), so a key that appears
in an exception's message or in a URL printed by a client is gone too.

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
from collections.abc import Iterable, Sequence
from typing import Any
from urllib.parse import parse_qsl, urlsplit, urlunsplit

REDACTED = "[REDACTED]"
MIN_SECRET_LENGTH = 8  # shorter strings would redact ordinary words

_SECRET_NAME = re.compile(r"key|token|secret|password|passwd|auth|signature|sig$", re.I)


def secrets_from_environment() -> set[str]:
    """Values of variables that hold keys or tokens (OPENAI_API_KEY, WANDB_API_KEY, ...)."""
    markers = ("API_KEY", "_TOKEN", "_SECRET", "PASSWORD")
    return {
        value
        for name, value in os.environ.items()
        if any(marker in name.upper() for marker in markers) and len(value) >= MIN_SECRET_LENGTH
    }


def secrets_in_url(url: str | None) -> set[str]:
    """The password and the values of key-like query parameters of `url`."""
    if not url:
        return set()
    try:
        parts = urlsplit(url)
        found = {parts.password} if parts.password else set()
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


# Every secret a Redactor of this process was told about (a model's key, a URL's
# password): log lines and error messages are redacted with them too (`redact_known`).
_SEEN: set[str] = set()


class Redactor:
    """Replaces every known secret in a text with `[REDACTED]`."""

    def __init__(self, secrets: Iterable[str | None] = (), *, urls: Iterable[str | None] = ()):
        found = {s for s in secrets if s and len(s) >= MIN_SECRET_LENGTH}
        for url in urls:
            found |= {s for s in secrets_in_url(url) if len(s) >= MIN_SECRET_LENGTH}
        _SEEN.update(found)
        found |= secrets_from_environment()
        # Longest first, so that a key containing another is replaced whole.
        self._secrets = sorted(found, key=len, reverse=True)

    def add(self, secrets: Iterable[str | None] = (), *, urls: Iterable[str | None] = ()) -> None:
        """Know more secrets from now on (a model's key, when a run or rollout starts)."""
        merged = Redactor(secrets, urls=urls)._secrets
        self._secrets = sorted(set(self._secrets) | set(merged), key=len, reverse=True)

    def __bool__(self) -> bool:
        return bool(self._secrets)

    def __call__(self, text: str) -> str:
        for secret in self._secrets:
            if secret in text:
                text = text.replace(secret, REDACTED)
        return text

    # --- text in pieces ----------------------------------------------------------------

    def _spans(self, joined: bytes) -> list[tuple[int, int]]:
        """The byte ranges of `joined` that hold a secret, merged where they overlap."""
        found = []
        for secret in self._secrets:
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
        spans = self._spans(joined) if self._secrets else []
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
        if not self._secrets:
            return False
        try:
            joined = "".join([entry["token"] for entry in entries])
        except (KeyError, TypeError):
            return True  # unusual entries: look at them closely
        if "token_id:" in joined:
            return True  # vLLM's `token_id:N` tokens: their text is in their bytes only
        return any(secret in joined for secret in self._secrets)


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
    """`text` without any secret this process knows: key-like environment variables and
    every key or password a Redactor was given. For log lines and error messages."""
    return Redactor(_SEEN)(text)


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
