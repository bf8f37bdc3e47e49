"""Running `artstore serve` under uvicorn; listening beyond loopback requires tokens."""

from __future__ import annotations

from typing import Any

from artstore.listening import is_loopback, listening_socket, socket_url

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8420


async def serve(
    url: str | None,
    *,
    upstream: str,
    host: str,
    port: int,
    upstream_api_key: str | None = None,
    require_tokens: bool = False,
    max_body_bytes: int | None = None,
    public_url: str | None = None,
    lease_s: float | None = None,
    uvicorn_options: dict[str, Any] | None = None,
    on_ready: Any = None,
) -> None:
    """Open the store, serve until SIGINT or SIGTERM, close the store.

    No access log: a URL holds its rollout's token. Any other host than loopback
    requires tokens.
    """
    import uvicorn

    from artstore.serve.app import create_app
    from artstore.serve.limits import DEFAULT_MAX_BODY_BYTES
    from artstore.store import open_store

    store = await open_store(url)
    try:
        app = create_app(
            store,
            upstream=upstream,
            upstream_api_key=upstream_api_key,
            require_tokens=require_tokens or not is_loopback(host),
            max_body_bytes=max_body_bytes or DEFAULT_MAX_BODY_BYTES,
            public_url=public_url,
            **({"lease_s": lease_s} if lease_s is not None else {}),
        )
        config = uvicorn.Config(
            app,
            host=host,
            port=port,
            log_level="warning",
            access_log=False,
            lifespan="on",
            **(uvicorn_options or {}),
        )
        server = uvicorn.Server(config)
        sock = listening_socket(host, port)
        if on_ready is not None:
            on_ready(socket_url(sock, "https" if config.is_ssl else "http"))
        await server.serve(sockets=[sock])
    finally:
        await store.close()
