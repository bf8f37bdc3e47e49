"""A served rollout resumed: an agent started again after a crash names the rollout it
left (`resumes`), and the answers that rollout recorded are served back by the proxy,
not asked of the upstream again, until a request differs."""

from __future__ import annotations

from typing import Any

import openai
import pytest
from agents import python_agent
from serving import Served
from sqlalchemy import select

from artstore.schema import tables as t


async def calls_of(store: Any, rollout_id: str) -> list[dict[str, Any]]:
    events = await store.read_stream(f"rollout-{rollout_id}")
    return [e.data for e in events if e.type == "llm.call"]


async def status_of(store: Any, rollout_id: str) -> tuple[str, str | None]:
    query = select(t.rollouts.c.status, t.rollouts.c.error_type).where(
        t.rollouts.c.rollout_id == rollout_id
    )
    async with store.database.read() as connection:
        status, error_type = (await connection.execute(query)).one()
    return status, error_type


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
async def test_a_resumed_rollout_is_served_its_recorded_answers(
    served: Served, stream: bool
) -> None:
    key = served.upstream.api_key
    first = await served.start("r", scenario={"city": "Paris"})
    client = openai.AsyncOpenAI(base_url=first["base_url"], api_key=key)
    conversation = await python_agent(client, "Paris", stream=stream)
    received = len(served.upstream.requests)  # the agent dies here, its rollout unfinished

    again = await served.start("r", scenario={"city": "Paris"}, resumes=first["rollout_id"])
    client = openai.AsyncOpenAI(base_url=again["base_url"], api_key=key)
    assert await python_agent(client, "Paris", stream=stream) == conversation
    assert (await served.finish(again["rollout_id"])).status_code == 200

    assert len(served.upstream.requests) == received  # nothing asked of the upstream again
    earlier = await calls_of(served.store, first["rollout_id"])
    copies = await calls_of(served.store, again["rollout_id"])
    assert [c["replayed_from"] for c in copies] == [c["call_id"] for c in earlier]
    assert [c["output"] for c in copies] == [c["output"] for c in earlier]
    assert [c["stream"] for c in copies] == [stream, stream]
    assert await status_of(served.store, first["rollout_id"]) == ("failed", "RolloutResumed")
    trajectory = await served.store.trajectory(again["rollout_id"])
    assert len(trajectory.messages()) == len(conversation)


async def test_a_request_that_differs_goes_to_the_upstream_and_is_recorded(
    served: Served,
) -> None:
    key = served.upstream.api_key
    first = await served.start("r", scenario={"city": "Paris"})
    await python_agent(
        openai.AsyncOpenAI(base_url=first["base_url"], api_key=key), "Paris", stream=False
    )
    received = len(served.upstream.requests)

    again = await served.start("r", resumes=first["rollout_id"])
    client = openai.AsyncOpenAI(base_url=again["base_url"], api_key=key)
    await python_agent(client, "Lyon", stream=False)  # another question: nothing to serve
    assert len(served.upstream.requests) == received + 2
    copies = [c for c in await calls_of(served.store, again["rollout_id"]) if c["replayed_from"]]
    assert copies == []
    diverged = await served.store.read_all(types=["llm.replay_diverged"])
    assert [e.data["rollout_id"] for e in diverged] == [again["rollout_id"]]
    assert diverged[0].data["differs"] == ["messages"]


async def test_resuming_a_finished_or_unknown_rollout_is_refused(served: Served) -> None:
    url = f"{served.address}/api/runs/r/rollouts"
    finished = await served.start("r")
    assert (await served.finish(finished["rollout_id"])).status_code == 200
    refused = await served.http.post(
        url, json={"model": "agent", "resumes": finished["rollout_id"]}
    )
    assert refused.status_code == 409 and refused.json()["error"]["code"] == "rollout_finished"
    unknown = await served.http.post(url, json={"model": "agent", "resumes": "no-such-rollout"})
    assert unknown.status_code == 404
    elsewhere = await served.start("other")
    wrong_run = await served.http.post(
        url, json={"model": "agent", "resumes": elsewhere["rollout_id"]}
    )
    assert wrong_run.status_code == 404
