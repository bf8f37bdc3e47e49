"""A LangGraph graph driven every way LangGraph offers: each call recorded once, as ART builds it.

One real ReAct graph (one tool, so the model asks for it, then answers) runs through
`invoke`, `ainvoke`, `stream` / `astream` in each `stream_mode` (and a list of them) and
`astream_events`, with chat models that stream and ones that do not. LangGraph makes a
chat model stream whenever it streams messages (`messages` mode, `astream_events`), and
LangChain then keeps no response id, which is what matched a call logged by ART's
wrapper to its HTTP record. Each case checks:

- `v_llm_calls` holds exactly the calls the inference server received, each once;
- `store.trajectory()` equals, field by field and key by key, what ART's own
  `art.langgraph` flow builds: for ART's chat model from the very same run (each call
  logged both by ART's logger and by artstore's), for artstore's chat model from ART's
  flow run on its own against a deterministic server (ids aside).
"""

from __future__ import annotations

import asyncio
import json
import warnings
from collections.abc import Callable
from typing import Any

import art
import pytest
from art.langgraph import init_chat_model as art_init_chat_model
from art.langgraph import llm_wrapper
from capture_helpers import assert_each_call_recorded_once, served_model
from langchain_core.tools import tool
from openai.types.chat.chat_completion import Choice
from test_langgraph import Tee, deterministic, without_random_ids

from artstore.art_versions import has_exchanges
from artstore.capture.rollout import ArtLogger
from artstore.langgraph import init_chat_model
from artstore.testing.inference_server import LocalInferenceServer

QUESTION = {"messages": [("user", "Weather in Oslo?")]}


@tool
def get_weather(city: str) -> str:
    """Get the weather for a city."""
    return f"sunny in {city}"


def graph_of(model: Any):
    with warnings.catch_warnings():  # create_react_agent is deprecated in LangGraph 1.x
        warnings.simplefilter("ignore")
        from langgraph.prebuilt import create_react_agent

        return create_react_agent(model, [get_weather])


# --- the ways to drive a graph --------------------------------------------------------------

MODES = ["values", "messages", "updates", ["values", "messages", "updates"]]


def _sync_stream(mode: Any) -> Callable[[Any], Any]:
    async def drive(graph: Any) -> None:
        await asyncio.to_thread(lambda: list(graph.stream(QUESTION, stream_mode=mode)))

    return drive


def _async_stream(mode: Any) -> Callable[[Any], Any]:
    async def drive(graph: Any) -> None:
        async for _ in graph.astream(QUESTION, stream_mode=mode):
            pass

    return drive


async def _invoke(graph: Any) -> None:
    await asyncio.to_thread(graph.invoke, QUESTION)  # a sync graph, in a worker thread


async def _ainvoke(graph: Any) -> None:
    await graph.ainvoke(QUESTION)


async def _astream_events(graph: Any) -> None:
    async for _ in graph.astream_events(QUESTION, version="v2"):
        pass


def _name(mode: Any) -> str:
    return "+".join(mode) if isinstance(mode, list) else mode


DRIVERS: dict[str, Callable[[Any], Any]] = {
    "invoke": _invoke,
    "ainvoke": _ainvoke,
    **{f"stream-{_name(m)}": _sync_stream(m) for m in MODES},
    **{f"astream-{_name(m)}": _async_stream(m) for m in MODES},
    "astream_events": _astream_events,
}
# A chat model that streams by itself changes only what LangGraph does not make stream.
CASES = [(driver, False) for driver in DRIVERS] + [
    (driver, True) for driver in ["invoke", "ainvoke", "stream-values", "astream-updates"]
]


# --- the chat models --------------------------------------------------------------------------


def art_chat_model(streaming: bool) -> Any:
    """ART's `init_chat_model()`; streaming, what ART >= 0.5.20 makes of `streaming=True`."""
    if not streaming:
        return art_init_chat_model()
    if has_exchanges():  # ART 0.5.18's init_chat_model drops its keyword arguments
        return art_init_chat_model(streaming=True)
    from langchain_openai import ChatOpenAI

    config = llm_wrapper.CURRENT_CONFIG.get()
    client = ChatOpenAI(
        base_url=config["base_url"],
        api_key=config["api_key"],
        model=config["model"],
        temperature=1.0,
        streaming=True,
    )
    return llm_wrapper.LoggingLLM(client, config["logger"])


# --- comparing --------------------------------------------------------------------------------


def histories(trajectory: art.Trajectory) -> str:
    """The trajectory's histories and tools as JSON, keys in their order, Choices dumped."""

    def items(history: list[Any]) -> list[Any]:
        return [
            ["choice", item.model_dump()] if isinstance(item, Choice) else ["message", item]
            for item in history
        ]

    return json.dumps(
        {
            "messages_and_choices": items(trajectory.messages_and_choices),
            "tools": trajectory.tools,
            "additional_histories": [
                {"messages_and_choices": items(h.messages_and_choices), "tools": h.tools}
                for h in trajectory.additional_histories
            ],
        },
        default=str,
    )


async def arts_own_flow(drive: Callable[[Any], Any], streaming: bool) -> art.Trajectory:
    """What ART's `art.langgraph.wrap_rollout` returns for the same graph, driven the same way."""

    async def rollout() -> art.Trajectory:
        await drive(graph_of(art_chat_model(streaming)))
        return art.Trajectory(messages_and_choices=[], reward=0.0)

    async with LocalInferenceServer(deterministic) as server:
        wrapped = llm_wrapper.wrap_rollout(served_model(server), rollout)
        return await asyncio.create_task(wrapped())  # ART sets its context variable for good


# --- the tests --------------------------------------------------------------------------------


@pytest.mark.parametrize(("driver", "streaming"), CASES)
async def test_arts_chat_model_records_each_call_once_as_art_builds_it(
    store, tmp_path, monkeypatch, driver: str, streaming: bool
) -> None:
    monkeypatch.chdir(tmp_path)  # ART writes .art/langgraph/<thread> here
    async with LocalInferenceServer() as server:
        model = served_model(server)
        async with store.rollout(model) as rollout:
            thread = llm_wrapper.add_thread(  # a log path (0.5.18) or a logger (later)
                "tee", model.inference_base_url, model.inference_api_key, "test-model"
            )
            config = llm_wrapper.CURRENT_CONFIG.get()
            llm_wrapper.CURRENT_CONFIG.set(
                {**config, "logger": Tee(config["logger"], ArtLogger(rollout))}
            )
            await DRIVERS[driver](graph_of(art_chat_model(streaming)))

    await assert_each_call_recorded_once(store, server)
    assert len(server.requests) == 2  # the tool call, then the answer
    arts = llm_wrapper.create_messages_from_logs(thread, art.Trajectory(messages_and_choices=[]))
    assert histories(await store.trajectory(rollout.id)) == histories(arts)


@pytest.mark.parametrize(("driver", "streaming"), CASES)
async def test_artstores_chat_model_records_each_call_once_as_art_builds_it(
    store, tmp_path, monkeypatch, driver: str, streaming: bool
) -> None:
    monkeypatch.chdir(tmp_path)
    arts = await arts_own_flow(DRIVERS[driver], streaming)
    async with LocalInferenceServer(deterministic) as server:
        async with store.rollout(served_model(server)) as rollout:
            chat_model = init_chat_model(streaming=True) if streaming else init_chat_model()
            await DRIVERS[driver](graph_of(chat_model))

    await assert_each_call_recorded_once(store, server)
    assert len(server.requests) == 2
    ours = await store.trajectory(rollout.id)
    assert without_random_ids(histories(ours)) == without_random_ids(histories(arts))
