"""The root `artstore` command: its subcommands, in the order a user reaches for them."""

from __future__ import annotations

import inspect
import os
import sys
from typing import Annotated, Any

import click
import typer
from typer.core import TyperCommand, TyperGroup, TyperOption

from artstore.cli import (
    archive,
    dataset,
    db,
    demo,
    exchange,
    feedback,
    group,
    replay,
    rescore,
    runs,
    serve,
    sql,
    trajectory,
    ui,
    worker,
)
from artstore.cli.shared import State, console, say_error
from artstore.names import unstorable_character

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")


# Typer's own exceptions (it carries its own click); click's for an older typer.
CommandLineError = getattr(typer, "TyperException", click.ClickException)


class OneLineErrors(TyperGroup):
    """The root command, printing usage errors (a bad option, a missing argument) as one
    line on stderr like every other error, instead of click's or rich's paragraph."""

    def main(self, *args: Any, standalone_mode: bool = True, **kwargs: Any) -> Any:
        try:
            returned = super().main(*args, standalone_mode=False, **kwargs)
        except CommandLineError as exc:
            if not standalone_mode:
                raise
            if type(exc).__name__ == "NoArgsIsHelpError":  # `artstore` alone: the help
                exc.show()
                sys.exit(exc.exit_code)
            context = getattr(exc, "ctx", None)
            where = context.command_path if context is not None else "artstore"
            hint = f" (see {where} --help)" if exc.exit_code == 2 else ""
            # Typer words a bad choice as pydantic does ("Value error, 'x' is not one of").
            message = exc.format_message().replace("Value error, ", "")
            say_error(f"{message}{hint}")
            sys.exit(exc.exit_code)
        except (typer.Abort, click.exceptions.Abort):
            if not standalone_mode:
                raise
            say_error("aborted")
            sys.exit(1)
        if not standalone_mode:
            return returned
        sys.exit(returned if isinstance(returned, int) else 0)


class TextCommand(TyperCommand):
    """A command whose text arguments (names, ids, queries, URLs) are Unicode text: an
    argument holding bytes that are not UTF-8 (Python decodes them as lone surrogates) is
    a usage error naming it, before anything runs. Paths may hold any bytes (their type
    is a path, not text)."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        rest = super().parse_args(ctx, args)
        for param in self.params:
            value = ctx.params.get(param.name or "")
            for text in value if isinstance(value, list | tuple) else [value]:
                problem = unstorable_character(text) if isinstance(text, str) else None
                if problem is not None:  # (a command line cannot hold NUL)
                    raise typer.BadParameter(f"not UTF-8 text: it holds {problem}", ctx, param)
        return rest


class QueryCommand(TextCommand):
    """`artstore sql`: a query may begin with a `--` comment, which click would take for an
    option. An argument that starts with `-` and holds whitespace is no option name: it is
    passed as the query (after `--`), and the options around it are parsed as usual."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if "--" not in args:
            queries = [a for a in args if a.startswith("-") and any(c.isspace() for c in a)]
            if queries:
                args = [a for a in args if a not in queries] + ["--", *queries]
        return super().parse_args(ctx, args)


app = typer.Typer(
    cls=OneLineErrors,
    name="artstore",
    help="Event-sourced trajectory store for OpenPipe ART: record, replay, re-score, query.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=True,  # --install-completion / --show-completion (bash, zsh, fish, PowerShell)
)


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


# Replay first (what artstore is for), schema last.
app.command("replay")(replay.replay)
app.command("rescore")(rescore.rescore)
app.command("runs")(runs.runs)
app.command("show")(runs.show)
app.command("group")(group.group)
app.command("trajectory")(trajectory.trajectory)
app.command("ui")(ui.ui)
app.command("sql", cls=QueryCommand)(sql.sql)
app.command("feedback")(feedback.feedback)
app.command("export")(exchange.export)
app.command("import")(exchange.import_)
app.command("archive")(archive.archive)
app.command("restore")(archive.restore)
app.command("worker")(worker.worker)
app.command("serve")(serve.serve)
app.add_typer(serve.token_app, name="token")
app.command("demo")(demo.demo)
app.add_typer(dataset.app, name="dataset")
app.add_typer(db.app, name="db")


def _help_in_paragraphs(typer_app: typer.Typer) -> None:
    """Give each command its docstring with every paragraph on one line: typer keeps the
    line breaks of a docstring past its first line and rich wraps those lines again, so
    on an 80-column terminal `--help` showed ragged half-lines."""
    for info in typer_app.registered_commands:
        if info.help is None and info.callback is not None:
            doc = inspect.getdoc(info.callback) or ""
            info.help = "\n\n".join(" ".join(part.split()) for part in doc.split("\n\n"))


_help_in_paragraphs(app)
_help_in_paragraphs(dataset.app)
_help_in_paragraphs(db.app)
_help_in_paragraphs(serve.token_app)


def _text_arguments(typer_app: typer.Typer) -> None:
    """Every command checks that its text arguments are text (`TextCommand`)."""
    for info in typer_app.registered_commands:
        if info.cls in (None, TyperCommand):  # (a command of its own class chose its own)
            info.cls = TextCommand


_text_arguments(app)
_text_arguments(dataset.app)
_text_arguments(db.app)
_text_arguments(serve.token_app)


def _flags_without_a_type() -> None:
    """Show a flag in `--help` without a value type: typer 0.29's rich help gives every
    option its Python type, so `--dry-run <bool>` read as if it took a value (its plain
    help, and earlier typers, leave a flag's type out). A flag given a metavar keeps it."""
    shown = getattr(TyperOption, "display_type_rich", None)  # typer 0.29's; absent before
    if shown is None or getattr(shown, "leaves_out_flags", False):
        return

    def display_type_rich(self: TyperOption, ctx: click.Context) -> str | None:
        if getattr(self, "is_flag", False) and self.metavar is None:
            return None
        return shown(self, ctx)

    display_type_rich.leaves_out_flags = True  # type: ignore[attr-defined]
    TyperOption.display_type_rich = display_type_rich  # type: ignore[method-assign]


_flags_without_a_type()


def main() -> None:
    try:
        app()
    except SystemExit:
        raise
    finally:
        sys.stdout.flush()
