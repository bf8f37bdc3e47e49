"""Running `artstore ...` in the test's own process.

A subprocess pays Python's start and the command's imports (ART's among them: seconds)
on every call; in-process, a command costs what it does. Tests run commands this way
unless the process boundary is the point (signals, a crash, a terminal, import cost, the
README's commands as pasted): those start `artstore` as a subprocess.

A command run here shares the test process, so what it may leave behind is put back
after each call: the environment (typer's CliRunner restores it), the credentials the
process has learned (`artstore.redaction`), the root logger's handlers (`artstore
worker` configures logging) and `--debug`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


@contextmanager
def process_state_kept() -> Iterator[None]:
    """Put back what a command may change in this process's state."""
    from artstore import redaction
    from artstore.cli.shared import State

    known = redaction._known
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    debug = State.debug
    try:
        yield
    finally:
        redaction._known = known
        root.handlers[:] = handlers
        root.setLevel(level)
        State.debug = debug


def run_artstore(
    *args: Any, columns: int = 200, input: str | bytes | None = None, env: dict | None = None
) -> Any:
    """Run `artstore ARGS...` in this process, as its console script would.

    The result (click's) has exit_code, stdout, stderr, output and exception. Rich tables
    are as wide as `columns` (a terminal's width; 80 when output is piped). Not from a
    running event loop: commands run their own (`run_artstore_in_thread` there).
    """
    from typer.testing import CliRunner

    from artstore.cli import app

    with process_state_kept():
        return CliRunner().invoke(
            app,
            [str(a) for a in args],
            input=input,
            env={"COLUMNS": str(columns), **(env or {})},
        )


async def run_artstore_in_thread(*args: Any, **options: Any) -> Any:
    """`run_artstore` from an async test: the command runs its own event loop in a thread."""
    return await asyncio.to_thread(run_artstore, *args, **options)
