"""What a name or id may hold: the text both databases keep as it is.

The event store checks stream ids here, and `artstore.arguments` every name a user gives.
"""

from __future__ import annotations

import re
from typing import Any

from artstore.errors import InvalidArgumentError

# What neither database can hold in a name or id: NUL (PostgreSQL's text) and lone
# surrogates (UTF-8). A projection would store U+FFFD for them, and two names would meet.
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


def kind_of(value: Any) -> str:
    return "None" if value is None else f"a {type(value).__name__}"


def unstorable_character(text: str) -> str | None:
    """What in `text` a name cannot hold, in words (None: nothing)."""
    found = _UNSTORABLE.search(text)
    if found is None:
        return None
    character = found.group()
    if character == "\x00":
        return f"the NUL character at position {found.start()}"
    byte = f" (the byte 0x{ord(character) - 0xDC00:02x})" if character >= "\udc80" else ""
    return (
        f"a lone surrogate {character!r} at position {found.start()}{byte}, "
        "which is not Unicode text"
    )


def check_name(argument: str, value: Any, *, optional: bool = False) -> str | None:
    """A name or id (a run, scorer, model, rollout or group): a str the databases can hold."""
    if value is None and optional:
        return None
    if not isinstance(value, str):
        raise InvalidArgumentError(argument, f"must be a name (a str), not {kind_of(value)}")
    if not value.strip():
        raise InvalidArgumentError(argument, "must not be empty")
    problem = unstorable_character(value)
    if problem is not None:
        raise InvalidArgumentError(argument, f"holds {problem}: a name cannot hold it")
    return value
