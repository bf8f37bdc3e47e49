"""Loading what a command names as `module:attribute` (a backend factory, a reward function).

The current directory is importable, as with `python -m`: `--reward my_rewards:score`
finds `./my_rewards.py`. A spec that cannot be used is a `UsageError` (exit status 2):
no colon, no such module, no such attribute, not the right kind of object. Code that
runs and fails (a factory that raises) is a `PluginError` (exit status 1).
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any, TypeVar

from artstore.cli.shared import UsageError
from artstore.errors import ArtstoreError

T = TypeVar("T")


class PluginError(ArtstoreError):
    """The named code ran and failed (exit status 1)."""


def load_attribute(spec: str, option: str) -> Any:
    """The object `module:attribute` (the attribute may be dotted) names."""
    module_name, colon, attribute = spec.partition(":")
    if not colon or not module_name.strip() or not attribute.strip():
        raise UsageError(
            f"{option} {spec!r} is not of the form module:attribute "
            f"(for example {_EXAMPLES.get(option, 'package.module:name')})"
        )
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and module_name.startswith(exc.name):
            raise UsageError(
                f"{option} {spec!r}: no module named {exc.name!r} (is it installed, or in "
                "the current directory?)"
            ) from None
        raise PluginError(f"{option} {spec!r}: importing {module_name} failed: {exc}") from exc
    except Exception as exc:
        raise PluginError(
            f"{option} {spec!r}: importing {module_name} failed: {type(exc).__name__}: {exc}"
        ) from exc
    value: Any = module
    for part in attribute.split("."):
        try:
            value = getattr(value, part)
        except AttributeError:
            raise UsageError(
                f"{option} {spec!r}: module {module_name} has no attribute {attribute!r}"
            ) from None
    return value


_EXAMPLES = {
    "--agent": "my_agents:agent",
    "--backend": "artstore.backends:check_only_backend",
    "--reward": "my_rewards:score",
}


def is_backend(value: Any) -> bool:
    """Whether `value` looks like an `art.Backend` (the protocol's methods are there)."""
    return all(
        callable(getattr(value, name, None))
        for name in ("register", "train", "_get_step", "_prepare_backend_for_training")
    ) and not isinstance(value, type)


def find_backend(spec: str) -> Any:
    """What `--backend module:attribute` names: an art.Backend, or a factory for one.

    Only imports: nothing is called, so a malformed spec fails before anything starts.
    """
    found = load_attribute(spec, "--backend")
    if not is_backend(found) and not callable(found):
        raise UsageError(
            f"--backend {spec!r} is a {type(found).__name__}, neither an art.Backend nor "
            "a factory that returns one"
        )
    return found


async def make_backend(found: Any, spec: str) -> Any:
    """The backend: `found` itself, or what the factory returns (called with no arguments,
    awaited when it is a coroutine)."""
    import inspect

    if is_backend(found):
        return found
    try:
        backend = found()
        if inspect.isawaitable(backend):
            backend = await backend
    except Exception as exc:
        raise PluginError(
            f"--backend {spec!r}: the factory raised {type(exc).__name__}: {exc}"
        ) from exc
    if not is_backend(backend):
        raise UsageError(
            f"--backend {spec!r} returned a {type(backend).__name__}, not an art.Backend "
            "(it needs register, train, _get_step and _prepare_backend_for_training)"
        )
    return backend


async def load_backend(spec: str) -> Any:
    """An `art.Backend` from `module:factory` or `module:attribute` (see `find_backend`)."""
    return await make_backend(find_backend(spec), spec)


def load_reward_function(spec: str) -> Any:
    """A reward function `(scenario, results, trajectories) -> rewards` from `module:name`."""
    found = load_attribute(spec, "--reward")
    if isinstance(found, type) or not callable(found):
        raise UsageError(
            f"--reward {spec!r} is a {type(found).__name__}, not a reward function "
            "(scenario, results, trajectories) -> list of rewards"
        )
    return found
