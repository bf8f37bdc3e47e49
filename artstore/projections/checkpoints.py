"""The tables of LangGraph's checkpoints: where each checkpoint, channel value and pending
write of a thread is in the event log (`artstore.langgraph.checkpointer` reads them).

A row holds the position of the event that holds the value, not the value: the log keeps
each value once. `langgraph.thread_deleted` removes the thread's rows; the events stay.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sqlalchemy import delete
from sqlalchemy.engine import Connection

from artstore.events import LangGraphCheckpoint, LangGraphThreadDeleted, LangGraphWrites
from artstore.eventstore.blobs import canonical_json
from artstore.eventstore.database import recorder_of
from artstore.eventstore.records import RecordedEvent
from artstore.schema import tables as t

CHECKPOINT_HANDLERS: dict[str, Callable[[Connection, Any, RecordedEvent], None]] = {}


def version_key(version: Any) -> str:
    """A channel version as the tables key it: its JSON text (1 and "1" are two versions)."""
    return canonical_json(version)


def _upsert(connection: Connection, table: Any, keys: list[str], rows: list[dict]) -> None:
    statement = recorder_of(connection).insert(table)
    connection.execute(
        statement.on_conflict_do_update(
            index_elements=keys, set_={"position": statement.excluded.position}
        ),
        rows,
    )


def _checkpoint(c: Connection, e: LangGraphCheckpoint, r: RecordedEvent) -> None:
    thread = {"thread_id": e.thread_id, "checkpoint_ns": e.checkpoint_ns}
    _upsert(
        c,
        t.langgraph_checkpoints,
        ["thread_id", "checkpoint_ns", "checkpoint_id"],
        [
            {
                **thread,
                "checkpoint_id": e.checkpoint_id,
                "parent_checkpoint_id": e.parent_checkpoint_id,
                "position": r.position,
            }
        ],
    )
    if e.versions:
        rows = [
            {**thread, "channel": channel, "version": version_key(v), "position": r.position}
            for channel, v in e.versions.items()
        ]
        keys = ["thread_id", "checkpoint_ns", "channel", "version"]
        _upsert(c, t.langgraph_channel_values, keys, rows)


def _writes(c: Connection, e: LangGraphWrites, r: RecordedEvent) -> None:
    rows = [
        {
            "thread_id": e.thread_id,
            "checkpoint_ns": e.checkpoint_ns,
            "checkpoint_id": e.checkpoint_id,
            "task_id": e.task_id,
            "idx": write[0],
            "position": r.position,
        }
        for write in e.writes
    ]
    keys = ["thread_id", "checkpoint_ns", "checkpoint_id", "task_id", "idx"]
    # A regular write is stored once per (task, index): the first one stays, as in
    # LangGraph's own savers; a special one (error, interrupt: negative) is replaced.
    kept = [row for row in rows if row["idx"] >= 0]
    replaced = [row for row in rows if row["idx"] < 0]
    if kept:
        statement = recorder_of(c).insert(t.langgraph_writes)
        c.execute(statement.on_conflict_do_nothing(index_elements=keys), kept)
    if replaced:
        _upsert(c, t.langgraph_writes, keys, replaced)


def _thread_deleted(c: Connection, e: LangGraphThreadDeleted, r: RecordedEvent) -> None:
    for table in (t.langgraph_writes, t.langgraph_channel_values, t.langgraph_checkpoints):
        c.execute(delete(table).where(table.c.thread_id == e.thread_id))


CHECKPOINT_HANDLERS[LangGraphCheckpoint.type] = _checkpoint
CHECKPOINT_HANDLERS[LangGraphWrites.type] = _writes
CHECKPOINT_HANDLERS[LangGraphThreadDeleted.type] = _thread_deleted
