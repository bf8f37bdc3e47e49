"""A real LangGraph graph on `artstore.langgraph.checkpointer`, on both databases: a node
fails in the middle of a run, the store is closed, and a new store object resumes the
graph from its last super-step (no finished node runs again, not even the one that
finished beside the failed one); a process killed with SIGKILL in the middle of a
super-step is resumed by another the same way; the history is read back from the log
and a past checkpoint is forked."""

from __future__ import annotations

import asyncio
import operator
import os
import signal
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path
from typing import Annotated, TypedDict

import langgraph_killed_agent
import pytest
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph
from waiting import eventually

import artstore
from artstore.errors import ConfigurationError
from artstore.langgraph import checkpointer
from artstore.schema import tables as t

PATIENCE_S = 120  # for search to finish beside the failing lookup, on a busy machine


class State(TypedDict):
    steps: Annotated[list[str], operator.add]


class Agent:
    """plan -> (search | lookup, in one super-step) -> answer; `lookup` fails while
    `failing` is set. Counts the runs of each node."""

    def __init__(self) -> None:
        self.runs: Counter[str] = Counter()
        self.failing = True
        # search and lookup run side by side; lookup fails only once search has finished,
        # so that search's write is there to keep however slow the machine is (else
        # LangGraph cancels a search that had not started yet).
        self.searched = threading.Event()

    def graph(self, saver):
        builder = StateGraph(State)
        builder.add_node("plan", self._node("plan"))
        builder.add_node("search", self._node("search"))
        builder.add_node("lookup", self._node("lookup"))
        builder.add_node("answer", self._node("answer"))
        builder.add_edge(START, "plan")
        builder.add_edge("plan", "search")
        builder.add_edge("plan", "lookup")
        builder.add_edge(["search", "lookup"], "answer")
        builder.add_edge("answer", END)
        return builder.compile(checkpointer=saver)

    def _node(self, name: str):
        def run(state: State) -> dict:
            self.runs[name] += 1
            if name == "lookup" and self.failing:
                self.searched.wait(timeout=PATIENCE_S)
                raise RuntimeError("the lookup service went away")
            if name == "search":
                self.searched.set()
            return {"steps": [name]}

        return run


async def uninterrupted(config: dict) -> tuple[dict, list]:
    """What the agent ends with, and its history's states, when nothing fails."""
    agent = Agent()
    agent.failing = False
    graph = agent.graph(InMemorySaver())
    result = await graph.ainvoke({"steps": []}, config)
    return result, [s.values async for s in graph.aget_state_history(config)]


async def test_a_graph_resumes_from_its_last_super_step_in_a_new_store(database_url):
    agent = Agent()
    config = {"configurable": {"thread_id": "agent-1"}}
    expected, expected_history = await uninterrupted(config)
    store = await artstore.open_store(database_url)
    try:
        async with store.rollout("my-model") as rollout:
            with pytest.raises(RuntimeError, match="went away"):
                await agent.graph(checkpointer(store)).ainvoke({"steps": []}, config)
    finally:
        await store.close()
    assert agent.runs == {"plan": 1, "search": 1, "lookup": 1}

    agent.failing = False
    async with await artstore.open_store(database_url) as reopened:
        graph = agent.graph(checkpointer(reopened))
        state = await graph.aget_state(config)
        assert state.next == ("lookup",)  # search's write was kept as a pending write
        result = await graph.ainvoke(None, config)
        assert result == expected
        # Nothing that had finished ran again: only the failed node, then the next step.
        assert agent.runs == {"plan": 1, "search": 1, "lookup": 2, "answer": 1}

        history = [s async for s in graph.aget_state_history(config)]
        assert [s.values for s in history] == expected_history
        assert sorted(history[0].values["steps"]) == ["answer", "lookup", "plan", "search"]
        assert [s.next for s in history] == [
            (),
            ("answer",),
            ("search", "lookup"),
            ("plan",),
            ("__start__",),
        ]
        # The checkpoints written inside the rollout name it; those after it none.
        events = await reopened.read_stream("langgraph-agent-1")
        named = {e.data.get("rollout_id") for e in events if e.type == "langgraph.checkpoint"}
        assert named == {rollout.id, None}

        # Time travel: fork the state after `plan` and run on from there.
        after_plan = history[2]
        forked = await graph.aupdate_state(after_plan.config, {"steps": ["edited"]})
        result = await graph.ainvoke(None, forked)
        assert result["steps"][:2] == ["plan", "edited"]
        assert sorted(result["steps"][2:]) == ["answer", "lookup", "search"]
        assert agent.runs["plan"] == 1 and agent.runs["answer"] == 2
        latest = await graph.aget_state(config)
        assert latest.values == result
        assert latest.parent_config["configurable"]["checkpoint_id"] is not None


async def test_a_process_killed_mid_super_step_resumes_with_what_finished_kept(
    database_url, tmp_path
):
    runs = tmp_path / "runs"
    runs.touch()
    config = {"configurable": {"thread_id": "killed"}}
    agent = subprocess.Popen(
        [sys.executable, langgraph_killed_agent.__file__, database_url, "killed", str(runs)],
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    try:
        async with await artstore.open_store(database_url) as store:
            saver = checkpointer(store)

            async def search_stored() -> bool:
                found = await saver.aget_tuple(config)
                return found is not None and any(
                    channel == "steps" and value == ["search"]
                    for _, channel, value in found.pending_writes or []
                )

            await eventually(search_stored, "the search node's write to be stored", timeout=120)
            await eventually(lambda: "lookup" in runs.read_text(), "lookup to start")
            agent.send_signal(signal.SIGKILL)
            assert agent.wait(timeout=60) == -signal.SIGKILL

            graph = langgraph_killed_agent.build(saver, Path(runs), lookup_waits=False)
            assert (await graph.aget_state(config)).next == ("lookup",)
            result = await graph.ainvoke(None, config)
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.wait()
    assert sorted(result["steps"]) == ["answer", "lookup", "plan", "search"]
    # Run again after the kill: the node that was killed, then the next step; never the
    # ones that had finished, not even `search`, which finished beside it.
    assert runs.read_text().split() == ["plan", "search", "lookup", "lookup", "answer"] or (
        runs.read_text().split() == ["plan", "lookup", "search", "lookup", "answer"]
    )


async def test_delete_thread_hides_the_thread_and_a_rebuild_hides_it_again(store):
    agent = Agent()
    agent.failing = False
    saver = checkpointer(store)
    graph = agent.graph(saver)
    for thread in ("kept", "deleted"):
        finished = await graph.ainvoke({"steps": []}, {"configurable": {"thread_id": thread}})
        assert len(finished["steps"]) == 4
    await saver.adelete_thread("deleted")

    async def threads() -> set[str]:
        return {c.config["configurable"]["thread_id"] async for c in saver.alist(None)}

    assert await threads() == {"kept"}
    deleted = {"configurable": {"thread_id": "deleted"}}
    assert await saver.aget_tuple(deleted) is None
    # The events stay in the log; the deletion is an event too.
    types = [e.type for e in await store.read_stream("langgraph-deleted")]
    assert types[-1] == "langgraph.thread_deleted"
    assert types.count("langgraph.checkpoint") == 5

    await store.rebuild_projections()
    assert await threads() == {"kept"}
    async with store.database.read() as connection:
        rows = (await connection.execute(t.langgraph_writes.select())).all()
    assert {row.thread_id for row in rows} <= {"kept"}
    # A thread id deleted starts a new history when used again.
    assert await graph.ainvoke({"steps": []}, deleted) == finished
    assert len([s async for s in graph.aget_state_history(deleted)]) == 5


async def test_the_sync_methods_run_from_another_thread_and_refuse_the_loops_own(store):
    agent = Agent()
    agent.failing = False
    saver = checkpointer(store)
    graph = agent.graph(saver)
    config = {"configurable": {"thread_id": "sync"}}
    result = await asyncio.to_thread(graph.invoke, {"steps": []}, config)
    assert result == (await uninterrupted(config))[0]
    history = await asyncio.to_thread(lambda: list(graph.get_state_history(config)))
    assert len(history) == 5
    assert (await saver.aget_tuple(config)).checkpoint["id"] == history[0].config["configurable"][
        "checkpoint_id"
    ]
    with pytest.raises(ConfigurationError, match=r"asyncio\.to_thread"):
        saver.get_tuple(config)


async def test_a_serializer_that_falls_back_to_pickle_is_refused(store):
    from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

    with pytest.raises(artstore.errors.InvalidArgumentError, match="pickle"):
        checkpointer(store, serde=JsonPlusSerializer(pickle_fallback=True))


async def test_long_conversations_are_stored_in_shared_chunks_and_read_back_equal(store):
    from langchain_core.messages import AIMessage, HumanMessage
    from langgraph.checkpoint.base import empty_checkpoint

    from artstore.langgraph.checkpointer import CHUNK_ITEMS, INLINE_BYTES

    saver = checkpointer(store)
    config = {"configurable": {"thread_id": "long", "checkpoint_ns": ""}}
    messages = [
        (HumanMessage if n % 2 else AIMessage)(content=f"message {n} " * 20, id=str(n))
        for n in range(3 * CHUNK_ITEMS)
    ]
    stored = []
    for length in (2 * CHUNK_ITEMS + 1, 3 * CHUNK_ITEMS):
        checkpoint = empty_checkpoint()
        values = {"messages": messages[:length], "report": "x" * (4 * INLINE_BYTES)}
        checkpoint["channel_values"] = values
        checkpoint["channel_versions"] = {"messages": length, "report": 1}
        changed = {"messages": length, **({} if stored else {"report": 1})}
        config = await saver.aput(config, checkpoint, {"step": length}, changed)
        big = {"rows": list(range(2000))}
        await saver.aput_writes(config, [("messages", messages[:1]), ("rows", big)], "task")
        stored.append((config, messages[:length], big))
    for config, expected, big in stored:
        found = await saver.aget_tuple(config)
        assert found.checkpoint["channel_values"]["messages"] == expected
        assert found.checkpoint["channel_values"]["report"] == "x" * (4 * INLINE_BYTES)
        assert found.pending_writes == [
            ("task", "messages", messages[:1]),
            ("task", "rows", big),
        ]
    events = [e for e in await store.read_stream("langgraph-long") if e.type.endswith("point")]
    first, second = (e.data["values"]["messages"]["chunks"] for e in events)
    assert len(first) == 3 and len(second) == 3
    assert first[:2] == second[:2]  # full chunks are stored once, shared by both
    assert "report" not in events[1].data["values"]  # unchanged: read from the first


async def test_credentials_in_the_state_are_overwritten_before_they_are_stored(store):
    from langgraph.checkpoint.base import empty_checkpoint

    from artstore.redaction import learn

    secret = "sk-checkpoint-" + "7f3a9c1e" * 4
    learn([secret])
    saver = checkpointer(store)
    config = {"configurable": {"thread_id": "secret", "checkpoint_ns": ""}}
    checkpoint = empty_checkpoint()
    checkpoint["channel_values"] = {"env": {"OPENAI_API_KEY": secret}, "log": [secret] * 40}
    checkpoint["channel_versions"] = {"env": 1, "log": 1}
    config = await saver.aput(config, checkpoint, {"key": secret}, {"env": 1, "log": 1})
    found = await saver.aget_tuple(config)
    assert found.checkpoint["channel_values"]["env"] == {"OPENAI_API_KEY": "*" * len(secret)}
    assert secret not in repr(found)
    async with store.database.read() as connection:
        rows = (await connection.execute(t.events.select())).all()
        rows += (await connection.execute(t.blobs.select())).all()
    assert rows and not any(secret in repr(row) for row in rows)


async def test_a_thread_id_no_stream_id_can_hold_still_keeps_its_checkpoints(store):
    agent = Agent()
    agent.failing = False
    saver = checkpointer(store)
    graph = agent.graph(saver)
    for thread_id in ("t" * 1000, "nul\x00thread"):
        config = {"configurable": {"thread_id": thread_id}}
        finished = await graph.ainvoke({"steps": []}, config)
        assert len(finished["steps"]) == 4
        assert (await graph.aget_state(config)).values == finished
        found = await saver.aget_tuple(config)
        assert found.config["configurable"]["thread_id"] == thread_id
        listed = [c.config["configurable"]["thread_id"] async for c in saver.alist(config)]
        assert listed == [thread_id] * 5
