"""`artstore serve` in the test's own event loop, over real HTTP, before a local upstream."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

import artstore
from artstore.serve.app import create_app
from artstore.testing.inference_server import LocalInferenceServer


@dataclass
class Served:
    address: str  # http://127.0.0.1:PORT
    upstream: LocalInferenceServer
    store: Any
    http: httpx.AsyncClient

    async def start(self, run: str = "served", **body: Any) -> dict[str, Any]:
        body.setdefault("model", "agent")
        response = await self.http.post(f"{self.address}/api/runs/{run}/rollouts", json=body)
        assert response.status_code == 201, response.text
        return response.json()

    async def finish(self, rollout_id: str, **body: Any) -> httpx.Response:
        return await self.http.post(f"{self.address}/api/rollouts/{rollout_id}/finish", json=body)


@contextlib.asynccontextmanager
async def serving(
    store: Any, upstream: LocalInferenceServer, **options: Any
) -> AsyncIterator[Served]:
    import uvicorn

    app = create_app(store, upstream=upstream.base_url, **options)
    sock = socket.socket()
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
            yield Served(f"http://127.0.0.1:{port}", upstream, store, client)
    finally:
        server.should_exit = True
        await task
        sock.close()


@pytest.fixture
async def upstream() -> AsyncIterator[LocalInferenceServer]:
    async with LocalInferenceServer() as server:
        yield server


@pytest.fixture
async def served(database_url: str, upstream: LocalInferenceServer) -> AsyncIterator[Served]:
    store = await artstore.open_store(database_url)
    try:
        async with serving(store, upstream) as running:
            yield running
    finally:
        await store.close()
