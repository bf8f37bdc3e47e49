"""The agent of `artstore worker --server` in tests: one call to the proxy, then a gate.

It calls its model at the served rollout's base URL (what `current_rollout()` gives), and
then, while the file named by $ARTSTORE_TEST_GATE does not exist, holds the rollout open
(so that the test can kill its worker mid-rollout).
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import httpx

from artstore.serve.remote_worker import current_rollout


async def agent(scenario: dict[str, Any], rollout_id: str) -> str:
    served = current_rollout()
    async with httpx.AsyncClient(timeout=60) as http:
        response = await http.post(
            f"{served.base_url}/chat/completions",
            json={
                "model": served.model,
                "messages": [{"role": "user", "content": scenario["question"]}],
            },
        )
        response.raise_for_status()
    gate = Path(os.environ["ARTSTORE_TEST_GATE"])
    while not gate.exists():
        await asyncio.sleep(0.05)
    return response.json()["choices"][0]["message"]["content"]


def reward(scenario: Any, results: list[Any], trajectories: list[Any]) -> list[float]:
    assert all(len(t.messages_and_choices) >= 2 for t in trajectories)
    return [float(len(str(result)) % 5) for result in results]
