"""Real clients through `artstore serve`: Python's `openai`, curl, Node's `openai`, and a
LangGraph agent in a process that does not import artstore.

Each is given only a base URL; what the proxy records is what in-process capture records
for the same conversation (its trajectory, call for call).
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import openai
import pytest
from agents import WEATHER_TOOL, python_agent
from serving import Served
from upstream_ids import without_ids

from artstore.testing.inference_server import LocalInferenceServer

NODE_AGENT = Path(__file__).parent / "node" / "agent.mjs"
LANGGRAPH_AGENT = Path(__file__).parent / "langgraph_agent.py"


async def calls_of(store: Any, rollout_id: str) -> list[dict[str, Any]]:
    events = await store.read_stream(f"rollout-{rollout_id}")
    return [e.data for e in events if e.type == "llm.call"]


def comparable(call: dict[str, Any]) -> dict[str, Any]:
    """An `llm.call`'s fields that two runs of one conversation share."""
    varying = {"call_id", "started_at", "finished_at", "latency_s", "output", "input", "request"}
    return json.loads(without_ids({k: v for k, v in call.items() if k not in varying}))


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
async def test_python_client_records_what_in_process_capture_records(
    served: Served, stream: bool
) -> None:
    from capture_helpers import served_model

    async with LocalInferenceServer() as direct:
        model = served_model(direct)
        async with served.store.rollout(model, scenario={"city": "Paris"}, run="r") as inside:
            client = openai.AsyncOpenAI(base_url=direct.base_url, api_key=direct.api_key)
            mine = await python_agent(client, "Paris", stream=stream)
    started = await served.start("r", scenario={"city": "Paris"})
    client = openai.AsyncOpenAI(base_url=started["base_url"], api_key=served.upstream.api_key)
    theirs = await python_agent(client, "Paris", stream=stream)
    assert (await served.finish(started["rollout_id"])).status_code == 200

    assert without_ids(theirs) == without_ids(mine)
    assert len(mine) == 5 and mine[2]["tool_calls"]  # a tool call, its result, an answer
    recorded = await served.store.trajectory(started["rollout_id"])
    expected = await served.store.trajectory(inside.id)
    assert without_ids(recorded.model_dump(mode="json")) == without_ids(
        expected.model_dump(mode="json")
    )
    proxied, captured = (
        await calls_of(served.store, started["rollout_id"]),
        await calls_of(served.store, inside.id),
    )
    assert [comparable(c) for c in proxied] == [comparable(c) for c in captured]
    assert [c["stream"] for c in proxied] == [stream, stream]
    assert proxied[0]["tool_calls"] and proxied[0]["num_logprobs"] > 0


async def test_curl_whole_and_streamed_and_models(served: Served) -> None:
    started = await served.start("r")
    body = {
        "model": "test-model",
        "messages": [{"role": "user", "content": "Rome"}],
        "tools": [WEATHER_TOOL],
        "return_token_ids": True,  # vLLM's: the engine's own token ids, kept for ART
    }

    async def curl(*args: str) -> str:
        process = await asyncio.create_subprocess_exec(
            "curl", "-sS", "--fail-with-body", "-N", *args,
            "-H", f"Authorization: Bearer {served.upstream.api_key}",
            stdout=asyncio.subprocess.PIPE,
        )  # fmt: skip
        out, _ = await asyncio.wait_for(process.communicate(), 60)
        assert process.returncode == 0, out
        return out.decode()

    url = started["base_url"] + "/chat/completions"
    whole = json.loads(
        await curl(url, "-H", "Content-Type: application/json", "-d", json.dumps(body))
    )
    # Answered once durable: the call is in the database as the agent gets its answer.
    assert len(await calls_of(served.store, started["rollout_id"])) == 1
    streamed = await curl(
        url, "-H", "Content-Type: application/json", "-d", json.dumps({**body, "stream": True})
    )
    assert len(await calls_of(served.store, started["rollout_id"])) == 2  # by its last chunk
    models = await curl(
        f"{served.address}/v1/models", "-H", f"X-Artstore-Rollout-Token: {started['token']}"
    )
    assert whole["choices"][0]["message"]["tool_calls"]
    assert streamed.rstrip().endswith("data: [DONE]") and streamed.count("data: ") > 3
    assert json.loads(models)["data"][0]["id"] == "test-model"

    calls = await calls_of(served.store, started["rollout_id"])
    assert [(c["stream"], c["error_type"], bool(c["tool_calls"])) for c in calls] == [
        (False, None, True),
        (True, None, True),
    ]  # /models is relayed, not recorded
    [output] = (await served.store.get_blobs([calls[0]["output"]])).values()
    assert json.loads(output)["json"]["prompt_token_ids"] == whole["prompt_token_ids"]


def node_packages_installed() -> None:
    """`npm ci` in tests/serve/node once (the `openai` package as package-lock.json pins
    it), so that the suite needs no step besides the README's two commands. Test
    processes racing for it take a lock; the one that holds it installs, the others find
    the package there."""
    folder = NODE_AGENT.parent
    with open(folder / ".npm-install.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (folder / "node_modules" / "openai" / "package.json").is_file():
            npm = shutil.which("npm")
            assert npm is not None, "npm is needed (Node.js v20 or later)"
            subprocess.run(
                [npm, "ci", "--no-audit", "--no-fund", "--silent"], cwd=folder, check=True
            )


async def test_a_node_agent_with_the_official_openai_package(served: Served) -> None:
    node = shutil.which("node")
    assert node is not None, "Node.js is needed (v20 or later)"
    await asyncio.to_thread(node_packages_installed)
    rollouts = []
    for mode in ("whole", "stream"):
        started = await served.start("r", scenario={"mode": mode})
        process = await asyncio.create_subprocess_exec(
            node, str(NODE_AGENT), started["base_url"], served.upstream.api_key, "Oslo", mode,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        out, err = await asyncio.wait_for(process.communicate(), 60)
        assert process.returncode == 0, err.decode()
        assert json.loads(out)["turns"] == 5  # question, tool call, result, answer
        assert (await served.finish(started["rollout_id"], rewards={"judge": 1})).status_code == 200
        rollouts.append(started["rollout_id"])

    for rollout_id, stream in zip(rollouts, (False, True), strict=True):
        calls = await calls_of(served.store, rollout_id)
        assert [(c["stream"], c["error_type"]) for c in calls] == [(stream, None)] * 2
        assert calls[0]["tool_calls"][0]["name"] == "get_weather"
        trajectory = await served.store.trajectory(rollout_id, scorer="judge")
        assert trajectory.reward == 1.0
        roles = [m["role"] if isinstance(m, dict) else "choice" for m in trajectory.messages()]
        assert roles[:2] == ["system", "user"] and len(roles) == 5


async def test_a_langgraph_agent_in_a_process_without_artstore(served: Served) -> None:
    started = await served.start("r")
    process = await asyncio.create_subprocess_exec(
        sys.executable, str(LANGGRAPH_AGENT), started["base_url"], served.upstream.api_key,
        "Lima", "stream", stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(process.communicate(), 120)
    assert process.returncode == 0, err.decode()
    ran = json.loads(out)
    assert ran == {"messages": 4, "artstore": False}  # question, tool call, result, answer
    assert (await served.finish(started["rollout_id"])).status_code == 200

    calls = await calls_of(served.store, started["rollout_id"])
    assert [(c["stream"], c["error_type"]) for c in calls] == [(True, None)] * 2
    assert calls[0]["tool_calls"][0]["name"] == "get_weather"
    trajectory = await served.store.trajectory(started["rollout_id"])
    assert len(trajectory.messages()) == 4
