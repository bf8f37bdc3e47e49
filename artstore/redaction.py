"""Keeping secrets out of the store: API keys are replaced before anything is written.

A rollout's `Redactor` knows the model's inference API key, the password and the secret
query parameters of its inference URL, and every environment variable that looks like a
key or a token. It rewrites each text that goes into an event or a blob (message bodies,
tool lists, error messages, tracebacks, scenarios, results, logs), so a key that appears
in an exception's message or in a URL printed by a client is gone too.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterable
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
