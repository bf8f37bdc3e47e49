"""`artstore ui`: the web viewer of a store, served on this machine."""

from __future__ import annotations

import secrets
from typing import Annotated

import typer

from artstore.cli.shared import UrlOption, console, err_console, run, say_error
from artstore.listening import is_loopback

AllowFeedbackOption = Annotated[
    bool,
    typer.Option(
        "--allow-feedback",
        help="Let the trajectory page and a run's feedback queue record feedback (a score, "
        "a label, a comment): the one thing the viewer then writes, each a POST from its "
        "own page.",
    ),
]


def ui(
    url: UrlOption = None,
    host: Annotated[
        str,
        typer.Option(
            help="Address to listen on. The default, 127.0.0.1, lets only this machine in "
            "(reach a remote store through an SSH tunnel: docs/viewer.md).",
        ),
    ] = "127.0.0.1",
    port: Annotated[
        int, typer.Option(min=0, max=65535, help="Port to listen on (0: any free port).")
    ] = 8321,
    sql_timeout: Annotated[
        float,
        typer.Option(
            "--sql-timeout",
            min=0,
            help="Stop a query of the SQL page this many seconds after it starts (0: no limit).",
        ),
    ] = 30.0,
    allow_feedback: AllowFeedbackOption = False,
) -> None:
    """Look at runs in a web browser (read-only, on this machine).

    Runs (live while they train), reward curves per scorer, train-step metrics, groups
    side by side, trajectories with each token's logprob, scorer and run comparisons,
    and read-only SQL. Nothing is written to the store, unless --allow-feedback lets the
    trajectory page and a run's feedback queue record a person's feedback. Listening
    beyond loopback, it asks for the token in the address it prints.
    """

    async def check() -> str:
        from artstore.analysis.opening import open_for_reading

        store = await open_for_reading(url)  # a bad URL is one line, before the server starts
        try:
            return store.database.location
        finally:
            await store.close()

    where = run(check)
    from artstore.viewer import serve  # the web stack: only for this command

    beyond_loopback = not is_loopback(host)
    # Beyond this machine, the address is the login: every request must carry its token.
    token = secrets.token_urlsafe(24) if beyond_loopback else None

    mode = "feedback-taking" if allow_feedback else "read-only"

    def ready(address: str) -> None:
        shown = f"{address}?token={token}" if token else address
        console.print(
            f"artstore ui: [bold]{shown}[/] ({mode} view of {where}); Ctrl-C stops it",
            highlight=False,
            soft_wrap=True,
        )
        if beyond_loopback:
            err_console.print(
                f"warning: listening on {host}: anyone who can reach this machine on port "
                f"{address.rsplit(':', 1)[1].rstrip('/')} and has the address above can read "
                "the store. Prefer --host 127.0.0.1 and an SSH tunnel.",
                highlight=False,
                soft_wrap=True,
            )

    try:
        options = {"access_token": token, "allow_feedback": allow_feedback}
        serve(url, host, port, on_ready=ready, sql_timeout=sql_timeout or None, **options)
    except KeyboardInterrupt:  # Ctrl-C: uvicorn has stopped serving; that is the way out
        err_console.print("artstore ui: stopped", highlight=False)
    except OSError as exc:
        say_error(f"cannot listen on {host}:{port}: {exc.strerror or exc} (choose another --port)")
        raise typer.Exit(1) from None
