"""How many statements a checkpoint costs, on both databases: on PostgreSQL a `put` or
`put_writes` to a thread this process wrote before is one statement that commits by itself
(its new blobs and its projection rows in it), appends that commit together included, and
the tables it leaves equal a rebuild of the projections from the log; a `get` of a chunk
read or written before reads no blob again, and on PostgreSQL is one round trip, on a
connection the pool does not ping first, even after the server dropped it."""

from __future__ import annotations

import asyncio
import importlib

import pytest
from checkpoint_tables import checkpoint_tables
from langchain_core.messages import HumanMessage
from langgraph.checkpoint.base import empty_checkpoint
from sqlalchemy import event, text

import artstore
from artstore.eventstore import blobs
from artstore.langgraph import checkpointer

# The module (the package's `checkpointer` is the function).
saver_module = importlib.import_module("artstore.langgraph.checkpointer")


def conversation(length: int) -> list[HumanMessage]:
    """Messages that compress little: a full chunk of them is kept in a blob."""
    return [
        HumanMessage(" ".join(str(n * k * 7919 % 100_003) for k in range(80)), id=str(n))
        for n in range(length)
    ]


def checkpoint_of(messages: list, number: int) -> dict:
    checkpoint = empty_checkpoint()
    checkpoint["id"] = f"1ef0000{number:04d}"
    checkpoint["channel_values"] = {"messages": messages, "step": number}
    checkpoint["channel_versions"] = {"messages": number, "step": number}
    return checkpoint


async def put(saver, thread: str, number: int, messages: list) -> dict:
    config = {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}
    versions = {"messages": number, "step": number}
    return await saver.aput(config, checkpoint_of(messages, number), {"step": number}, versions)


async def test_a_put_to_a_known_thread_is_one_statement_and_equals_a_rebuild(store):
    saver = checkpointer(store)
    messages = conversation(40)
    configs = {thread: await put(saver, thread, 1, messages[:20]) for thread in ("a", "b")}
    before = store.single_statement_transactions

    # Together: two threads, the same checkpoint twice, the same write twice (one batch
    # when the writer is busy, each key written once by the statement).
    await asyncio.gather(
        put(saver, "a", 2, messages[:30]),
        put(saver, "a", 2, messages[:30]),
        put(saver, "b", 2, messages),
        saver.aput_writes(configs["a"], [("messages", [messages[0]]), ("step", 2)], "task"),
        saver.aput_writes(configs["a"], [("messages", [messages[1]])], "task"),
        saver.aput_writes(configs["b"], [("__error__", "boom")], "task"),
        saver.aput_writes(configs["b"], [("__error__", "again")], "task"),
    )
    if store.dialect == "postgresql":
        assert store.single_statement_transactions > before
    else:  # SQLite writes its projections in the writer's transaction
        assert store.single_statement_transactions == before

    found = await saver.aget_tuple({"configurable": {"thread_id": "b", "checkpoint_ns": ""}})
    assert found.checkpoint["channel_values"]["messages"] == messages
    assert found.pending_writes == []  # the writes named checkpoint 1
    first = await saver.aget_tuple(configs["a"])
    assert first.pending_writes == [
        ("task", "messages", [messages[0]]),
        ("task", "step", 2),
    ]  # the first write of (task, index) stays
    errors = await saver.aget_tuple(configs["b"])
    assert errors.pending_writes == [("task", "__error__", "again")]  # replaced

    written = await checkpoint_tables(store)
    await store.rebuild_projections()
    assert await checkpoint_tables(store) == written


async def test_a_get_reads_no_blob_it_has_read_or_written(store, monkeypatch):
    saver = checkpointer(store)
    messages = conversation(48)
    config = await put(saver, "t", 1, messages)
    read_blobs: list[list[str]] = []

    def read_blob_texts(connection, hashes):
        read_blobs.append(list(hashes))
        return blobs.read_blob_texts(connection, hashes)

    monkeypatch.setattr(saver_module, "read_blob_texts", read_blob_texts)
    for _ in range(2):
        found = await saver.aget_tuple(config)
        assert found.checkpoint["channel_values"]["messages"] == messages
    assert read_blobs == []
    fresh = checkpointer(store)  # knows no blob: reads them once
    for _ in range(2):
        found = await fresh.aget_tuple(config)
        assert found.checkpoint["channel_values"]["messages"] == messages
    assert len(read_blobs) == 1 and len(read_blobs[0]) == 3


async def test_a_get_on_postgresql_is_one_round_trip_and_outlives_dropped_connections(
    postgres_url,
):
    async with await artstore.open_store(postgres_url) as store:
        saver = checkpointer(store)
        config = await put(saver, "t", 1, conversation(40))
        await saver.aget_tuple(config)  # its blobs read, a connection kept for lookups
        engine = store.database.read_engine
        sent: list[str] = []
        pings = []
        ping = engine.dialect.do_ping
        event.listen(engine.sync_engine, "before_cursor_execute", lambda *a: sent.append(a[2]))
        engine.dialect.do_ping = lambda connection: pings.append(1) or ping(connection)
        for _ in range(3):
            assert (await saver.aget_tuple(config)).checkpoint["id"] == config["configurable"][
                "checkpoint_id"
            ]
        assert (len(sent), pings) == (3, [])

        def backend(connection):
            return connection.execute(text("SELECT pg_backend_pid()")).scalar()

        kept = await store.database.run_lookup(backend)
        async with store.database.read() as other:
            await other.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": kept})
        found = await saver.aget_tuple(config)  # the kept connection fails; run again
        assert found.checkpoint["channel_values"]["messages"] == conversation(40)
        assert await store.database.run_lookup(backend) != kept

        def failing(connection):
            raise RuntimeError("not the database's")

        with pytest.raises(RuntimeError):  # the kept connection dropped, the next one works
            await store.database.run_lookup(failing)
        assert (await saver.aget_tuple(config)) is not None
