"""The root `artstore` command: options shared by every subcommand and error handling."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Awaitable, Callable
from typing import Annotated, TypeVar

import typer
from rich.console import Console
from rich.markup import escape

from artstore.errors import ArtstoreError

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

T = TypeVar("T")

app = typer.Typer(
    name="artstore",
    help="Event-sourced trajectory store for OpenPipe ART: record, replay, re-score, query.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=True,  # --install-completion / --show-completion (bash, zsh, fish, PowerShell)
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


def _print_version(wanted: bool) -> None:
    if wanted:
        from artstore import __version__

        console.print(f"artstore {__version__}", highlight=False)
        raise typer.Exit()


@app.callback()
def root(
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks on errors.")] = False,
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_print_version, is_eager=True, help="Print the version and exit."
        ),
    ] = False,
) -> None:
    State.debug = debug


class UsageError(Exception):
    """What was named on the command line cannot be used (exit status 2)."""


def say_error(message: str) -> None:
    """One line on stderr, never wrapped to the terminal's width, markup escaped."""
    err_console.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)


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
        if isinstance(exc, (ArtstoreError, ValueError, LookupError, OSError)):
            say_error(str(exc))
        else:
            lines = str(exc).strip().splitlines()
            first = lines[0] if lines else ""
            say_error(f"{type(exc).__name__}: {first} (--debug shows the traceback)")
        raise typer.Exit(1) from None


def _silence_stdout() -> None:
    """Point stdout at /dev/null so that Python's exit does not complain of the pipe."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())


def fail(message: str) -> typer.Exit:
    """Print a usage error on stderr; `raise fail(...)` exits with status 2."""
    say_error(message)
    return typer.Exit(2)


def _register_commands() -> None:
    # In the order a user reaches for them: replay first (DESIGN.md), schema last.
    from artstore.cli import db, demo, exchange, group, replay, rescore, runs, sql, trajectory, ui

    app.command("replay")(replay.replay)
    app.command("rescore")(rescore.rescore)
    app.command("runs")(runs.runs)
    app.command("show")(runs.show)
    app.command("group")(group.group)
    app.command("trajectory")(trajectory.trajectory)
    app.command("ui")(ui.ui)
    app.command("sql")(sql.sql)
    app.command("export")(exchange.export)
    app.command("import")(exchange.import_)
    app.command("demo")(demo.demo)
    app.add_typer(db.app, name="db")


_register_commands()


def main() -> None:
    try:
        app()
    except SystemExit:
        raise
    finally:
        sys.stdout.flush()
