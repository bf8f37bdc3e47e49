"""Fixtures of the `artstore serve` tests: a local upstream, and the server before it."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from serving import Served, serving

import artstore
from artstore.testing.inference_server import LocalInferenceServer


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
