"""What the model received and returned is stored exactly, and no secret can be rebuilt from it.

Tool schemas keep their key order, a `-inf` logprob comes back as `-inf`, and an API key
the model spells over several tokens is gone from the text, the tokens and their bytes:
in blobs, in the database files themselves and in a JSONL export. Each through
artstore's LangChain chat model and through an OpenAI client (recorded from HTTP), on
SQLite and PostgreSQL. (Messages edited in place between calls: tests/capture/test_capture.py.)
"""

from __future__ import annotations

import json
import math
import secrets
from pathlib import Path
from typing import Any

import art
import openai
from art.langgraph.message_utils import convert_langgraph_messages
from art.openai import consume_chat_completion_stream
from capture_helpers import WEATHER_TOOL, served_model
from openai.types.chat.chat_completion import Choice
from sqlalchemy import text

from artstore.art_versions import trainable_model
from artstore.backends.check_only import CheckOnlyBackend
from artstore.events import RunStarted
from artstore.eventstore.blobs import blob_text
from artstore.exchange.jsonl import export_jsonl
from artstore.langgraph import init_chat_model
from artstore.redaction import REDACTED
from artstore.testing.inference_server import LocalInferenceServer, ScriptedReply, tokenize

TOOLS = [WEATHER_TOOL]


async def blob_documents(store: Any) -> list[Any]:
    """Every blob's document, read back through the blob layer (compact bodies expanded)."""
    async with store.database.read() as connection:
        rows = (await connection.execute(text("SELECT body, codec FROM blobs"))).all()
    return [json.loads(blob_text(row.body, row.codec)) for row in rows]


async def stored_bodies(store: Any) -> list[str]:
    """The `blobs.body` column as the database holds it."""
    async with store.database.read() as connection:
        return (await connection.execute(text("SELECT body FROM blobs"))).scalars().all()


def logprob_lists(value: Any) -> list[list[dict[str, Any]]]:
    """Every list of logprob entries inside a JSON document."""
    found = []
    if isinstance(value, dict):
        for key, item in value.items():
            entries = isinstance(item, list) and item and key in ("content", "refusal")
            if entries and all(isinstance(e, dict) and "logprob" in e for e in item):
                found.append(item)
                continue
            found += logprob_lists(item)
    elif isinstance(value, list):
        for item in value:
            found += logprob_lists(item)
    return found


# --- key order ---------------------------------------------------------------------------------


async def test_tool_schemas_keep_their_key_order(store) -> None:
    async with LocalInferenceServer() as server:
        client = openai.AsyncOpenAI(base_url=server.base_url, api_key=server.api_key)
        async with store.rollout(served_model(server)) as through_langchain:
            await init_chat_model().bind_tools(TOOLS).ainvoke("Weather in Oslo?")
        async with store.rollout(served_model(server)) as through_http:
            await client.chat.completions.create(
                model="test-model",
                messages=[{"role": "user", "content": "Weather in Oslo?"}],
                tools=TOOLS,
                logprobs=True,
            )
        received = server.requests

    assert json.dumps(received[0]["tools"]) == json.dumps(TOOLS)  # what the model was sent
    stored = [d for d in await blob_documents(store) if d == TOOLS]
    assert stored and all(json.dumps(d) == json.dumps(TOOLS) for d in stored)
    for rollout in (through_langchain, through_http):
        projected = await store.trajectory(rollout.id)
        parameters = projected.tools[0]["function"]["parameters"]
        assert list(parameters["properties"]) == ["zone", "city"]
        assert parameters["required"] == ["zone", "city"]
        (choice,) = [m for m in projected.messages_and_choices if isinstance(m, Choice)]
        arguments = json.loads(choice.message.tool_calls[0].function.arguments)
        assert list(arguments) == ["zone", "city"]  # as the model wrote them
    # The trajectory holds them as ART's own `create_messages_from_logs` puts them there
    # (ART's validation orders a tool's own keys as its TypedDict does; parameters are kept).
    arts = art.Trajectory(messages_and_choices=[])
    arts.tools = TOOLS  # type: ignore[assignment]
    langchain = await store.trajectory(through_langchain.id)
    assert json.dumps(langchain.tools) == json.dumps(arts.tools)


# --- messages as they were at each call -----------------------------------------------------


async def test_a_message_edited_in_place_is_recorded_as_each_call_sent_it(store) -> None:
    """An OpenAI client's request is recorded from its bytes: by value, at the call."""
    from artstore.projections.trajectories import StoredCalls

    async with LocalInferenceServer(lambda request, index: "Noted.") as server:
        client = openai.AsyncOpenAI(base_url=server.base_url, api_key=server.api_key)
        question = {"role": "user", "content": [{"type": "text", "text": "Weather in Oslo?"}]}
        messages: list[Any] = [question]
        async with store.rollout(served_model(server)) as rollout:
            await client.chat.completions.create(model="test-model", messages=messages)
            question["content"][0]["text"] = "Weather in Rome?"  # the same dict, edited
            await client.chat.completions.create(model="test-model", messages=messages)
    async with store.database.read() as connection:
        stored = (await connection.run_sync(StoredCalls.load, [rollout.id])).rollout(rollout.id)
    texts = [call.request["messages"][0]["content"][0]["text"] for call in stored.http]
    assert texts == ["Weather in Oslo?", "Weather in Rome?"]


# --- non-finite logprobs ------------------------------------------------------------------------


def with_minus_infinity(request: dict[str, Any], sample_index: int) -> ScriptedReply:
    """An answer whose second token has probability 0 (sent as JSON `-Infinity`)."""
    return ScriptedReply(content="Sunny all day", logprobs=[-0.25, float("-inf")])


async def test_a_minus_infinity_logprob_comes_back_as_minus_infinity(store) -> None:
    async with LocalInferenceServer(with_minus_infinity) as server:
        client = openai.AsyncOpenAI(base_url=server.base_url, api_key=server.api_key)
        async with store.rollout(served_model(server)) as through_langchain:
            answer = await init_chat_model().ainvoke("Weather in Oslo?")
        async with store.rollout(served_model(server)) as through_http:
            completion = await client.chat.completions.create(
                model="test-model",
                messages=[{"role": "user", "content": "Weather in Oslo?"}],
                logprobs=True,
            )
        async with store.rollout(served_model(server)) as streamed:
            stream = await client.chat.completions.create(
                model="test-model",
                messages=[{"role": "user", "content": "Weather in Oslo?"}],
                logprobs=True,
                stream=True,
            )
            streamed_completion = await consume_chat_completion_stream(stream)

    # What ART builds from the same answer (its LangGraph conversion), and what the agent got.
    arts = convert_langgraph_messages([*answer_input("Weather in Oslo?"), answer])
    expected = {
        through_langchain.id: arts,
        through_http.id: [{"role": "user", "content": "Weather in Oslo?"}, completion.choices[0]],
        streamed.id: [
            {"role": "user", "content": "Weather in Oslo?"},
            streamed_completion.choices[0],
        ],
    }
    for rollout_id, items in expected.items():
        projected = await store.trajectory(rollout_id)
        assert projected.messages_and_choices == items
        choice = projected.messages_and_choices[-1]
        logprobs = [entry.logprob for entry in choice.logprobs.content]
        assert logprobs[:2] == [-0.25, float("-inf")] and math.isinf(logprobs[1])


def answer_input(question: str) -> list[Any]:
    from langchain_core.messages import HumanMessage

    return [HumanMessage(question)]


# --- secrets spelled over tokens ----------------------------------------------------------------


async def test_a_key_spelled_over_tokens_is_gone_from_everything_stored(
    store, database_url, tmp_path
) -> None:
    key = "sk-local-" + secrets.token_hex(16)
    assert len([t for t in tokenize(f"Your key is {key}.") if t.strip()]) > 6  # spelled in pieces

    def repeat_the_key(request: dict[str, Any], sample_index: int) -> ScriptedReply:
        return ScriptedReply(content=f"Your key is {key}, keep it safe.")

    async with LocalInferenceServer(repeat_the_key, api_key=key) as server:
        model = trainable_model(name="agent", project="tests", base_model="Qwen/Qwen2.5-0.5B")
        await model.register(
            CheckOnlyBackend(
                path=tmp_path / ".art", inference_base_url=server.base_url, inference_api_key=key
            )
        )
        plain = openai.AsyncOpenAI(base_url=server.base_url, api_key=key)
        ask = {"messages": [{"role": "user", "content": "What is my key?"}], "logprobs": True}
        await store.append(
            "run-leak",
            [
                RunStarted(
                    run="leak",
                    project="tests",
                    model="agent",
                    config={},
                    scenarios=[],
                    scorer="s",
                    trainer="test",
                )
            ],
        )
        ids = []
        for way in ("langchain", "art", "http", "streamed"):
            async with store.rollout(model, run="leak") as rollout:
                if way == "langchain":
                    await init_chat_model().ainvoke("What is my key?")
                elif way == "art":  # tokens as `token_id:N`, with the server's token ids
                    await model.openai_client().chat.completions.create(model="agent", **ask)
                elif way == "http":
                    await plain.chat.completions.create(model="agent", **ask)
                else:
                    stream = await plain.chat.completions.create(model="agent", stream=True, **ask)
                    await consume_chat_completion_stream(stream)
            ids.append(rollout.id)

    # The blobs: the text is redacted, and so is what the tokens (and their bytes) spell.
    documents = await blob_documents(store)
    entries = [
        [entry for found in logprob_lists(d) for entry in found]  # a stream's, chunks joined
        if isinstance(d, dict) and "sse" in d
        else found
        for d in documents
        for found in ([None] if isinstance(d, dict) and "sse" in d else logprob_lists(d))
    ]
    assert len(entries) >= 4
    for found in entries:
        spelled = "".join(e["token"] for e in found)
        spelled_bytes = b"".join(bytes(e.get("bytes") or []) for e in found)
        assert key not in spelled and key.encode() not in spelled_bytes
        assert REDACTED.encode() in spelled_bytes
    assert key not in json.dumps(documents)
    assert not any(key in body for body in await stored_bodies(store))
    for document in documents:  # the server's token ids of the answer would spell it too
        for choice in (document.get("json") or {}).get("choices") or []:
            assert "token_ids" not in choice

    # The projected trajectories: tokens join to the redacted text, one per original token.
    for rollout_id in ids:
        trajectory = await store.trajectory(rollout_id)
        choice = trajectory.messages_and_choices[-1]
        assert choice.message.content == f"Your key is {REDACTED}, keep it safe."
        tokens = choice.logprobs.content
        assert b"".join(bytes(t.bytes or []) for t in tokens).decode() == choice.message.content
        assert len(tokens) == len(tokenize(f"Your key is {key}, keep it safe."))

    # The database itself, files included.
    raw = await database_bytes(store, database_url)
    assert len(raw) > 10_000 and ids[0].encode() in raw
    assert key.encode() not in raw

    # A JSONL export.
    out = tmp_path / "leak.jsonl"
    await export_jsonl(store, "leak", out)
    exported = out.read_text()
    assert ids[0] in exported and key not in exported
    for line in exported.splitlines():
        for found in logprob_lists(json.loads(line)):
            assert key not in "".join(e["token"] for e in found)
            assert key.encode() not in b"".join(bytes(e.get("bytes") or []) for e in found)


async def database_bytes(store: Any, database_url: str) -> bytes:
    """The bytes of the database's files: SQLite's (with its WAL), PostgreSQL's relations."""
    await store.flush()
    if database_url.startswith("sqlite"):
        path = Path(database_url.removeprefix("sqlite:///"))
        return b"".join(p.read_bytes() for p in path.parent.glob(path.name + "*"))
    async with store.database.write() as connection:
        await connection.execute(text("CHECKPOINT"))
    async with store.database.read() as connection:
        paths = (
            (
                await connection.execute(
                    text(
                        "SELECT pg_relation_filepath(oid) FROM pg_class "
                        "WHERE relkind IN ('r', 't', 'i', 'm') AND pg_relation_filepath(oid) "
                        "IS NOT NULL AND relnamespace IN (SELECT oid FROM pg_namespace "
                        "WHERE nspname NOT IN ('pg_catalog', 'information_schema'))"
                    )
                )
            )
            .scalars()
            .all()
        )
        chunks = []
        for path in paths:
            size = (
                await connection.execute(text("SELECT (pg_stat_file(:p, true)).size"), {"p": path})
            ).scalar()
            if size:
                chunks.append(
                    (
                        await connection.execute(
                            text("SELECT pg_read_binary_file(:p)"), {"p": path}
                        )
                    ).scalar()
                )
    return b"".join(chunks)
