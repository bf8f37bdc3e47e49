"""`artstore serve` in the test's own event loop, over real HTTP, before a local upstream."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx

from artstore.serve.app import create_app


@dataclass
class Served:
    address: str  # http://127.0.0.1:PORT
    upstream: Any  # a LocalInferenceServer, or a URL
    store: Any
    http: httpx.AsyncClient
    app: Any = None

    async def start(self, run: str = "served", **body: Any) -> dict[str, Any]:
        body.setdefault("model", "agent")
        response = await self.http.post(f"{self.address}/api/runs/{run}/rollouts", json=body)
        assert response.status_code == 201, response.text
        return response.json()

    async def finish(self, rollout_id: str, **body: Any) -> httpx.Response:
        return await self.http.post(f"{self.address}/api/rollouts/{rollout_id}/finish", json=body)


@contextlib.asynccontextmanager
async def serving(store: Any, upstream: Any, **options: Any) -> AsyncIterator[Served]:
    """The server over `store` before `upstream` (a LocalInferenceServer, or a URL)."""
    import uvicorn

    url = upstream if isinstance(upstream, str) else upstream.base_url
    app = create_app(store, upstream=url, **options)
    sock = socket.socket()
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on")
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 30
    while not server.started:
        assert loop.time() < deadline and not task.done(), "the server did not start"
        await asyncio.sleep(0.01)
    port = sock.getsockname()[1]
    try:
        async with httpx.AsyncClient(timeout=60) as client:
            yield Served(f"http://127.0.0.1:{port}", upstream, store, client, app)
    finally:
        server.should_exit = True
        await task
        sock.close()
