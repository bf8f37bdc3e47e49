"""Nobody in who does not belong, nothing lost: tokens, refusals, failed and cut calls.

Every refusal is a JSON error with its status, and writes nothing: the event log is
compared before and after.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import socket
from typing import Any

import httpx
import openai
import pytest
from serving import Served, serving
from sqlalchemy import func, select, text

from artstore.schema import tables as t
from artstore.serve.tokens import create_token
from artstore.testing.inference_server import LocalInferenceServer

CHAT = {"model": "test-model", "messages": [{"role": "user", "content": "Lima"}]}


async def log_size(store: Any) -> int:
    await store.flush()
    async with store.database.read() as connection:
        return (await connection.execute(select(func.count()).select_from(t.events))).scalar()


async def refused(response: httpx.Response, status: int) -> str:
    assert response.status_code == status, response.text
    return response.json()["error"]["code"]


async def test_tokens_scopes_and_ended_rollouts(store: Any, upstream: LocalInferenceServer) -> None:
    writer = await create_token(store, run="r", scope="write")
    reader = await create_token(store, run="r", scope="read")
    expired = await create_token(store, run="r", scope="write", ttl_s=-1)
    other_run = await create_token(store, run="elsewhere", scope="write")
    async with serving(store, upstream, require_tokens=True) as served:
        http, start = served.http, f"{served.address}/api/runs/r/rollouts"

        def bearer(token: str) -> dict[str, str]:
            return {"Authorization": f"Bearer {token}"}

        before = await log_size(store)
        body = {"model": "agent"}
        assert await refused(await http.post(start, json=body), 401) == "missing_token"
        assert await refused(await http.post(start, json=body, headers=bearer("nope")), 401)
        assert await refused(await http.post(start, json=body, headers=bearer(expired)), 401)
        assert await refused(await http.post(start, json=body, headers=bearer(reader)), 403)
        assert await refused(await http.post(start, json=body, headers=bearer(other_run)), 403)
        for bad in ({}, {"model": "agent", "scenario_index": "3"}, {"model": "a", "role": "x"}):
            answer = await http.post(start, json=bad, headers=bearer(writer))
            assert await refused(answer, 400) == "invalid_request"
        assert await log_size(store) == before

        started = (await http.post(start, json=body, headers=bearer(writer))).json()
        rollout = f"{served.address}/api/rollouts/{started['rollout_id']}"
        client = openai.AsyncOpenAI(base_url=started["base_url"], api_key=upstream.api_key)
        await client.chat.completions.create(**CHAT)  # the rollout token alone admits it
        lines = {"lines": ["tool ok"]}
        assert (
            await http.post(f"{rollout}/log", json=lines, headers=bearer(reader))
        ).status_code == 403
        assert (
            await http.post(f"{rollout}/log", json=lines, headers=bearer(started["token"]))
        ).status_code == 200
        assert (await http.get(rollout, headers=bearer(reader))).json()["status"] == "running"
        finish = await http.post(f"{rollout}/finish", json={"result": 1}, headers=bearer(writer))
        assert finish.status_code == 200

        ended = await log_size(store)
        again = await http.post(f"{rollout}/finish", json={}, headers=bearer(writer))
        assert await refused(again, 409) == "rollout_ended"
        late = await http.post(f"{rollout}/log", json=lines, headers=bearer(started["token"]))
        assert await refused(late, 409) == "rollout_ended"
        with pytest.raises(openai.ConflictError):
            await client.chat.completions.create(**CHAT)
        read = await http.get(f"{rollout}/trajectory", headers=bearer(started["token"]))
        assert await refused(read, 401) == "expired_token"  # dead once its rollout ended
        assert await log_size(store) == ended

        trajectory = (await http.get(f"{rollout}/trajectory", headers=bearer(reader))).json()
        assert trajectory["status"] == "finished"
        assert trajectory["trajectory"]["logs"] == ["tool ok"]
        assert len(trajectory["trajectory"]["messages_and_choices"]) == 2

    async with store.database.read() as connection:
        hashes = (await connection.execute(select(t.api_tokens.c.token_hash))).scalars().all()
    for token in (writer, reader, started["token"]):
        assert hashlib.sha256(token.encode()).hexdigest() in hashes


async def test_no_key_and_no_token_is_stored(served: Served) -> None:
    started = await served.start("r")
    key = served.upstream.api_key
    client = openai.AsyncOpenAI(base_url=started["base_url"], api_key=key)
    said = {"role": "user", "content": f"my key is {key} and my token {started['token']}"}
    await client.chat.completions.create(model="test-model", messages=[said])
    await served.finish(started["rollout_id"], logs=[f"used {key}"])
    async with served.store.database.read() as connection:
        events = (await connection.execute(text("SELECT data FROM events"))).scalars().all()
        blobs = (await connection.execute(text("SELECT body FROM blobs"))).scalars().all()
    everything = json.dumps([str(e) for e in events]) + json.dumps([str(b) for b in blobs])
    assert "my key is" in everything
    assert key not in everything and started["token"] not in everything


async def test_oversize_bodies_are_refused_before_anything_is_written(
    store: Any, upstream: LocalInferenceServer
) -> None:
    async with serving(store, upstream, max_body_bytes=2000) as served:
        started = await served.start("r")
        before = await log_size(store)
        big = {**CHAT, "messages": [{"role": "user", "content": "x" * 3000}]}
        call = await served.http.post(f"{started['base_url']}/chat/completions", json=big)
        assert await refused(call, 413) == "body_too_large"
        finish = await served.finish(started["rollout_id"], result="y" * 3000)
        assert await refused(finish, 413) == "body_too_large"
        assert await log_size(store) == before
        assert upstream.requests == []


async def test_upstream_errors_are_relayed_and_recorded_as_failed_calls(
    store: Any, upstream: LocalInferenceServer
) -> None:
    upstream.fail_when = lambda request: True
    async with serving(store, upstream) as served:
        started = await served.start("r")
        url = f"{started['base_url']}/chat/completions"
        headers = {"Authorization": f"Bearer {upstream.api_key}"}
        failed = await served.http.post(url, json=CHAT, headers=headers)
        assert failed.status_code == 500 and "error" in failed.json()
        # The Responses API is recorded too (this upstream has none: its 404 is relayed).
        responses = {"model": "test-model", "input": "Lima"}
        missing = await served.http.post(
            f"{started['base_url']}/responses", json=responses, headers=headers
        )
        assert missing.status_code == 404
        await served.finish(started["rollout_id"])
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    nowhere = f"http://127.0.0.1:{closed.getsockname()[1]}/v1"
    closed.close()  # nothing listens there now
    async with serving(store, nowhere) as gone:
        started_gone = await gone.start("r")
        unreachable = await gone.http.post(
            f"{started_gone['base_url']}/chat/completions", json=CHAT, headers=headers
        )
        assert await refused(unreachable, 502) == "upstream_unreachable"
        await gone.finish(started_gone["rollout_id"])
    calls = [
        e.data
        for rollout in (started, started_gone)
        for e in await store.read_stream(f"rollout-{rollout['rollout_id']}")
        if e.type == "llm.call"
    ]
    assert calls[0]["error_type"] == "HTTPStatusError" and "HTTP 500" in calls[0]["error_message"]
    assert (calls[1]["endpoint"], calls[1]["error_type"]) == ("responses", "HTTPStatusError")
    assert calls[2]["error_type"] == "ConnectError"


async def test_a_client_that_leaves_mid_stream_leaves_an_incomplete_call(
    store: Any,
) -> None:
    async with LocalInferenceServer(chunk_interval_s=0.2) as slow, serving(store, slow) as served:
        started = await served.start("r")
        url = f"{started['base_url']}/chat/completions"
        headers = {"Authorization": f"Bearer {slow.api_key}"}
        async with served.http.stream(
            "POST", url, json={**CHAT, "stream": True}, headers=headers
        ) as response:
            async for _ in response.aiter_bytes():
                break  # one chunk relayed as it arrived, long before the stream's end

        stream = f"rollout-{started['rollout_id']}"
        deadline = asyncio.get_running_loop().time() + 30
        while not [e for e in await store.read_stream(stream) if e.type == "llm.call"]:
            assert asyncio.get_running_loop().time() < deadline, "the cut call was not recorded"
            await asyncio.sleep(0.05)
        await served.finish(started["rollout_id"])
    [call] = [e.data for e in await store.read_stream(stream) if e.type == "llm.call"]
    assert call["error_type"] == "IncompleteStreamError" and call["stream"] is True


async def test_a_server_that_stops_fails_its_open_rollouts(
    store: Any, upstream: LocalInferenceServer
) -> None:
    async with serving(store, upstream) as served:
        started = await served.start("r")
        schema = (await served.http.get(f"{served.address}/openapi.json")).json()
        assert "/api/runs/{run}/rollouts" in schema["paths"]
    events = await store.read_stream(f"rollout-{started['rollout_id']}")
    assert events[-1].type == "rollout.failed"
    assert events[-1].data["error_type"] == "ServerStopped"


async def test_a_killed_server_leaves_its_rollouts_running_no_longer_than_its_lease(
    store: Any, upstream: LocalInferenceServer
) -> None:
    async with serving(store, upstream, lease_s=1.0) as served:
        started = await served.start("r")
        client = openai.AsyncOpenAI(base_url=started["base_url"], api_key=upstream.api_key)
        await client.chat.completions.create(**CHAT)
        # As if the process serving it had been killed: nobody renews its lease now.
        rollouts = served.app.state.serve.rollouts
        rollouts.by_token.pop(rollouts.by_id.pop(started["rollout_id"]).token_hash)

        stream = f"rollout-{started['rollout_id']}"
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 60
        while (await store.read_stream(stream))[-1].type != "rollout.failed":
            assert loop.time() < deadline, "the expired lease was not swept"
            await asyncio.sleep(0.1)
        failed = (await store.read_stream(stream))[-1].data
        assert failed["error_type"] == "RolloutAbandoned"
        with pytest.raises(openai.ConflictError):  # its token died with it
            await client.chat.completions.create(**CHAT)
