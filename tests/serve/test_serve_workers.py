"""`artstore worker --server`: rollout workers with no database, through `artstore serve`.

A worker subprocess given no database URL claims, runs and finishes whole rollouts through
the server, SIGKILLed mid-rollout a few times on the way (more under ARTSTORE_LONG=1):
nothing is lost, nothing recorded twice, and each rollout redone resumes the one the kill
left, its answered call served back by the proxy. A worker whose lease expired is refused by the
database when it finishes (fencing), through the API as in-process. Workers need
PostgreSQL; a server on SQLite refuses the claims API with one clear line.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

from budget import budget
from matrix.invariants import no_recorded_call_paid_twice
from serving import serving
from sqlalchemy import func, select, text, update
from waiting import eventually

import artstore
from artstore.events import RunStarted
from artstore.eventstore.records import NO_STREAM
from artstore.schema import tables as t
from artstore.testing.inference_server import LocalInferenceServer
from artstore.workers import claims
from artstore.workers.claims import GroupPlan

RUN = "serve-workers/run"
ROOT = Path(__file__).parents[2]
KILLS = budget(2, 8)
LEASE_S = 1.5


async def register(store: artstore.Store, groups: int, group_size: int = 2) -> None:
    """A run registered for workers as its trainer registers it."""
    await store.append(
        f"run-{RUN}",
        [
            RunStarted(
                run=RUN,
                project="serve-workers",
                model="model",
                config={"rollouts": "workers"},
                scenarios=[{"question": f"What is fact number {i}?"} for i in range(groups)],
                scorer="reward",
                trainer="test",
            )
        ],
        expected_version=NO_STREAM,
    )
    await claims.register_run(
        store.database,
        run=RUN,
        model="serve-workers/model",
        trainer="test",
        models={
            "policy": {
                "name": "model",
                "project": "serve-workers",
                "inference_base_url": None,
                "inference_model_name": "model@0",
                "needs_api_key": False,
            }
        },
        reward_function=None,
        max_steps_off_policy=groups,
        policy_step=0,
        next_batch=0,
        groups=[
            GroupPlan(f"g{i}", epoch=0, batch=i, scenario_index=i, policy=group_size)
            for i in range(groups)
        ],
    )


async def ends(store: artstore.Store) -> dict[str, list[str]]:
    """Each rollout's end events, by rollout id: `finished`, or the failure's type."""
    query = select(t.rollouts.c.rollout_id)
    async with store.database.read() as connection:
        ids = (await connection.execute(query)).scalars().all()
    found = {}
    for rollout_id in ids:
        recorded = await store.read_stream(f"rollout-{rollout_id}")
        found[rollout_id] = [
            "finished" if e.type == "rollout.finished" else e.decode().error_type
            for e in recorded
            if e.type in ("rollout.finished", "rollout.failed")
        ]
    return found


def start_worker(address: str, gate: Path, log: Path) -> subprocess.Popen:
    env = {
        name: value
        for name, value in os.environ.items()
        if "POSTGRES" not in name and name not in ("ARTSTORE_URL", "DATABASE_URL")
    }
    env["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT), str(ROOT / "tests" / "serve"), str(ROOT / "tests" / "support")]
    )
    env["ARTSTORE_TEST_GATE"] = str(gate)
    command = [
        *(sys.executable, "-c", "from artstore.cli import main; main()"),
        *("worker", RUN, "--server", address),
        *("--agent", "server_worker_agent:agent", "--reward", "server_worker_agent:reward"),
        *("--lease", str(LEASE_S), "--concurrency", "2", "--wait", "120"),
    ]
    with log.open("ab") as out:
        return subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT)


async def running_with_a_call(store: artstore.Store) -> bool:
    query = (
        select(func.count())
        .select_from(t.rollouts)
        .where(t.rollouts.c.status == "running", t.rollouts.c.run == RUN)
    )
    calls = select(func.count()).select_from(t.llm_calls)
    async with store.database.read() as connection:
        running = (await connection.execute(query)).scalar_one()
        called = (await connection.execute(calls)).scalar_one()
    return running > 0 and called > 0


async def test_a_worker_without_a_database_runs_whole_rollouts_through_the_server_under_kills(
    postgres_url: str, tmp_path: Path
) -> None:
    groups = 3
    gate, log = tmp_path / "gate", tmp_path / "workers.log"
    async with (
        LocalInferenceServer() as upstream,
        await artstore.open_store(postgres_url) as store,
        serving(store, upstream, lease_s=LEASE_S, upstream_api_key=upstream.api_key) as server,
    ):
        await register(store, groups)
        for _ in range(KILLS):  # killed while it holds rollouts open, mid-agent
            worker = start_worker(server.address, gate, log)
            await eventually(lambda: running_with_a_call(store), "a rollout in flight", timeout=60)
            worker.send_signal(signal.SIGKILL)
            await asyncio.to_thread(worker.wait)
        gate.touch()
        worker = start_worker(server.address, gate, log)

        async def sealed() -> bool:
            assert worker.poll() is None, log.read_text()[-3000:]
            states = await claims.group_states(store.database, [f"g{i}" for i in range(groups)])
            return all(state.status == "sealed" for state in states.values())

        await eventually(sealed, "every group sealed", timeout=240)
        await claims.close_run(store.database, RUN, "finished")
        assert await asyncio.to_thread(worker.wait, 120) == 0, log.read_text()[-3000:]
        ended = await ends(store)
        async with store.database.read() as connection:
            rewards = (await connection.execute(text("SELECT count(*) FROM rewards"))).scalar_one()
        # Each rollout redone resumed the one it replaced: its recorded answer served back.
        await no_recorded_call_paid_twice(store)
        calls = await store.read_all(limit=10_000, types=["llm.call"])
        served_back = sum(1 for call in calls if call.data.get("replayed_from"))

    assert all(len(events) == 1 for events in ended.values()), ended  # nothing twice
    outcomes = Counter(events[0] for events in ended.values())
    assert outcomes["finished"] == groups * 2, outcomes  # nothing lost
    assert set(outcomes) <= {"finished", "RolloutAbandoned"}, outcomes
    assert outcomes["RolloutAbandoned"] >= KILLS  # each kill left one in flight
    assert served_back >= KILLS, served_back  # ... with a call answered, not paid again
    assert rewards == groups * 2
    assert "rollouts finished" in log.read_text()


async def test_a_stale_worker_is_refused_its_finish_through_the_server(
    postgres_url: str,
) -> None:
    async with (
        LocalInferenceServer() as upstream,
        await artstore.open_store(postgres_url) as store,
        serving(store, upstream, upstream_api_key=upstream.api_key) as server,
    ):
        await register(store, groups=1, group_size=1)
        claims_url = f"{server.address}/api/runs/{RUN}/claims"
        first = await server.http.post(claims_url, json={"worker": "a", "limit": 1, "lease_s": 30})
        assert first.status_code == 200, first.text
        [mine] = first.json()["rollouts"]
        called = await server.http.post(
            f"{mine['base_url']}/chat/completions",
            json={"model": mine["model"], "messages": [{"role": "user", "content": "hi"}]},
        )
        assert called.status_code == 200, called.text
        async with store.database.write() as connection:  # silent for longer than its lease
            await connection.execute(
                update(t.rollout_claims).values(
                    lease_expires_at=func.clock_timestamp() - text("interval '1 second'")
                )
            )
        finish = f"{server.address}/api/rollouts/{mine['rollout_id']}/finish"
        auth = {"authorization": f"Bearer {mine['token']}"}
        # An agent holds its rollout's token: it claims nothing with it.
        agent_claim = await server.http.post(claims_url, json={"worker": "x"}, headers=auth)
        assert agent_claim.status_code == 403, agent_claim.text
        refused = await server.http.post(finish, json={"result": "late"}, headers=auth)
        assert refused.status_code == 409 and refused.json()["error"]["code"] == "lease_lost"

        second = await server.http.post(claims_url, json={"worker": "b", "limit": 1})
        [theirs] = second.json()["rollouts"]
        assert theirs["claim"]["previous_rollout_id"] == mine["rollout_id"]
        again = await server.http.post(finish, json={"result": "late"}, headers=auth)
        assert again.status_code in (401, 409), again.text
        done = await server.http.post(
            f"{server.address}/api/rollouts/{theirs['rollout_id']}/finish",
            json={"result": "on time"},
            headers={"authorization": f"Bearer {theirs['token']}"},
        )
        assert done.status_code == 200, done.text
        ended = await ends(store)

    assert ended == {mine["rollout_id"]: ["RolloutAbandoned"], theirs["rollout_id"]: ["finished"]}


async def test_the_claims_api_needs_postgresql(database_url: str) -> None:
    async with (
        await artstore.open_store(database_url) as store,
        serving(store, "http://127.0.0.1:9") as server,
    ):
        answer = await server.http.post(
            f"{server.address}/api/runs/{RUN}/claims", json={"worker": "w"}
        )
        schema = (await server.http.get(f"{server.address}/openapi.json")).json()
    expected = 404 if "postgresql" in database_url else 400
    assert answer.status_code == expected, answer.text
    assert "\n" not in answer.json()["error"]["message"]
    assert {"/api/runs/{run}/claims", "/api/runs/{run}/claims/seal"} <= set(schema["paths"])
