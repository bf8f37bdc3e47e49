"""The arguments of artstore's public functions, checked before anything is written.

A wrong argument is an `InvalidArgumentError` that names it: a wrong type, a name or id
that is empty or that the databases' text cannot hold (NUL, a lone surrogate: bytes that
were not UTF-8, decoded with `surrogateescape`), a value that is not JSON (NaN and the
infinities included: the store refuses them wherever they are, as JSON does). Only what
the user names is checked here; what the model saw and said is stored exactly, whatever
it holds (`artstore.capture`, `artstore.eventstore.blobs`).
"""

from __future__ import annotations

import math
import os
from collections.abc import Collection
from typing import Any

from artstore.errors import InvalidArgumentError
from artstore.eventstore.blobs import canonical_json
from artstore.eventstore.store import EventStore
from artstore.names import check_name, kind_of, unstorable_character


def check_json(argument: str, value: Any) -> Any:
    """`value` unchanged if it is JSON the store keeps (no NaN, no infinity)."""
    try:
        canonical_json(value)
    except (TypeError, ValueError) as exc:
        found = find_non_finite(value)
        if found is not None:
            keys, number = found
            where = argument + "".join(f"[{key!r}]" for key in keys)
            raise InvalidArgumentError(
                argument,
                f"is not JSON: {where} is {number} (NaN and the infinities are no JSON "
                "numbers, and the store refuses them)",
            ) from None
        raise InvalidArgumentError(argument, f"is not JSON: {exc}") from None
    return value


def find_non_finite(value: Any) -> tuple[list[Any], float] | None:
    """The keys that lead to the first NaN or infinity in `value`, and that number."""
    if isinstance(value, float) and not math.isfinite(value):
        return [], value
    if isinstance(value, dict):
        items: Any = value.items()
    elif isinstance(value, (list, tuple)):
        items = enumerate(value)
    else:
        return None
    for key, item in items:
        found = find_non_finite(item)
        if found is not None:
            return [key, *found[0]], found[1]
    return None


def check_json_object(argument: str, value: Any, *, optional: bool = True) -> dict[str, Any]:
    """A dict of JSON (None: an empty one, when `optional`)."""
    if value is None and optional:
        return {}
    if not isinstance(value, dict):
        raise InvalidArgumentError(argument, f"must be a dict (JSON), not {kind_of(value)}")
    return check_json(argument, value)


def check_whole_number(argument: str, value: Any, *, optional: bool = False) -> int | None:
    """An int (a bool is not one)."""
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgumentError(
            argument, f"must be a whole number (an int), not {kind_of(value)}"
        )
    return value


def check_choice(argument: str, value: Any, choices: Collection[str]) -> str:
    if not isinstance(value, str) or value not in choices:
        allowed = " or ".join(repr(choice) for choice in choices)
        raise InvalidArgumentError(argument, f"must be {allowed}, not {value!r}")
    return value


def check_callable(argument: str, value: Any) -> Any:
    if not callable(value):
        raise InvalidArgumentError(argument, f"must be a function, not {kind_of(value)}")
    return value


def check_model_name(value: Any, argument: str = "model") -> str:
    """The name of `value`: an `art.Model` (anything with a `name`), or a model's name."""
    name = value if isinstance(value, str) else getattr(value, "name", None)
    if not isinstance(name, str):
        raise InvalidArgumentError(
            argument, f"must be an art.Model (or the model's name), not {kind_of(value)}"
        )
    check_name(argument if isinstance(value, str) else f"{argument}.name", name)
    return name


def check_store(value: Any, argument: str = "store") -> Any:
    """An open store (`await artstore.open_store(url)`)."""
    # A `Store` wraps its `EventStore` (as `.events`); this module sits below `Store`, so
    # it recognises one by what it holds.
    if not isinstance(value, EventStore) and not isinstance(
        getattr(value, "events", None), EventStore
    ):
        raise InvalidArgumentError(
            argument, f"must be a store (await artstore.open_store(url)), not {kind_of(value)}"
        )
    return value


def check_url(value: Any) -> str | None:
    """A database URL or a SQLite file's path (a str or a path object); None: the default."""
    if value is None:
        return None
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if not isinstance(value, str):
        raise InvalidArgumentError(
            "url", f"must be a database URL or a file path (a str), not {kind_of(value)}"
        )
    problem = unstorable_character(value)
    if problem is not None:
        raise InvalidArgumentError("url", f"holds {problem}: no database can be named by it")
    return value


def check_names(*, optional: bool = False, **values: Any) -> None:
    """`check_name` for each keyword: `check_names(run=run, scorer=scorer)`."""
    for argument, value in values.items():
        check_name(argument, value, optional=optional)


def check_whole_numbers(*, optional: bool = False, **values: Any) -> None:
    """`check_whole_number` for each keyword."""
    for argument, value in values.items():
        check_whole_number(argument, value, optional=optional)


def check_art_model(value: Any, argument: str = "model") -> Any:
    """An `art.Model` (what is read of one: its `name` and `project`)."""
    if not isinstance(getattr(value, "project", None), str):
        raise InvalidArgumentError(argument, f"must be an art.Model, not {kind_of(value)}")
    check_model_name(value, argument)
    return value
