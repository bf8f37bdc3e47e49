"""Running the viewer: uvicorn on a socket bound here (port 0 picks a free one)."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable
from typing import Any

from artstore.listening import listening_socket, socket_url
from artstore.viewer.app import create_app

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8321


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on (host, port); OSError when the port is taken."""
    sock = listening_socket(host, port, backlog=128)
    sock.set_inheritable(True)
    return sock


def address(sock: socket.socket) -> str:
    return f"{socket_url(sock)}/"


# How long a stopping viewer waits for the requests under way (its user queries are
# stopped at once), before uvicorn cancels them.
GRACEFUL_STOP_S = 10


def _server(app: Any) -> Any:
    import uvicorn

    class Server(uvicorn.Server):
        """uvicorn's server, which on SIGTERM or SIGINT also stops the user queries under
        way: uvicorn waits for the requests to end, and a query may run to its deadline."""

        async def shutdown(self, sockets: Any = None) -> None:
            for query in list(app.state.queries):
                query.cancel()
            await super().shutdown(sockets)

    config = uvicorn.Config(
        app,
        log_level="warning",
        access_log=False,
        lifespan="on",
        timeout_graceful_shutdown=GRACEFUL_STOP_S,
    )
    return Server(config)


def serve(
    url: str | None = None,
    host: str = DEFAULT_HOST,
    port: int = DEFAULT_PORT,
    *,
    on_ready: Callable[[str], None] | None = None,
    **options: Any,
) -> None:
    """Serve the viewer of the store at `url` until interrupted (Ctrl-C, SIGTERM).

    `on_ready(address)` is called once the socket is bound, before the first request;
    `options` go to `create_app` (sql_timeout, access_token).
    """
    sock = bind(host, port)
    try:
        server = _server(create_app(url, host=host, **options))
        if on_ready is not None:
            on_ready(address(sock))
        server.run(sockets=[sock])
    finally:
        sock.close()


class BackgroundViewer:
    """The viewer served from a thread of this process (for tests and notebooks):

    with BackgroundViewer(url) as viewer:
        ... viewer.address ...
    """

    def __init__(
        self, url: str | None = None, host: str = DEFAULT_HOST, port: int = 0, **options: Any
    ) -> None:
        self._sock = bind(host, port)
        self.address = address(self._sock)
        self.app = create_app(url, host=host, **options)
        self._server = _server(self.app)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self._sock]}, daemon=True
        )

    def __enter__(self) -> BackgroundViewer:
        self._thread.start()
        while not self._server.started:
            if not self._thread.is_alive():
                raise RuntimeError("the viewer did not start (see its log)")
            self._thread.join(0.05)
        return self

    def queries_running(self) -> int:
        """How many user queries of the SQL page are under way."""
        return len(self.app.state.queries)

    def __exit__(self, *exc_info: object) -> None:
        self._server.should_exit = True
        self._thread.join()
        self._sock.close()
