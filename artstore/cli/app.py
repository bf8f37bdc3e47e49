"""The root `artstore` command: options shared by every subcommand and error handling."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Awaitable, Callable
from typing import Annotated, TypeVar

import typer
from rich.console import Console

from artstore.errors import ArtstoreError

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

T = TypeVar("T")

app = typer.Typer(
    name="artstore",
    help="Event-sourced trajectory store for OpenPipe ART: record, replay, re-score, query.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
console = Console()
err_console = Console(stderr=True)

# One --url meaning the same everywhere (defaults: $ARTSTORE_URL, then .artstore/artstore.db).
UrlOption = Annotated[
    str | None,
    typer.Option(
        "--url",
        envvar="ARTSTORE_URL",
        help="Database URL (sqlite:///path or postgresql://...). "
        "Default: $ARTSTORE_URL, then .artstore/artstore.db here.",
        show_default=False,
    ),
]


class State:
    debug = False


@app.callback()
def root(
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks on errors.")] = False,
) -> None:
    State.debug = debug


def run(work: Callable[[], Awaitable[T]]) -> T:
    """Run a command's coroutine; artstore errors become one line on stderr and exit 1."""
    try:
        return asyncio.run(work())  # type: ignore[arg-type]
    except (ArtstoreError, ValueError, LookupError, OSError) as exc:
        if State.debug:
            raise
        err_console.print(f"[bold red]error:[/] {exc}", highlight=False)
        raise typer.Exit(1) from None
    except KeyboardInterrupt:
        err_console.print("interrupted")
        raise typer.Exit(130) from None


def fail(message: str) -> typer.Exit:
    """Print a usage error on stderr; `raise fail(...)` exits with status 2."""
    err_console.print(f"[bold red]error:[/] {message}", highlight=False)
    return typer.Exit(2)


def _register_commands() -> None:
    from artstore.cli import db

    app.add_typer(db.app, name="db")


_register_commands()


def main() -> None:
    try:
        app()
    except SystemExit:
        raise
    finally:
        sys.stdout.flush()
