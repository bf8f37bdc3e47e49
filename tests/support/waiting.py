"""Waiting on a condition with a deadline, never for a fixed time.

A test that sleeps a fixed time and then looks passes or fails by how fast the machine is:
on a busy one, what it waited for has not happened yet. These wait until the condition
holds, looking again every `every` seconds, and fail with what was awaited once
`timeout` seconds pass: a generous deadline that only a real fault reaches.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable

import pytest


async def eventually(
    condition: Callable[[], bool | Awaitable[bool]],
    what: str,
    *,
    timeout: float = 60.0,
    every: float = 0.05,
) -> None:
    """Return once `condition()` (a function or a coroutine function) is true; fail the
    test, naming `what`, when `timeout` seconds pass first."""
    deadline = time.monotonic() + timeout
    while True:
        held = condition()
        if inspect.isawaitable(held):
            held = await held
        if held:
            return
        if time.monotonic() > deadline:
            pytest.fail(f"waited {timeout:g} s for {what}")
        await asyncio.sleep(every)


def wait_until(
    condition: Callable[[], bool], what: str, *, timeout: float = 120.0, every: float = 0.1
) -> None:
    """`eventually` outside an event loop (a browser, a subprocess)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"waited {timeout:g} s for {what}")
        time.sleep(every)
