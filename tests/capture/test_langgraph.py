"""LangGraph agents recorded by artstore: every LLM call an event, trajectories as ART builds them.

Real LangGraph graphs (a ReAct agent with two tools, a graph with structured output) call
the real `langchain-openai` client over HTTP against the LocalInferenceServer, on SQLite
and on PostgreSQL.
"""

from __future__ import annotations

import asyncio
import contextvars
import copy
import json
import re
import threading
import warnings
from typing import Annotated, Any, TypedDict

import art
import pytest
from art.langgraph import init_chat_model as art_init_chat_model
from art.langgraph import llm_wrapper
from art.langgraph import wrap_rollout as art_wrap_rollout
from capture_helpers import served_model
from langchain_core.messages import AnyMessage, HumanMessage, SystemMessage
from langchain_core.tools import tool
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from openai.types.chat.chat_completion import Choice
from pydantic import BaseModel, Field
from sqlalchemy import select

from artstore.capture.rollout import ArtLogger
from artstore.errors import NoRolloutError
from artstore.langgraph import init_chat_model, wrap_rollout
from artstore.schema import tables as t
from artstore.testing.inference_server import LocalInferenceServer, tool_calling_policy

# --- the agents ---------------------------------------------------------------------------


@tool
def get_weather(city: str) -> str:
    """Get the weather for a city."""
    return f"sunny in {city}"


@tool
def get_population(city: str, year: int) -> str:
    """Get the population of a city in a year."""
    return f"{city} had 1000 people in {year}"


TOOLS = [get_weather, get_population]


class Answer(BaseModel):
    """The answer to the user's question."""

    city: str
    temperature: float = Field(ge=-50, le=60)
    sunny: bool


class SummaryState(TypedDict, total=False):
    messages: Annotated[list[AnyMessage], add_messages]
    answer: Answer


def react_agent(
    model: Any,
    *,
    prompt: str | None = "You are a weather researcher.",
    name: str | None = None,
    tools: list[Any] = TOOLS,
):
    with warnings.catch_warnings():  # create_react_agent is deprecated in LangGraph 1.x
        warnings.simplefilter("ignore")
        from langgraph.prebuilt import create_react_agent

        return create_react_agent(model, tools, prompt=prompt, name=name)


def summary_graph(model: Any):
    """A graph whose one node answers with structured output, under a prompt of its own."""

    async def summarize(state: SummaryState) -> SummaryState:
        structured = model.with_structured_output(Answer)
        findings = state["messages"][-1].content
        answer = await structured.ainvoke(
            [SystemMessage("Summarize the findings as an Answer."), HumanMessage(findings)]
        )
        return {"answer": answer}

    graph = StateGraph(SummaryState)
    graph.add_node("summarize", summarize)
    graph.add_edge(START, "summarize")
    graph.add_edge("summarize", END)
    return graph.compile()


async def research(init: Any, question: str, name: str | None = None) -> art.Trajectory:
    """Two conversations (two system prompts): a ReAct agent, then a structured summary."""
    state = await react_agent(init(), name=name).ainvoke({"messages": [("user", question)]})
    summary = await summary_graph(init()).ainvoke({"messages": state["messages"][-1:]})
    return art.Trajectory(
        messages_and_choices=[],
        reward=1.0 if summary["answer"].sunny else 0.0,
        metrics={"turns": len(state["messages"])},
        metadata={"question": question},
    )


def deterministic(request: dict[str, Any], sample_index: int) -> Any:
    """The default policy, ignoring how often a prompt was seen: both flows get one answer."""
    return tool_calling_policy(request, 0)


# --- comparing with ART ---------------------------------------------------------------------


def dump_history(messages_and_choices: list[Any]) -> list[tuple[str, Any]]:
    return [
        ("choice", item.model_dump()) if isinstance(item, Choice) else ("message", dict(item))
        for item in messages_and_choices
    ]


def dump_trajectory(trajectory: art.Trajectory) -> dict[str, Any]:
    """Every field ART trains on, Choice objects (with logprobs) as `model_dump()`."""
    return {
        "messages_and_choices": dump_history(trajectory.messages_and_choices),
        "tools": trajectory.tools,
        "additional_histories": [
            {"messages_and_choices": dump_history(h.messages_and_choices), "tools": h.tools}
            for h in trajectory.additional_histories
        ],
        "reward": trajectory.reward,
        "metrics": trajectory.metrics,
        "metadata": trajectory.metadata,
        "logs": trajectory.logs,
    }


_RANDOM_IDS = re.compile(r"call_[0-9a-f]{24}|chatcmpl-[0-9a-f]{32}|lc_run--[0-9a-f-]+")


def without_random_ids(value: Any) -> str:
    """JSON of `value` with each response/tool-call id replaced by its order of appearance."""
    seen: dict[str, str] = {}
    text = json.dumps(value, sort_keys=True, default=str)
    return _RANDOM_IDS.sub(lambda m: seen.setdefault(m.group(0), f"<id{len(seen)}>"), text)


def assert_trainable(trajectory: art.Trajectory) -> None:
    histories = [trajectory.messages_and_choices] + [
        h.messages_and_choices for h in trajectory.additional_histories
    ]
    for history in histories:
        choices = [item for item in history if isinstance(item, Choice)]
        assert choices and all(c.logprobs and c.logprobs.content for c in choices)


class Tee:
    """A logger for ART's `CURRENT_CONFIG` that hands every call to several loggers.

    Each gets a copy of the entry as it is at the call: ART 0.5.18's FileLogger pickled it
    then, while later ARTs keep the live objects, so that a message the agent changes
    afterwards (LangGraph renames answers) would reach ART's trajectory changed. artstore
    records what the model was sent; the comparison is with ART given the same.
    """

    def __init__(self, *loggers: Any) -> None:
        self.loggers = loggers

    def log(self, name: str, entry: dict[str, Any]) -> None:
        for logger in self.loggers:
            logger.log(name, copy.deepcopy(entry))


# --- the trajectory equals ART's --------------------------------------------------------------


@pytest.mark.parametrize("agent_name", [None, "researcher"])
async def test_trajectory_equals_arts_for_the_same_calls(
    store, tmp_path, monkeypatch, agent_name: str | None
) -> None:
    """One run, every call logged both by ART's FileLogger and by artstore (a tee)."""
    monkeypatch.chdir(tmp_path)  # ART writes .art/langgraph/<thread> here
    async with LocalInferenceServer() as server:
        model = served_model(server)
        async with store.rollout(model, scenario={"question": "Weather in Paris?"}) as rollout:
            thread = llm_wrapper.add_thread(  # a log path (0.5.18) or a logger (later)
                "tee", model.inference_base_url, model.inference_api_key, "test-model"
            )
            config = llm_wrapper.CURRENT_CONFIG.get()
            tee = Tee(config["logger"], ArtLogger(rollout))
            llm_wrapper.CURRENT_CONFIG.set({**config, "logger": tee})
            # A name makes LangGraph rename each answer after its call (a field changed on
            # a message already recorded): the next calls must record the renamed one.
            returned = await research(art_init_chat_model, "Weather in Paris?", agent_name)
            rollout.metrics.update(returned.metrics)
            rollout.metadata.update(returned.metadata)

    arts = llm_wrapper.create_messages_from_logs(thread, returned)
    ours = await store.trajectory(rollout.id)

    assert dump_trajectory(ours) | {"reward": arts.reward} == dump_trajectory(arts)
    assert [type(item) for item in ours.messages_and_choices] == [
        type(item) for item in arts.messages_and_choices
    ]
    # The summary has a system prompt of its own: a second conversation. Renamed answers
    # no longer equal the recorded outputs: by ART's rule each call then starts one.
    expected = 1 if agent_name is None else 3
    assert len(ours.additional_histories) == len(arts.additional_histories) == expected
    assert ours.tools and [t["function"]["name"] for t in ours.tools] == [
        "get_weather",
        "get_population",
    ]
    assert [t["function"]["name"] for t in ours.additional_histories[-1].tools] == ["Answer"]
    assert_trainable(ours)


async def test_wrap_rollout_returns_what_arts_wrap_rollout_returns(store, tmp_path, monkeypatch):
    """The same agent under ART's own flow and under artstore's, side by side."""
    monkeypatch.chdir(tmp_path)
    question = "Weather in Lisbon?"
    async with LocalInferenceServer(deterministic) as server:
        model = served_model(server)
        wrapped = art_wrap_rollout(model, lambda: research(art_init_chat_model, question))
        # A task of its own: ART's add_thread sets its context variable for good.
        arts = await asyncio.create_task(wrapped())
    async with LocalInferenceServer(deterministic) as server:
        model = served_model(server)
        ours = await wrap_rollout(store, model, research, scenario=lambda init, q: {"question": q})(
            init_chat_model, question
        )
    stamped = ours.metadata.pop("artstore_rollout_id")  # which rollout it is (ART has no store)

    assert without_random_ids(dump_trajectory(ours)) == without_random_ids(dump_trajectory(arts))
    assert ours.reward == 1.0 and ours.metadata == {"question": question}
    assert len(ours.additional_histories) == 1  # the summary's own system prompt
    assert_trainable(ours)

    (rollout_id,) = (await _rows(store, select(t.rollouts.c.rollout_id)))[0]
    assert stamped == rollout_id
    stored = await store.trajectory(rollout_id)
    assert stored.metrics == ours.metrics and stored.metadata == ours.metadata
    assert dump_history(stored.messages_and_choices) == dump_history(ours.messages_and_choices)
    (started,) = await store.read_stream(f"rollout-{rollout_id}", limit=1)
    assert started.data["scenario"] == {"question": question}


async def test_agent_written_for_art_is_recorded_unchanged(store) -> None:
    async with LocalInferenceServer() as server:
        async with store.rollout(served_model(server), scenario="Weather in Oslo?") as rollout:
            agent = react_agent(art_init_chat_model())  # ART's own, unchanged
            await agent.ainvoke({"messages": [("user", "Weather in Oslo?")]})

    calls = await _rows(store, select(t.llm_calls).order_by(t.llm_calls.c.call_index))
    assert [c.rollout_id for c in calls] == [rollout.id] * 3  # one row per call
    assert [c.call_index for c in calls] == [0, 1, 2]
    assert [c.finish_reason for c in calls] == ["tool_calls", "tool_calls", "stop"]
    assert [c.source for c in calls] == ["langchain"] * 3
    # Recorded from HTTP when sent, then logged by ART's wrapper: the log supersedes the
    # HTTP record and keeps its timing (ART's wrapper cannot time calls).
    assert all(c.has_logprobs and c.latency_s > 0 for c in calls)
    events = [e.data for e in await store.read_stream(rollout.stream_id) if e.type == "llm.call"]
    http = [e for e in events if e["source"] == "http"]
    logged = [e for e in events if e["source"] == "langchain"]
    assert [e["supersedes"] for e in logged] == [e["call_id"] for e in http]
    assert [e["index"] for e in logged] == [e["index"] for e in http] == [0, 1, 2]
    trajectory = await store.trajectory(rollout.id)
    assert [type(m).__name__ for m in trajectory.messages_and_choices] == [
        "dict",
        "dict",
        "Choice",
        "dict",
        "Choice",
        "dict",
        "Choice",
    ]


# --- what a call event keeps --------------------------------------------------------------------


async def test_call_events_keep_messages_tools_usage_latency(store) -> None:
    async with LocalInferenceServer(latency_s=0.05) as server:
        async with store.rollout(served_model(server)) as rollout:
            await react_agent(init_chat_model()).ainvoke({"messages": [("user", "Rome?")]})

    events = [e for e in await store.read_stream(rollout.stream_id) if e.type == "llm.call"]
    assert [e.data["index"] for e in events] == [0, 1, 2]
    first = events[0].data
    assert first["model"] == "test-model" and first["latency_s"] >= 0.05
    assert first["prompt_tokens"] > 0 and first["completion_tokens"] == first["num_logprobs"] > 0
    assert first["tool_calls"][0]["name"] == "get_weather"
    bodies = await store.get_blobs([*first["input"], first["output"], first["tools"]])
    output = json.loads(bodies[first["output"]])
    assert output["type"] == "ai"
    assert output["data"]["response_metadata"]["logprobs"]["content"][0]["logprob"] < 0
    assert [json.loads(bodies[h])["type"] for h in first["input"]] == ["system", "human"]
    tools = json.loads(bodies[first["tools"]])
    assert [tool["function"]["name"] for tool in tools] == ["get_weather", "get_population"]
    # The growing conversation stores each message once.
    referenced = {h for e in events for h in [*e.data["input"], e.data["output"]]}
    assert len(referenced) == 2 + 3 + 2  # system, user; three answers; two tool results

    calls = await _rows(store, select(t.llm_calls).order_by(t.llm_calls.c.call_index))
    assert [c.num_input_messages for c in calls] == [2, 4, 6]
    assert all(c.latency_s >= 0.05 and c.total_tokens > 0 for c in calls)
    messages = await _rows(
        store,
        select(t.trajectory_messages)
        .where(t.trajectory_messages.c.rollout_id == rollout.id)
        .order_by(t.trajectory_messages.c.message_index),
    )
    assert [m.role for m in messages] == [
        "system",
        "user",
        "assistant",
        "tool",
        "assistant",
        "tool",
        "assistant",
    ]
    assert [m.trainable for m in messages].count(True) == 3


async def test_structured_output_graph(store) -> None:
    async with LocalInferenceServer() as server:
        async with store.rollout(served_model(server)) as rollout:
            result = await summary_graph(init_chat_model()).ainvoke(
                {"messages": [HumanMessage("Sunny in Nice, 24 degrees.")]}
            )
    assert isinstance(result["answer"], Answer)
    trajectory = await store.trajectory(rollout.id)
    (choice,) = [m for m in trajectory.messages_and_choices if isinstance(m, Choice)]
    assert choice.message.tool_calls[0].function.name == "Answer"
    assert [tool["function"]["name"] for tool in trajectory.tools] == ["Answer"]


async def test_structured_output_keeps_bound_tools(store) -> None:
    async with LocalInferenceServer() as server:
        async with store.rollout(served_model(server)):
            model = init_chat_model().bind_tools([get_weather]).with_structured_output(Answer)
            both = init_chat_model().with_structured_output(Answer).bind_tools([get_weather])
            raw = (
                await init_chat_model()
                .with_structured_output(Answer, include_raw=True)
                .ainvoke("Sunny in Nice?")
            )
    # ART's bind_tools drops a structured output; both orders keep both here.
    assert [t["function"]["name"] for t in model.tools] == ["get_weather", "Answer"]
    assert [t["function"]["name"] for t in both.tools] == ["get_weather", "Answer"]
    assert isinstance(raw["parsed"], Answer) and raw["parsing_error"] is None
    assert raw["raw"].tool_calls[0]["name"] == "Answer"


async def test_multi_conversation_rollout_has_additional_histories(store) -> None:
    async with LocalInferenceServer() as server:
        async with store.rollout(served_model(server)) as rollout:
            await react_agent(init_chat_model(), prompt="You are agent A.").ainvoke(
                {"messages": [("user", "Weather in Bern?")]}
            )
            await react_agent(init_chat_model(), prompt="You are agent B.").ainvoke(
                {"messages": [("user", "Weather in Graz?")]}
            )
    trajectory = await store.trajectory(rollout.id)
    assert trajectory.messages_and_choices[0] == {"role": "system", "content": "You are agent A."}
    (other,) = trajectory.additional_histories
    assert other.messages_and_choices[0] == {"role": "system", "content": "You are agent B."}
    assert len(other.messages_and_choices) == 7 and other.tools == trajectory.tools
    rows = await _rows(store, select(t.trajectory_messages.c.history_index))
    assert sorted({r.history_index for r in rows}) == [0, 1]


# --- concurrency and threads ----------------------------------------------------------------------


@pytest.mark.slow
async def test_128_concurrent_rollouts_are_recorded_completely_and_apart(store) -> None:
    tokens = [f"zz{i:03d}x{i * 7919 % 100000:05d}" for i in range(128)]

    async def one(server: LocalInferenceServer, index: int) -> str:
        init = init_chat_model if index % 2 else art_init_chat_model  # both flows at once
        async with store.rollout(served_model(server), scenario={"token": tokens[index]}) as r:
            await react_agent(init()).ainvoke(
                {"messages": [("user", f"Where is {tokens[index]}?")]}
            )
        return r.id

    async with LocalInferenceServer() as server:
        ids = await asyncio.gather(*(one(server, i) for i in range(128)))

    token_re = re.compile(r"zz\d{3}x\d{5}")
    streams = await store.read_streams(f"rollout-{rollout_id}" for rollout_id in ids)
    hashes = {
        h
        for events in streams.values()
        for e in events
        if e.type == "llm.call"
        for h in [*e.data["input"], e.data["output"]]
    }
    bodies = await store.get_blobs(hashes)
    for index, (rollout_id, token) in enumerate(zip(ids, tokens, strict=True)):
        events = streams[f"rollout-{rollout_id}"]
        # ART's wrapper: each call recorded from HTTP, then superseded by its log.
        records = 3 if index % 2 else 6
        assert [e.type for e in events] == [
            "rollout.started",
            *["llm.call"] * records,
            "rollout.finished",
        ]
        superseded = {e.data["supersedes"] for e in events if e.data.get("supersedes")}
        assert len(superseded) == records - 3
        for event in events[1:-1]:
            mentioned = {
                m
                for h in [*event.data["input"], event.data["output"]]
                for m in token_re.findall(bodies[h])
            }
            assert mentioned == {token}  # its own scenario's token, and no other
            assert token in bodies[event.data["output"]]
    trajectories = await store.trajectories(ids)
    assert all(len(tr.messages_and_choices) == 7 for tr in trajectories.values())
    rows = await _rows(store, select(t.rollouts.c.status, t.rollouts.c.num_llm_calls))
    assert [tuple(r) for r in rows] == [("finished", 3)] * 128


async def test_sync_invoke_in_a_worker_thread_is_recorded_in_its_rollout(store) -> None:
    """A sync LangGraph node runs in an executor thread; its calls belong to its rollout."""
    threads: dict[str, int] = {}

    def build_graph():
        def call_model(state: SummaryState) -> SummaryState:
            threads[state["messages"][0].content] = threading.get_ident()
            return {"messages": [init_chat_model().bind_tools(TOOLS).invoke(state["messages"])]}

        graph = StateGraph(SummaryState)
        graph.add_node("call_model", call_model)
        graph.add_edge(START, "call_model")
        graph.add_edge("call_model", END)
        return graph.compile()

    async def one(server: LocalInferenceServer, city: str) -> str:
        async with store.rollout(served_model(server), scenario=city) as rollout:
            await build_graph().ainvoke({"messages": [HumanMessage(f"Weather in {city}?")]})
        return rollout.id

    async with LocalInferenceServer() as server:
        ids = await asyncio.gather(*(one(server, city) for city in ["Turin", "Porto", "Ghent"]))

    assert threading.get_ident() not in threads.values()  # the calls ran in worker threads
    for rollout_id, city in zip(ids, ["Turin", "Porto", "Ghent"], strict=True):
        trajectory = await store.trajectory(rollout_id)
        user, answer = trajectory.messages_and_choices
        assert user == {"role": "user", "content": f"Weather in {city}?"}
        assert city in answer.message.tool_calls[0].function.arguments
        (call,) = await _rows(
            store, select(t.llm_calls.c.latency_s).where(t.llm_calls.c.rollout_id == rollout_id)
        )
        assert call.latency_s > 0


# --- failures ----------------------------------------------------------------------------------


async def test_failing_agent_leaves_a_failed_rollout_with_its_calls(store) -> None:
    @tool
    def get_flights(city: str) -> str:
        """Find flights to a city."""
        raise RuntimeError(f"flight service down for {city}")

    async with LocalInferenceServer() as server:
        with pytest.raises(RuntimeError, match="flight service down"):
            async with store.rollout(served_model(server)) as rollout:
                agent = react_agent(init_chat_model(), prompt=None, tools=[get_flights])
                await agent.ainvoke({"messages": [("user", "Flights to Riga?")]})

    events = await store.read_stream(rollout.stream_id)
    assert [e.type for e in events] == ["rollout.started", "llm.call", "rollout.failed"]
    assert events[-1].data["error_type"] == "RuntimeError"
    assert "flight service down" in events[-1].data["traceback"]
    (row,) = await _rows(store, select(t.rollouts).where(t.rollouts.c.rollout_id == rollout.id))
    assert row.status == "failed" and row.num_llm_calls == 1
    trajectory = await store.trajectory(rollout.id)  # the calls made before the error
    assert [type(m).__name__ for m in trajectory.messages_and_choices] == ["dict", "Choice"]


async def test_failed_calls_are_recorded_with_their_exception_then_raised(store) -> None:
    async with LocalInferenceServer(fail_when=lambda request: True) as server:
        with pytest.raises(Exception, match="Injected failure") as raised:
            async with store.rollout(served_model(server)) as rollout:
                await init_chat_model(max_retries=0).ainvoke("Weather in Kyiv?")
    (call,) = await _rows(store, select(t.llm_calls))
    assert call.error_type == type(raised.value).__name__
    assert "Injected failure" in call.error_message and call.latency_s > 0
    assert call.rollout_id == rollout.id and not call.has_logprobs


async def test_with_retry_retries_and_records_every_attempt(store) -> None:
    attempts: list[int] = []

    def fail_twice(request: dict[str, Any]) -> bool:
        attempts.append(1)
        return len(attempts) <= 2

    async with LocalInferenceServer(fail_when=fail_twice) as server:
        async with store.rollout(served_model(server)) as rollout:
            model = init_chat_model(max_retries=0).with_retry(
                stop_after_attempt=3, wait_exponential_jitter=False
            )
            await model.ainvoke("Weather in Baku?")
            sync_model = init_chat_model(max_retries=0).with_retry(stop_after_attempt=2)
            await asyncio.to_thread(sync_model.invoke, "Weather in Minsk?")

    calls = await _rows(store, select(t.llm_calls).order_by(t.llm_calls.c.call_index))
    assert [c.error_type is None for c in calls] == [False, False, True, True]
    assert "Injected failure" in calls[0].error_message
    trajectory = await store.trajectory(rollout.id)
    assert len(trajectory.messages_and_choices) == 2  # failed attempts are not trained on
    assert len(trajectory.additional_histories) == 1


async def test_init_chat_model_outside_a_rollout_is_a_clear_error(store) -> None:
    with pytest.raises(NoRolloutError, match=r"store\.rollout"):
        init_chat_model()
    async with LocalInferenceServer() as server:
        async with store.rollout(served_model(server)):
            model = init_chat_model()
        with pytest.raises(NoRolloutError):
            await model.ainvoke("Weather in Sofia?")  # its rollout has ended
        async with store.rollout(served_model(server)) as second:
            await model.ainvoke("Weather in Sofia?")  # recorded in the rollout it runs in
        thread_context = contextvars.Context()  # a thread that did not copy the context
        async with store.rollout(served_model(server)):
            with pytest.raises(NoRolloutError, match="copy_context"):
                await asyncio.to_thread(thread_context.run, model.invoke, "Sofia?")
    (call,) = await _rows(store, select(t.llm_calls.c.rollout_id))
    assert call.rollout_id == second.id


async def test_calls_are_queued_without_waiting_and_durable_on_exit(store, database_url) -> None:
    import artstore

    async with LocalInferenceServer() as server:
        async with store.rollout(served_model(server)) as rollout:
            await init_chat_model().ainvoke("Weather in Vigo?")
            assert not rollout._pending[-1].done()  # handed to the writer, not committed
    other = await artstore.open_store(database_url)  # another connection pool
    try:
        events = await other.read_stream(rollout.stream_id)
        assert [e.type for e in events] == ["rollout.started", "llm.call", "rollout.finished"]
    finally:
        await other.close()


async def _rows(store, query) -> list[Any]:
    async with store.database.read() as connection:
        return list((await connection.execute(query)).all())
