"""Served rollouts are trained as the library's groups are: run names and sealing.

Both found by the guarantee matrix (tests/matrix/served.py), each failing before its fix:
the start route took one path segment as the run, so a run named as `TrainingFramework`
names runs (`project/model`) was a 404; and a group whose rollouts were finished with
rewards through the API could not be sealed (`record_group` expected an empty group
stream, and the rewards are in it), so served groups could never be trained.
"""

from __future__ import annotations

from typing import Any

import openai
from serving import Served
from sqlalchemy import select

import artstore
from artstore.schema import tables as t
from artstore.serve.rollouts import rollout_row

CHAT = {"model": "test-model", "messages": [{"role": "user", "content": "Lima"}]}


async def served_rollout(served: Served, run: str, group_id: str | None, reward: float) -> str:
    started = await served.start(run=run, **({"group_id": group_id} if group_id else {}))
    assert started["run"] == "matrix/agent"
    client = openai.AsyncOpenAI(base_url=started["base_url"], api_key=served.upstream.api_key)
    async with client:
        await client.chat.completions.create(**CHAT)
    finished = await served.finish(started["rollout_id"], rewards={"reward": reward})
    assert finished.status_code == 200, finished.text
    row: Any = await rollout_row(served.store, started["rollout_id"])
    assert (row.run, row.status) == ("matrix/agent", "finished")
    return started["rollout_id"]


async def test_served_rollouts_of_a_project_slash_model_run_are_sealed_and_trained(
    served: Served,
) -> None:
    import art

    first = await served_rollout(served, "matrix/agent", None, 1.0)
    group_id = await _group_of(served, first)
    second = await served_rollout(served, "matrix%2Fagent", group_id, 0.0)
    ids = [first, second]
    trajectories = await served.store.trajectories(ids)
    for rollout_id in ids:
        trajectories[rollout_id].metadata["artstore_rollout_id"] = rollout_id
    group = art.TrajectoryGroup([trajectories[r] for r in ids])
    sealed = await artstore.record_group(
        served.store, group, run="matrix/agent", batch=0, group_id=group_id
    )
    assert sealed == group_id
    (trained,) = await artstore.run_groups(served.store, "matrix/agent")
    assert [t.reward for t in trained.trajectories] == [1.0, 0.0]
    assert [t.metadata["artstore_rollout_id"] for t in trained.trajectories] == ids


async def _group_of(served: Served, rollout_id: str) -> str:
    query = select(t.rollouts.c.group_id).where(t.rollouts.c.rollout_id == rollout_id)
    async with served.store.database.read() as connection:
        return (await connection.execute(query)).scalar_one()
