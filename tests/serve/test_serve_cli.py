"""The commands as docs/serve.md shows them: `artstore token create`, then `artstore serve`
in its own process (the process is the point: SIGTERM must leave no rollout running),
an agent's calls with curl, and `artstore trajectory` reading what was recorded."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import signal
import subprocess
import sys
from typing import Any

import httpx
from command_line import run_artstore

import artstore
from artstore.testing.inference_server import LocalInferenceServer


def test_token_create_prints_a_token_once_and_keeps_its_hash(database_url: str) -> None:
    result = run_artstore("token", "create", "--run", "r", "--scope", "read", "--url", database_url)
    assert result.exit_code == 0, result.output
    token = result.stdout.strip()
    assert token.startswith("ast_run_")

    async def stored() -> list[Any]:
        from sqlalchemy import select

        from artstore.schema import tables as t

        async with await artstore.open_store(database_url, read_only=True) as store:
            async with store.database.read() as connection:
                return list(await connection.execute(select(t.api_tokens)))

    [row] = asyncio.run(stored())
    assert row.token_hash == hashlib.sha256(token.encode()).hexdigest()
    assert (row.kind, row.scope, row.run) == ("run", "read", "r")
    assert token not in json.dumps([str(v) for v in row])
    bad = run_artstore("token", "create", "--run", "r", "--scope", "admin", "--url", database_url)
    assert bad.exit_code == 2 and "read or write" in bad.output


OSLO = {"role": "user", "content": "Oslo"}


def command(*args: str) -> list[str]:
    return [sys.executable, "-c", "from artstore.cli import main; main()", *args]


def test_serve_then_curl_then_trajectory_and_sigterm(database_url: str) -> None:
    env = {**os.environ, "ARTSTORE_URL": database_url}
    with LocalInferenceServer() as upstream:
        server = subprocess.Popen(
            command("serve", "--upstream", upstream.base_url, "--port", "0"),
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            line = server.stdout.readline()  # "artstore serve: http://127.0.0.1:PORT (...)"
            assert line.startswith("artstore serve: http://127.0.0.1:"), server.stderr.read()
            address = line.split()[2]
            with httpx.Client(timeout=60) as http:
                started = http.post(
                    f"{address}/api/runs/demo/rollouts",
                    json={"model": "agent", "scenario": {"city": "Oslo"}},
                ).json()
                left_open = http.post(
                    f"{address}/api/runs/demo/rollouts", json={"model": "agent"}
                ).json()
                chat = subprocess.run(
                    ["curl", "-sS", "--fail-with-body", f"{started['base_url']}/chat/completions",
                     "-H", f"Authorization: Bearer {upstream.api_key}",
                     "-H", "Content-Type: application/json",
                     "-d", json.dumps({"model": "test-model", "messages": [OSLO]})],
                    capture_output=True, text=True, timeout=60, check=True,
                )  # fmt: skip
                assert json.loads(chat.stdout)["choices"][0]["message"]["content"]
                finished = http.post(
                    f"{address}/api/rollouts/{started['rollout_id']}/finish",
                    json={"result": {"answer": "sunny"}, "rewards": {"judge": 1.0}},
                )
                assert finished.status_code == 200, finished.text
        finally:
            server.send_signal(signal.SIGTERM)
            _, err = server.communicate(timeout=60)
        # uvicorn stops gracefully, then raises the signal again: killed by it, as asked.
        assert server.returncode in (0, -signal.SIGTERM), err
        assert upstream.api_key not in err and started["token"] not in err

    shown = subprocess.run(
        command("trajectory", started["rollout_id"]),
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    assert "Oslo" in shown.stdout

    async def ends() -> dict[str, str]:
        async with await artstore.open_store(database_url, read_only=True) as store:
            return {
                rollout["rollout_id"]: (
                    await store.read_stream(f"rollout-{rollout['rollout_id']}")
                )[-1].type
                for rollout in (started, left_open)
            }

    assert asyncio.run(ends()) == {
        started["rollout_id"]: "rollout.finished",
        left_open["rollout_id"]: "rollout.failed",  # the server stopped: not left running
    }


def test_a_server_killed_mid_stream_leaves_no_rollout_running_past_its_lease(
    database_url: str,
) -> None:
    from serving import serving

    env = {**os.environ, "ARTSTORE_URL": database_url}
    with LocalInferenceServer(chunk_interval_s=0.5) as upstream:
        server = subprocess.Popen(
            command("serve", "--upstream", upstream.base_url, "--port", "0", "--lease", "1"),
            env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        )  # fmt: skip
        try:
            address = server.stdout.readline().split()[2]
            with httpx.Client(timeout=60) as http:
                started = http.post(
                    f"{address}/api/runs/demo/rollouts", json={"model": "agent"}
                ).json()
                body = {"model": "test-model", "messages": [OSLO], "stream": True}
                headers = {"Authorization": f"Bearer {upstream.api_key}"}
                url = f"{started['base_url']}/chat/completions"
                with http.stream("POST", url, json=body, headers=headers) as response:
                    next(response.iter_bytes())  # mid-stream:
                    server.send_signal(signal.SIGKILL)
        finally:
            server.kill()
            server.wait(timeout=60)

        async def swept() -> Any:
            stream = f"rollout-{started['rollout_id']}"
            async with await artstore.open_store(database_url) as store:
                async with serving(store, upstream, lease_s=1.0):  # another server, sweeping
                    loop = asyncio.get_running_loop()
                    deadline = loop.time() + 60
                    while (await store.read_stream(stream))[-1].type != "rollout.failed":
                        assert loop.time() < deadline, "the killed server's rollout still runs"
                        await asyncio.sleep(0.1)
                    return (await store.read_stream(stream))[-1].data

        assert asyncio.run(swept())["error_type"] == "RolloutAbandoned"
