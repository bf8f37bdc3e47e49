"""What every command shares: the consoles, the `--url` option, and running a command with
its errors as one line on stderr.

Command modules import this module, never `artstore.cli.app` (which imports them).
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Annotated, TypeVar

import typer
from rich.console import Console
from rich.markup import escape

from artstore.errors import ArtstoreError

T = TypeVar("T")

console = Console()
err_console = Console(stderr=True)

# One --url meaning the same everywhere (defaults: $ARTSTORE_URL, then .artstore/artstore.db).
UrlOption = Annotated[
    str | None,
    typer.Option(
        "--url",
        envvar="ARTSTORE_URL",
        metavar="URL",
        help="Database URL (sqlite:///path or postgresql://...). "
        "Default: $ARTSTORE_URL, then .artstore/artstore.db here.",
        show_default=False,
    ),
]


class State:
    """Options of the root command that every subcommand obeys."""

    debug = False


class UsageError(Exception):
    """What was named on the command line cannot be used (exit status 2)."""


def say_error(message: str) -> None:
    """One line on stderr, never wrapped to the terminal's width, markup escaped, and
    without any secret this process knows (an API key in an agent's exception)."""
    from artstore.redaction import redact_known

    line = " ".join(redact_known(message).splitlines()) or "(no message)"
    err_console.print(f"[bold red]error:[/] {escape(line)}", highlight=False, soft_wrap=True)


def run(work: Callable[[], Awaitable[T]]) -> T:
    """Run a command's coroutine with every error as one line on stderr.

    A UsageError exits 2; an artstore error (or ValueError, LookupError, OSError) exits 1;
    anything else exits 1 with its type named. A traceback only with `--debug`.
    """
    try:
        return asyncio.run(work())  # type: ignore[arg-type]
    except KeyboardInterrupt:
        err_console.print("interrupted")
        raise typer.Exit(130) from None
    except BrokenPipeError:  # `artstore export RUN - | head`: the reader has had enough
        _silence_stdout()
        raise typer.Exit(0) from None
    except Exception as exc:
        if State.debug:
            raise
        if isinstance(exc, UsageError):
            say_error(str(exc))
            raise typer.Exit(2) from None
        if isinstance(exc, (ArtstoreError, ValueError, LookupError, OSError)) and not (
            isinstance(exc, KeyError) and not isinstance(exc, ArtstoreError)
        ):
            say_error(str(exc))
        else:  # (a KeyError's message is the key alone: it is named)
            lines = str(exc).strip().splitlines()
            first = lines[0] if lines else ""
            say_error(f"{type(exc).__name__}: {first} (--debug shows the traceback)")
        raise typer.Exit(1) from None


def _silence_stdout() -> None:
    """Point stdout at /dev/null so that Python's exit does not complain of the pipe."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())


def read_text_file(path: Path) -> str:
    """The UTF-8 text of `path` ('-': standard input); a UsageError (one line) when it
    cannot be read or is not UTF-8."""
    try:
        data = sys.stdin.buffer.read() if str(path) == "-" else path.read_bytes()
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        where = "standard input" if str(path) == "-" else str(path)
        raise UsageError(
            f"{where}: not UTF-8 text (the byte 0x{data[exc.start]:02x} at offset {exc.start})"
        ) from None


def fail(message: str) -> typer.Exit:
    """Print a usage error on stderr; `raise fail(...)` exits with status 2."""
    say_error(message)
    return typer.Exit(2)
