"""Resume inside a rollout: an attempt that did not finish, run again, gets its recorded calls
back from the store, and the inference server sees only the calls that were not answered.

The agent: ten calls of an OpenAI client, each but the last asking for a tool that the
agent runs itself, against the LocalInferenceServer with a deterministic policy. The first
attempt stops (raises) after some calls; the second `resumes` it.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from budget import LONG, budget
from capture_helpers import served_model
from replay_agent import CALLS, Stopped, agent, policy, policy_of
from sqlalchemy import select
from upstream_ids import without_ids

import artstore
from artstore.schema import tables as t
from artstore.testing.inference_server import LocalInferenceServer


async def events_of(store: Any, rollout_id: str) -> list[Any]:
    return [e.decode() for e in await store.read_stream(f"rollout-{rollout_id}")]


async def calls_of(store: Any, rollout_id: str) -> list[Any]:
    """The rollout's `llm.call` events, and checks that its projection holds each once."""
    calls = [e for e in await events_of(store, rollout_id) if e.type == "llm.call"]
    async with store.database.read() as connection:
        indexes = await connection.execute(
            select(t.llm_calls.c.call_index).where(t.llm_calls.c.rollout_id == rollout_id)
        )
        assert sorted(indexes.scalars()) == [c.index for c in calls]
    return calls


def asked(call: Any) -> list[Any]:
    return [(c["name"], c["args"]) for c in call.tool_calls]


async def first_attempt(
    store: Any, server: LocalInferenceServer, stream: bool, stop_after: int
) -> str:
    model = served_model(server)
    with pytest.raises(Stopped):
        async with store.rollout(model, scenario="task") as earlier:
            await agent(server, stream=stream, stop_after=stop_after)
    return earlier.id


# Streamed in CI (the harder case); a whole response too in the long budget.
@pytest.mark.parametrize(
    "stream", [True, False] if LONG else [True], ids=lambda s: "streamed" if s else "whole"
)
async def test_resumed_attempt_sends_only_what_was_not_answered(store: Any, stream: bool) -> None:
    async with LocalInferenceServer(policy) as server:
        model = served_model(server)
        async with store.rollout(model, scenario="task") as whole:
            whole.result = await agent(server, stream=stream)
        earlier = await first_attempt(store, server, stream, stop_after=6)
        before = len(server.requests)
        async with store.rollout(model, scenario="task", resumes=earlier) as resumed:
            resumed.result = await agent(server, stream=stream)
        sent = server.requests[before:]

    assert len(sent) == CALLS - 6  # each answered call: 0 times at the inference server
    assert [len(r["messages"]) for r in sent] == [1 + 2 * i for i in range(6, CALLS)]
    assert resumed.result == whole.result

    earlier_calls = await calls_of(store, earlier)
    resumed_calls = await calls_of(store, resumed.id)
    whole_calls = await calls_of(store, whole.id)
    assert [c.index for c in resumed_calls] == list(range(CALLS))  # each call once
    assert [asked(c) for c in resumed_calls] == [asked(c) for c in whole_calls]
    assert [c.num_logprobs for c in resumed_calls] == [c.num_logprobs for c in whole_calls]
    # the served calls are the earlier attempt's records: the same output, logprobs, ids
    assert [c.output for c in resumed_calls[:6]] == [c.output for c in earlier_calls]

    events = await events_of(store, resumed.id)
    assert events[0].resumes == earlier
    replayed = [e.replayed_from for e in events if e.type == "llm.call"]
    assert replayed[:6] == [c.call_id for c in earlier_calls] and replayed[6:] == [None] * 4
    assert not [e for e in events if e.type == "llm.replay_diverged"]
    assert len((await store.trajectory(resumed.id)).messages_and_choices) == len(
        (await store.trajectory(whole.id)).messages_and_choices
    )


async def test_first_request_that_differs_goes_live_and_is_recorded(store: Any) -> None:
    async with LocalInferenceServer(policy) as server:
        model = served_model(server)
        earlier = await first_attempt(store, server, False, stop_after=7)
        before = len(server.requests)
        async with store.rollout(model, scenario="task", resumes=earlier) as resumed:
            resumed.result = await agent(server, stream=False, changed_from=3)
        sent = server.requests[before:]

    assert len(sent) == CALLS - 3  # calls 0-2 served; 3 differed: it and all later live
    events = await events_of(store, resumed.id)
    diverged = [e for e in events if e.type == "llm.replay_diverged"]
    earlier_calls = await calls_of(store, earlier)
    assert len(diverged) == 1
    assert diverged[0].index == 3 and diverged[0].recorded_call_id == earlier_calls[3].call_id
    assert diverged[0].fingerprint != diverged[0].recorded_fingerprint
    assert diverged[0].differs == ["messages"]  # names the field, holds none of its value
    replayed = [e.replayed_from for e in events if e.type == "llm.call"]
    assert replayed == [c.call_id for c in earlier_calls[:3]] + [None] * (CALLS - 3)
    assert "changed" in resumed.result


DRIVER = Path(__file__).parents[1] / "support" / "replay_crash_driver.py"


STORM_CALLS = 30  # a long tool-using conversation
STORM_KILLS = budget(4, 40)  # SIGKILLs per database


def run_driver(
    url: str, workdir: Path, server: LocalInferenceServer, kills: list[int], calls: int
) -> int:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(DRIVER.parents[2]), str(DRIVER.parent)]),
    }
    at = ",".join(str(n) for n in kills)
    arguments = [url, str(workdir), server.base_url, server.api_key, at, str(calls)]
    done = subprocess.run(
        [sys.executable, str(DRIVER), *arguments], env=env, capture_output=True, timeout=300
    )
    assert done.returncode in (0, -9), done.stderr.decode()[-3000:]
    return done.returncode


async def test_a_durable_rollout_killed_again_and_again_pays_for_no_answer_twice(
    store: Any, database_url: str, tmp_path: Path
) -> None:
    """A 30-call tool-using agent under `durable_rollouts`, SIGKILLed after random answers
    (STORM_KILLS times, a call number may repeat: a kill right after served calls), run
    again by the same loop after each kill: the inference server receives each of the 30
    requests exactly once, and the last attempt's trajectory is that of an uninterrupted
    run of the same agent, each call once."""
    kills = sorted(random.Random(STORM_KILLS).choices(range(STORM_CALLS - 1), k=STORM_KILLS))
    async with LocalInferenceServer(policy_of(STORM_CALLS)) as server:
        codes = []
        for _ in range(STORM_KILLS + 1):
            codes.append(
                await asyncio.to_thread(
                    run_driver, database_url, tmp_path, server, kills, STORM_CALLS
                )
            )
        sent = server.requests
    assert codes == [-9] * STORM_KILLS + [0]
    # Each answer paid for once: no request answered before a kill was sent again.
    assert [len(r["messages"]) for r in sent] == [1 + 2 * i for i in range(STORM_CALLS)]
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["answer"] == f"done: step {STORM_CALLS - 2} ok"
    calls = await calls_of(store, result["rollout_id"])
    assert [c.index for c in calls] == list(range(STORM_CALLS))
    served_back = max(kills) + 1  # the last attempt got every answer up to its kill served
    assert [c.replayed_from is not None for c in calls[:served_back]] == [True] * served_back
    assert not any(c.replayed_from for c in calls[served_back:])
    async with LocalInferenceServer(policy_of(STORM_CALLS)) as fresh:
        model = served_model(fresh)
        async with store.rollout(model, scenario="the task", run="uninterrupted") as once:
            once.result = await agent(fresh, stream=True, num_calls=STORM_CALLS)
    found = await store.trajectories([result["rollout_id"], once.id])
    resumed, uninterrupted = found[result["rollout_id"]], found[once.id]
    assert without_ids(resumed.messages()) == without_ids(uninterrupted.messages())


async def test_recorded_tools_are_served_back_and_others_run_again(store: Any) -> None:
    ran: list[tuple[str, int]] = []

    @artstore.recorded_tool
    async def sandbox(command: str, n: int) -> dict[str, Any]:
        ran.append((command, n))
        return {"out": f"{command} {n}"}

    @artstore.recorded_tool(name="clock")
    def clock(n: int) -> int:
        ran.append(("clock", n))
        return n * 10

    with pytest.raises(Stopped):
        async with store.rollout("agent", scenario="tools") as earlier:
            assert await sandbox("ls", 0) == {"out": "ls 0"}
            assert clock(1) == 10
            assert await sandbox("ls", 2) == {"out": "ls 2"}
            raise Stopped
    assert len(ran) == 3
    async with store.rollout("agent", scenario="tools", resumes=earlier.id) as resumed:
        assert await sandbox("ls", 0) == {"out": "ls 0"}  # served
        assert clock(1) == 10  # served
        assert await sandbox("rm", 2) == {"out": "rm 2"}  # differs: runs
        assert clock(3) == 30  # and every later call runs
    assert ran[3:] == [("rm", 2), ("clock", 3)]
    assert await sandbox("ls", 9) == {"out": "ls 9"}  # outside a rollout: runs
    events = [e for e in await events_of(store, resumed.id) if e.type == "tool.called"]
    recorded = [e for e in await events_of(store, earlier.id) if e.type == "tool.called"]
    assert [e.index for e in events] == [0, 1, 2, 3]
    assert [e.replayed_from for e in events] == [
        recorded[0].call_id,
        recorded[1].call_id,
        None,
        None,
    ]
    assert [e.result for e in events] == [{"out": "ls 0"}, 10, {"out": "rm 2"}, 30]


async def test_a_langgraph_agent_resumed_gets_its_chat_model_calls_back(store: Any) -> None:
    """artstore's `init_chat_model` in a ReAct graph: stopped after 4 model calls, resumed;
    its tool, a LangGraph tool over `artstore.recorded_tool`, runs once per step in all."""
    import warnings

    from langchain_core.tools import tool

    from artstore.langgraph import init_chat_model

    with warnings.catch_warnings():  # create_react_agent is deprecated in LangGraph 1.x
        warnings.simplefilter("ignore")
        from langgraph.prebuilt import create_react_agent

    runs: list[int] = []

    @tool
    @artstore.recorded_tool
    def step(n: int) -> str:
        """One step of the task."""
        runs.append(n)
        return f"step {n} ok"

    def graph() -> Any:  # inside a rollout: its chat model is the rollout's
        return create_react_agent(init_chat_model().bind_tools([step]), [step])

    question = {"messages": [("user", "do the task")]}
    async with LocalInferenceServer(policy) as server:
        model = served_model(server)
        with pytest.raises(Stopped):
            async with store.rollout(model, scenario="graph") as earlier:
                answered = 0
                async for update in graph().astream(question, stream_mode="updates"):
                    answered += "agent" in update
                    if answered == 4:
                        raise Stopped
        before = len(server.requests)
        async with store.rollout(model, scenario="graph", resumes=earlier.id) as resumed:
            state = await graph().ainvoke(question)
            resumed.result = state["messages"][-1].content
        sent = server.requests[before:]
    assert len(sent) == CALLS - 4
    assert resumed.result == f"done: step {CALLS - 2} ok"
    assert runs == list(range(CALLS - 1))  # the 3 results recorded before: served back
    calls = await calls_of(store, resumed.id)
    earlier_calls = await calls_of(store, earlier.id)
    assert [c.index for c in calls] == list(range(CALLS))
    assert [c.replayed_from for c in calls[:4]] == [c.call_id for c in earlier_calls]
    assert [c.output for c in calls[:4]] == [c.output for c in earlier_calls]
