"""The `artstore` command line (typer + rich).

Each group of subcommands lives in its own module and is added to `app` here. Commands
import ART and heavy modules inside their bodies, so that `artstore --help` stays quick.
"""

from artstore.cli.app import app, main

__all__ = ["app", "main"]
