"""Keeping secrets out of the store: API keys are replaced before anything is written."""

from __future__ import annotations

import os
from collections.abc import Iterable

REDACTED = "[REDACTED]"
MIN_SECRET_LENGTH = 8  # shorter strings would redact ordinary words


def secrets_from_environment() -> set[str]:
    """Values of variables that hold keys or tokens (OPENAI_API_KEY, WANDB_API_KEY, ...)."""
    markers = ("API_KEY", "_TOKEN", "_SECRET")
    return {
        value
        for name, value in os.environ.items()
        if any(marker in name.upper() for marker in markers) and len(value) >= MIN_SECRET_LENGTH
    }


class Redactor:
    """Replaces every known secret in a text with `[REDACTED]`."""

    def __init__(self, secrets: Iterable[str | None] = ()) -> None:
        found = {s for s in secrets if s and len(s) >= MIN_SECRET_LENGTH}
        found |= secrets_from_environment()
        # Longest first, so that a key containing another is replaced whole.
        self._secrets = sorted(found, key=len, reverse=True)

    def __call__(self, text: str) -> str:
        for secret in self._secrets:
            if secret in text:
                text = text.replace(secret, REDACTED)
        return text
