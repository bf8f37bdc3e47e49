"""The root `artstore` command: its subcommands, in the order a user reaches for them."""

from __future__ import annotations

import os
import sys
from typing import Annotated

import typer

from artstore.cli import db, demo, exchange, replay, rescore, runs, sql, worker
from artstore.cli.shared import State

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

app = typer.Typer(
    name="artstore",
    help="Event-sourced trajectory store for OpenPipe ART: record, replay, re-score, query.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


@app.callback()
def root(
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks on errors.")] = False,
) -> None:
    State.debug = debug


# Replay first (what artstore is for), schema last.
app.command("replay")(replay.replay)
app.command("rescore")(rescore.rescore)
app.command("runs")(runs.runs)
app.command("show")(runs.show)
app.command("sql")(sql.sql)
app.command("export")(exchange.export)
app.command("import")(exchange.import_)
app.command("worker")(worker.worker)
app.command("demo")(demo.demo)
app.add_typer(db.app, name="db")


def main() -> None:
    try:
        app()
    except SystemExit:
        raise
    finally:
        sys.stdout.flush()
