"""`artstore serve` (a recording OpenAI-compatible proxy and rollout API) and `artstore token`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from artstore.cli.shared import UrlOption, console, err_console, run, say_error

token_app = typer.Typer(no_args_is_help=True, help="Tokens of `artstore serve`.")


Upstream = Annotated[
    str,
    typer.Option(
        help="Base URL of the OpenAI-compatible inference server calls go to "
        "(e.g. http://127.0.0.1:8000/v1).",
    ),
]
Host = Annotated[str, typer.Option(help="Address to listen on; any but loopback requires tokens.")]
Port = Annotated[int, typer.Option(min=0, max=65535, help="Port to listen on (0: any free port).")]
UpstreamKey = Annotated[
    str | None,
    typer.Option(
        envvar="ARTSTORE_UPSTREAM_API_KEY",
        help="Key sent upstream when the agent sends none (never stored).",
        show_default=False,
    ),
]
RequireTokens = Annotated[
    bool, typer.Option("--require-tokens", help="Require a token on loopback too.")
]
MaxBody = Annotated[int, typer.Option(min=1, help="Largest request body accepted (413 beyond).")]
PublicUrl = Annotated[
    str | None,
    typer.Option(help="Base of the URLs handed to agents (default: as the client asked)."),
]
Lease = Annotated[
    float,
    typer.Option(
        min=1,
        help="Seconds a killed server's open rollouts stay running before any server "
        "records them as abandoned.",
    ),
]
CertFile = Annotated[Path | None, typer.Option(help="TLS certificate (uvicorn's --ssl-certfile).")]
KeyFile = Annotated[Path | None, typer.Option(help="TLS private key (uvicorn's --ssl-keyfile).")]


def serve(
    upstream: Upstream,
    url: UrlOption = None,
    host: Host = "127.0.0.1",
    port: Port = 8420,
    upstream_api_key: UpstreamKey = None,
    require_tokens: RequireTokens = False,
    max_body_bytes: MaxBody = 32 * 1024 * 1024,
    public_url: PublicUrl = None,
    lease: Lease = 60.0,
    ssl_certfile: CertFile = None,
    ssl_keyfile: KeyFile = None,
) -> None:
    """Record agents' LLM calls from anywhere: an OpenAI-compatible proxy and a rollout API.

    Start a rollout with POST /api/runs/RUN/rollouts and hand the agent the base_url it
    returns; every call it makes there is forwarded to --upstream and recorded in the
    rollout. The API's schema is at /openapi.json (docs/serve.md).
    """
    from artstore.redaction import redact_url
    from artstore.serve.server import serve as serving

    options = {}
    if ssl_certfile is not None:
        options["ssl_certfile"] = str(ssl_certfile)
    if ssl_keyfile is not None:
        options["ssl_keyfile"] = str(ssl_keyfile)

    def ready(address: str) -> None:
        console.print(
            f"artstore serve: {address} (upstream {redact_url(upstream)}); Ctrl-C stops it",
            highlight=False,
            soft_wrap=True,
        )

    async def work() -> None:
        await serving(
            url,
            upstream=upstream,
            host=host,
            port=port,
            upstream_api_key=upstream_api_key,
            require_tokens=require_tokens,
            max_body_bytes=max_body_bytes,
            public_url=public_url,
            lease_s=lease,
            uvicorn_options=options,
            on_ready=ready,
        )

    try:
        run(work)
    except KeyboardInterrupt:
        err_console.print("artstore serve: stopped", highlight=False)
    except OSError as exc:
        say_error(f"cannot listen on {host}:{port}: {exc.strerror or exc} (choose another --port)")
        raise typer.Exit(1) from None


@token_app.command("create")
def create(
    run_name: Annotated[str, typer.Option("--run", help="The run the token opens.")],
    scope: Annotated[str, typer.Option(help="read or write.")] = "write",
    ttl: Annotated[
        float | None,
        typer.Option("--ttl", min=1, help="Seconds until it expires (default: never)."),
    ] = None,
    url: UrlOption = None,
) -> None:
    """Make a token for `artstore serve`'s API on one run; it is printed once, kept hashed."""
    if scope not in ("read", "write"):
        say_error(f"--scope must be read or write, not {scope!r}")
        raise typer.Exit(2)

    async def work() -> str:
        from artstore.names import check_name
        from artstore.serve.tokens import create_token
        from artstore.store import open_store

        check_name("run", run_name)
        async with await open_store(url) as store:
            return await create_token(store, run=run_name, scope=scope, ttl_s=ttl)

    print(run(work))
