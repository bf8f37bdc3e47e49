"""The projection's message rows, read from stored documents, are LangChain's own.

`trajectory_messages` rows of a recorded LangChain call are made from the stored message
documents where LangChain would read them back unchanged (`StoredMessage.plain`), without
building LangChain message objects. These tests hold that path to the one through
LangChain's objects: message by message (random documents with a fixed seed, and the odd
ones that must go through LangChain), through ART's merging rule (two documents of one
message under different hashes), and for whole recorded runs on SQLite and PostgreSQL.
"""

from __future__ import annotations

import random
from typing import Any

import pydantic_core
from langchain_core.messages import (
    AIMessage,
    AIMessageChunk,
    BaseMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)
from recorded_run import record_run
from sqlalchemy import select

from artstore.documents import messages as lc
from artstore.eventstore.blobs import blob_hash, blob_json
from artstore.projections.trajectories import (
    Call,
    StoredCalls,
    StoredMessage,
    merge_conversations,
    message_rows,
)
from artstore.schema import tables as t

SEED = 20261202
TEXTS = ["", "42", "héllo wörld", "tab\tand\nnewline", "nul \x00 inside", "🙂 emoji", "\\"]


def document(message: BaseMessage) -> dict[str, Any]:
    """The stored document of a message, as the projection reads it."""
    return pydantic_core.from_json(lc.dump_message(message))


def random_message(rng: random.Random) -> BaseMessage:
    kind = rng.choice(["human", "system", "ai", "ai", "tool"])
    content = rng.choice(TEXTS) * rng.randint(1, 3)
    named = {"name": rng.choice([None, "someone"]), "id": rng.choice([None, "run-1"])}
    if kind == "human":
        return HumanMessage(content, **named)
    if kind == "system":
        return SystemMessage(content, additional_kwargs=rng.choice([{}, {"k": [1]}]))
    if kind == "tool":
        return ToolMessage(
            content,
            tool_call_id=f"call-{rng.randint(0, 99)}",
            status=rng.choice(["success", "error"]),
            artifact=rng.choice([None, {"rows": [1, 2]}]),
            **named,
        )
    tool_calls = [
        {
            "name": rng.choice(["search", "calculator"]),
            "args": {"q": rng.choice(TEXTS), "n": rng.randint(-5, 5), "z": [1.5, None]},
            "id": rng.choice([f"call-{rng.randint(0, 99)}", None]),
            "type": "tool_call",
        }
        for _ in range(rng.choice([0, 0, 1, 2]))
    ]
    metadata: dict[str, Any] = {"finish_reason": "stop"}
    if rng.random() < 0.7:
        metadata["logprobs"] = {
            "content": [
                {"token": "a", "logprob": rng.choice([-0.5, float("-inf")]), "bytes": [97]}
                for _ in range(rng.randint(0, 12))
            ]
        }
    elif rng.random() < 0.5:
        metadata["logprobs"] = None
    usage = rng.choice([None, {"input_tokens": 3, "output_tokens": 2, "total_tokens": 5}])
    return AIMessage(
        content, tool_calls=tool_calls, response_metadata=metadata, usage_metadata=usage, **named
    )


def row_through_langchain(doc: dict[str, Any]) -> dict[str, Any]:
    (row,) = message_rows("r", [_conversation([lc.from_json([doc])[0]])])
    return row


def row_from_document(doc: dict[str, Any]) -> dict[str, Any]:
    (row,) = message_rows("r", [_conversation([StoredMessage(doc)])])
    return row


def _conversation(messages: list[Any]):
    from artstore.projections.trajectories import Conversation

    return Conversation(messages, None)


def test_a_plain_document_gives_the_row_its_langchain_message_gives():
    rng = random.Random(SEED)
    documents = [document(random_message(rng)) for _ in range(600)]
    assert all(StoredMessage.plain(doc) for doc in documents)
    for doc in documents:
        assert row_from_document(doc) == row_through_langchain(doc), doc
    rows = [row_from_document(doc) for doc in documents]
    assert {row["role"] for row in rows} == {"user", "system", "assistant", "tool"}
    assert any(row["tool_calls"] for row in rows) and any(row["trainable"] for row in rows)


def test_documents_langchain_would_change_go_through_langchain():
    """Each of these reads back as another message than its document says, or could."""
    ai = document(AIMessage("x", tool_calls=[{"name": "f", "args": {}, "id": "1"}]))
    only_in_kwargs = document(
        AIMessage(
            "",
            additional_kwargs={
                "tool_calls": [
                    {"id": "1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
                ]
            },
        )
    )
    only_in_kwargs["data"]["tool_calls"] = []  # as a document written by hand might hold
    not_plain = [
        document(AIMessageChunk("x")),  # a chunk: another class
        document(HumanMessage([{"type": "text", "text": "x"}])),  # content blocks
        {"type": "human", "data": {"content": "x", "tool_calls": []}},  # a field it lacks
        {"type": "tool", "data": {"content": "x", "tool_call_id": 7}},  # coerced to text
        {"type": "ai", "data": {**ai["data"], "tool_calls": [{"name": "f", "args": {}}]}},
        {"type": "ai", "data": {**ai["data"], "response_metadata": None}},
        only_in_kwargs,  # LangChain parses its tool calls from additional_kwargs
        {"type": "chat", "data": {"content": "x", "role": "critic"}},
        # Fields LangChain refuses or coerces (a message changed after it was made, say):
        {"type": "human", "data": {"content": "x", "name": 5}},
        {"type": "human", "data": {"content": "x", "id": {"a": 1}}},
        {"type": "system", "data": {"content": "x", "additional_kwargs": None}},
        {"type": "ai", "data": {**ai["data"], "invalid_tool_calls": None}},
        {"type": "ai", "data": {**ai["data"], "usage_metadata": {"x": 1}}},
        {"type": "tool", "data": {"content": "x", "tool_call_id": "1", "status": "weird"}},
    ]
    assert StoredMessage.plain(ai)
    assert [StoredMessage.plain(doc) for doc in not_plain] == [False] * len(not_plain)
    # What LangChain makes of the last-but-one: tool calls the document does not list.
    assert row_through_langchain(only_in_kwargs)["tool_calls"] == [
        {"id": "1", "name": "f", "args": {}}
    ]


def _calls(documents: list[list[dict[str, Any]]], stored: bool) -> list[Call]:
    """Calls whose last document is the output, the rest the input, hashed by their text."""
    calls = []
    for index, docs in enumerate(documents):
        hashes = [blob_hash(blob_json(doc)) for doc in docs]
        messages = [StoredMessage(d) if stored else lc.from_json([d])[0] for d in docs]
        calls.append(Call(messages[:-1], messages[-1], None, hashes[:-1], hashes[-1], index))
    return calls


def test_the_merge_compares_messages_by_value_where_their_hashes_differ():
    system, question = document(SystemMessage("be brief")), document(HumanMessage("2+2?"))
    asked = document(AIMessage("", tool_calls=[{"name": "calc", "args": {"e": "2+2"}, "id": "1"}]))
    result = document(ToolMessage("4", tool_call_id="1"))
    answer = document(AIMessage("4"))
    # The same system message written without its default fields (as a document written
    # by another tool might be): another text, another hash, another dict, the same
    # message. The merge must still see the second call continue the first.
    shorter = {"type": "system", "data": {"content": "be brief"}}
    assert shorter != system and lc.from_json([shorter])[0] == lc.from_json([system])[0]
    assert StoredMessage.plain(shorter)
    other = document(HumanMessage("3+3?"))
    run = [
        [system, question, asked],
        [shorter, question, asked, result, answer],
        [system, other, answer],  # another conversation
    ]
    through_langchain = merge_conversations(_calls(run, stored=False))
    from_documents = merge_conversations(_calls(run, stored=True))
    assert len(through_langchain) == len(from_documents) == 2
    assert message_rows("r", from_documents) == message_rows("r", through_langchain)


async def test_a_recorded_run_projects_the_rows_langchains_messages_give(store):
    await record_run(store)
    async with store.database.read() as connection:
        table = t.trajectory_messages
        projected = (
            await connection.execute(select(table).order_by(*table.primary_key))
        ).mappings()
        projected_rows = [dict(row) for row in projected]
        rollout_ids = sorted({row["rollout_id"] for row in projected_rows})
        stored = await connection.run_sync(StoredCalls.load, rollout_ids)
    expected = []
    for rollout_id in rollout_ids:
        conversations = stored.rollout(rollout_id).conversations()  # LangChain's messages
        assert all(isinstance(m, BaseMessage) for c in conversations for m in c.messages), (
            "the reference must be built from LangChain's messages"
        )
        expected += message_rows(rollout_id, conversations)
    assert len(projected_rows) == len(expected) > 10
    columns = expected[0].keys()
    assert [{k: row[k] for k in columns} for row in projected_rows] == expected
