"""ART's own capture (ART >= 0.5.20): a rollout captured by `art.trajectory` is stored whole.

An agent of the new ART runs inside `art.trajectory(...)` (or `with art.Trajectory():`),
and ART's hooks on httpx capture each call's raw request and response into
`Trajectory.exchanges`. Run inside `store.rollout(...)`, the same agent is recorded with
no change, once per call, and `store.trajectory(id).exchanges` equals ART's, rebuilt by
ART's own `build_exchange`. The CPU backend trains such trajectories as ART's trainer
does: on the token ids the inference server returned.

ART 0.5.18 has no `Trajectory.exchanges`: the whole module is left out there.
"""

from __future__ import annotations

import asyncio
import secrets
from typing import Any

import art
import openai
import pytest
from art.openai import consume_chat_completion_stream
from capture_helpers import WEATHER_TOOL, served_model, served_trainable_model
from sqlalchemy import select

from artstore.art_versions import has_exchanges
from artstore.backends.check_only import TrajectoryCheckError
from artstore.schema import tables as t
from artstore.testing.inference_server import LocalInferenceServer

if not has_exchanges():
    pytest.skip("ART < 0.5.20 has no Trajectory.exchanges", allow_module_level=True)

TOOLS = [WEATHER_TOOL]


async def agent(client: Any, model: Any, question: str, *, stream: bool = False) -> str:
    """An agent of the new ART: it just calls its model; ART captures the calls."""
    messages: list[Any] = [{"role": "user", "content": question}]
    while True:
        options = {"model": model.get_inference_name(), "messages": messages, "tools": TOOLS}
        if stream:
            response = await client.chat.completions.create(
                stream=True, stream_options={"include_usage": True}, logprobs=True, **options
            )
            completion = await consume_chat_completion_stream(response)
        else:
            completion = await client.chat.completions.create(logprobs=True, **options)
        message = completion.choices[0].message
        if not message.tool_calls:
            return message.content or ""
        messages.append(
            {
                "role": "assistant",
                "content": message.content or "",
                "tool_calls": [call.model_dump(mode="json") for call in message.tool_calls],
            }
        )
        for call in message.tool_calls:
            messages.append({"role": "tool", "tool_call_id": call.id, "content": "sunny"})


async def rows(store: Any, query: Any) -> list[Any]:
    async with store.database.read() as connection:
        return list((await connection.execute(query)).all())


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("kind", ["art", "async"])
async def test_a_rollout_captured_by_art_keeps_arts_exchanges(store, tmp_path, kind, stream):
    async with LocalInferenceServer() as server:
        model, _ = await served_trainable_model(server, tmp_path)
        client = (
            model.openai_client()
            if kind == "art"
            else openai.AsyncOpenAI(base_url=server.base_url, api_key=server.api_key)
        )
        async with store.rollout(model, scenario={"city": "Oslo"}) as rollout:
            captured = await art.trajectory(agent(client, model, "Oslo?", stream=stream))

    assert len(captured.exchanges.chat_completions) == 2
    projected = await store.trajectory(rollout.id)
    assert projected.exchanges == captured.exchanges  # requests, responses, times
    assert projected.exchanges.chat_completions[0].request == (
        captured.exchanges.chat_completions[0].request
    )
    assert projected.messages_and_choices == [] and projected.additional_histories == []
    assert projected.tools is None
    calls = await rows(store, select(t.llm_calls).order_by(t.llm_calls.c.call_index))
    assert [(c.source, c.art_exchange, c.streamed) for c in calls] == [("http", True, stream)] * 2
    events = [e for e in await store.read_stream(rollout.stream_id) if e.type == "llm.call"]
    assert len(events) == 2  # ART's capture and artstore's: one record per call


async def test_calls_outside_arts_capture_are_recorded_but_not_exchanges(store, tmp_path):
    async with LocalInferenceServer() as server:
        model, _ = await served_trainable_model(server, tmp_path)
        client = model.openai_client()
        async with store.rollout(model) as rollout:
            await agent(client, model, "Warm-up?")  # before ART captures anything
            with art.Trajectory() as captured:
                await agent(client, model, "Oslo?")
            with art.trajectories.no_capture():
                pass
    projected = await store.trajectory(rollout.id)
    assert projected.exchanges == captured.exchanges
    calls = await rows(store, select(t.llm_calls).order_by(t.llm_calls.c.call_index))
    assert [c.art_exchange for c in calls] == [False, False, True, True]


async def test_concurrent_captured_rollouts_never_mix(store, tmp_path):
    async with LocalInferenceServer() as server:
        model, _ = await served_trainable_model(server, tmp_path)
        client = model.openai_client()

        async def one(index: int) -> tuple[str, art.Trajectory]:
            async with store.rollout(model) as rollout:
                captured = await art.trajectory(
                    agent(client, model, f"City {index}?", stream=bool(index % 2))
                )
            return rollout.id, captured

        done = await asyncio.gather(*(one(i) for i in range(12)))
    projected = await store.trajectories([rollout_id for rollout_id, _ in done])
    for rollout_id, captured in done:
        assert projected[rollout_id].exchanges == captured.exchanges


@pytest.mark.parametrize("streaming", [False, True])
async def test_langchain_calls_inside_arts_capture_are_one_row_and_arts_exchanges(
    store, streaming: bool
):
    from artstore.langgraph import init_chat_model

    async with LocalInferenceServer() as server:
        model = served_model(server)
        async with store.rollout(model) as rollout:

            async def ask() -> None:
                chat_model = init_chat_model(streaming=True) if streaming else init_chat_model()
                await chat_model.ainvoke("Weather in Oslo?")

            captured = await art.trajectory(ask())
    assert (await store.trajectory(rollout.id)).exchanges == captured.exchanges
    (call,) = await rows(store, select(t.llm_calls))
    assert call.source == "langchain"  # the LangChain record, superseding the HTTP one
    assert call.streamed == streaming


async def test_a_failed_langchain_call_inside_arts_capture_is_one_row(store):
    """ART keeps no exchange of a failed call; artstore's chat model records it, once."""
    from artstore.langgraph import init_chat_model

    async with LocalInferenceServer(fail_when=lambda request: True) as server:
        model = served_model(server)
        with pytest.raises(openai.InternalServerError):
            async with store.rollout(model):
                await art.trajectory(init_chat_model(max_retries=0).ainvoke("Weather in Oslo?"))
    (call,) = await rows(store, select(t.llm_calls))
    assert call.source == "langchain" and "Injected failure" in call.error_message
    assert len(server.requests) == 1


# --- training exchange trajectories ------------------------------------------------------------


async def captured_group(store, server, model, client, size: int) -> art.TrajectoryGroup:
    ids = []
    for _ in range(size):
        async with store.rollout(model) as rollout:
            await art.trajectory(agent(client, model, "Oslo?"))
        ids.append(rollout.id)
    projected = await store.trajectories(ids)
    return art.TrajectoryGroup(
        [
            projected[rollout_id].model_copy(update={"reward": float(index)})
            for index, rollout_id in enumerate(ids)
        ]
    )


async def test_the_cpu_backend_trains_exchange_trajectories_as_art_does(store, tmp_path):
    async with LocalInferenceServer() as server:
        model, backend = await served_trainable_model(server, tmp_path)
        group = await captured_group(store, server, model, model.openai_client(), 3)
        result = await backend.train(model, [group])
        assert result.step == 1
        assert backend.last_metrics["num_trainable_tokens"] > 0
        assert backend.last_advantages[0][0] < 0 < backend.last_advantages[0][2]

        # Without the server's token ids (a plain client asks for none), ART cannot train.
        plain = openai.AsyncOpenAI(base_url=server.base_url, api_key=server.api_key)
        untokenized = await captured_group(store, server, model, plain, 2)
        with pytest.raises(TrajectoryCheckError, match="exact inference-provided token ids"):
            await backend.train(model, [untokenized])

        # A trajectory holding exchanges and legacy histories is refused, as ART refuses it
        # (one gets there only by changing a list in place: ART validates the rest).
        mixed = art.TrajectoryGroup([t.model_copy(deep=True) for t in group.trajectories])
        mixed.trajectories[0].messages_and_choices.append({"role": "user", "content": "hi"})
        with pytest.raises(TrajectoryCheckError, match="both captured exchanges and legacy"):
            await backend.train(model, [mixed])


async def test_the_prompt_token_ids_of_a_prompt_holding_a_key_are_dropped(store, tmp_path):
    key = "sk-local-" + secrets.token_hex(16)
    async with LocalInferenceServer(lambda request, index: "Noted.", api_key=key) as server:
        model, _ = await served_trainable_model(server, tmp_path)
        async with store.rollout(model) as rollout:
            captured = await art.trajectory(
                model.openai_client().chat.completions.create(
                    model="agent",
                    messages=[{"role": "user", "content": f"My key is {key}. Remember it."}],
                )
            )
    assert "prompt_token_ids" in (captured.exchanges.chat_completions[0].response.model_extra)
    projected = await store.trajectory(rollout.id)
    (exchange,) = projected.exchanges.chat_completions
    assert "prompt_token_ids" not in (exchange.response.model_extra or {})
    assert "[REDACTED]" in exchange.request["messages"][0]["content"]
    assert exchange.response.choices[0].model_extra.get("token_ids")  # the answer held no key


class Died(Exception):
    """Stands for the process dying inside the rollout."""


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
async def test_a_resumed_rollout_gives_arts_capture_the_answers_it_serves(store, tmp_path, stream):
    """Calls served back from the record go through ART's hooks as sent ones do: the
    resumed rollout's `Trajectory.exchanges` holds them, so ART trains it whole."""
    async with LocalInferenceServer() as server:
        model, _ = await served_trainable_model(server, tmp_path)
        client = model.openai_client()
        with pytest.raises(Died):
            async with store.rollout(model, scenario={"city": "Oslo"}) as first:
                with art.Trajectory() as before:
                    await agent(client, model, "Oslo?", stream=stream)
                raise Died
        received = len(server.requests)
        async with store.rollout(model, scenario={"city": "Oslo"}, resumes=first.id) as again:
            captured = await art.trajectory(agent(client, model, "Oslo?", stream=stream))
        assert len(server.requests) == received  # every answer served from the record

    served, original = captured.exchanges.chat_completions, before.exchanges.chat_completions
    assert len(served) == len(original) == 2
    assert [e.request for e in served] == [e.request for e in original]
    assert [e.response for e in served] == [e.response for e in original]
    projected = (await store.trajectory(again.id)).exchanges.chat_completions
    # As ART took them, but timed by the serve (the times ART measured are not recorded).
    assert [(e.request, e.response) for e in projected] == [(e.request, e.response) for e in served]
    calls = [e.data for e in await store.read_stream(again.stream_id) if e.type == "llm.call"]
    assert [(bool(c["replayed_from"]), c["art_exchange"]) for c in calls] == [(True, True)] * 2
