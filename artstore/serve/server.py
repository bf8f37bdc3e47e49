"""Running `artstore serve` under uvicorn; listening beyond loopback requires tokens."""

from __future__ import annotations

import ipaddress
import socket
from typing import Any

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8420


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


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
        sock = _bind(host, port)
        if on_ready is not None:
            on_ready(_address(sock, "https" if config.is_ssl else "http"))
        await server.serve(sockets=[sock])
    finally:
        await store.close()


def _bind(host: str, port: int) -> socket.socket:
    """A listening socket on (host, port) (port 0: a free one); OSError when taken."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    # Accepted connections inherit it: without it, uvicorn's response (head, then body,
    # written apart) waited on the client's delayed ACK, 40-50 ms per call on loopback.
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        sock.bind((host, port))
        sock.listen(1024)
    except OSError:
        sock.close()
        raise
    return sock


def _address(sock: socket.socket, scheme: str) -> str:
    host, port = sock.getsockname()[:2]
    return f"{scheme}://[{host}]:{port}" if ":" in host else f"{scheme}://{host}:{port}"
