"""The tables of LangGraph's checkpoints: where each checkpoint, channel value and pending
write of a thread is in the event log (`artstore.langgraph.checkpointer` reads them).

A row holds the position of the event that holds the value, not the value: the log keeps
each value once. `langgraph.thread_deleted` removes the thread's rows; the events stay.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable
from typing import Any

from sqlalchemy import delete
from sqlalchemy.engine import Connection

from artstore.events import (
    LangGraphCheckpoint,
    LangGraphThreadDeleted,
    LangGraphWrites,
    decode_event,
)
from artstore.eventstore.blobs import canonical_json, load_payload
from artstore.eventstore.database import recorder_of
from artstore.eventstore.records import RecordedEvent, StatementRows
from artstore.names import unstorable_character
from artstore.schema import tables as t

CHECKPOINT_HANDLERS: dict[str, Callable[[Connection, Any, RecordedEvent], None]] = {}


def version_key(version: Any) -> str:
    """A channel version as the tables key it: its JSON text (1 and "1" are two versions)."""
    return canonical_json(version)


def _upsert(connection: Connection, table: Any, keys: tuple[str, ...], rows: list[dict]) -> None:
    connection.execute(_insert(recorder_of(connection), table, keys, True), rows)


@functools.cache
def _insert(recorder: Any, table: Any, keys: tuple[str, ...], replace: bool) -> Any:
    """The INSERT of `table`'s rows that replaces the position of a row of the same `keys`
    (`replace`) or keeps that row. Built once: building it cost ~0.1 ms, and a put on SQLite
    runs two, a fifth of its CPU (a statement is immutable: one serves every call)."""
    statement = recorder.insert(table)
    if not replace:
        return statement.on_conflict_do_nothing(index_elements=list(keys))
    return statement.on_conflict_do_update(
        index_elements=list(keys), set_={"position": statement.excluded.position}
    )


def _checkpoint_rows(e: LangGraphCheckpoint) -> tuple[list[dict], list[dict]]:
    """The rows of a checkpoint (one) and of the channel values it wrote, without position."""
    thread = {"thread_id": e.thread_id, "checkpoint_ns": e.checkpoint_ns}
    checkpoint = {
        **thread,
        "checkpoint_id": e.checkpoint_id,
        "parent_checkpoint_id": e.parent_checkpoint_id,
    }
    values = [
        {**thread, "channel": channel, "version": version_key(v)}
        for channel, v in e.versions.items()
    ]
    return [checkpoint], values


def _writes_rows(e: LangGraphWrites) -> tuple[list[dict], list[dict]]:
    """The rows of the writes: a regular one (index >= 0) is stored once per (task,
    index), the first one staying, as in LangGraph's own savers; a special one (error,
    interrupt: negative) is replaced."""
    rows = [
        {
            "thread_id": e.thread_id,
            "checkpoint_ns": e.checkpoint_ns,
            "checkpoint_id": e.checkpoint_id,
            "task_id": e.task_id,
            "idx": write[0],
        }
        for write in e.writes
    ]
    return [row for row in rows if row["idx"] >= 0], [row for row in rows if row["idx"] < 0]


def _checkpoint(c: Connection, e: LangGraphCheckpoint, r: RecordedEvent) -> None:
    checkpoint, values = _checkpoint_rows(e)
    _upsert(c, t.langgraph_checkpoints, _CHECKPOINT_KEYS, _at(checkpoint, r.position))
    if values:
        _upsert(c, t.langgraph_channel_values, _VALUE_KEYS, _at(values, r.position))


def _writes(c: Connection, e: LangGraphWrites, r: RecordedEvent) -> None:
    kept, replaced = _writes_rows(e)
    if kept:
        statement = _insert(recorder_of(c), t.langgraph_writes, _WRITE_KEYS, False)
        c.execute(statement, _at(kept, r.position))
    if replaced:
        _upsert(c, t.langgraph_writes, _WRITE_KEYS, _at(replaced, r.position))


def _at(rows: list[dict], position: int) -> list[dict]:
    return [{**row, "position": position} for row in rows]


_CHECKPOINT_KEYS = ("thread_id", "checkpoint_ns", "checkpoint_id")
_VALUE_KEYS = ("thread_id", "checkpoint_ns", "channel", "version")
_WRITE_KEYS = ("thread_id", "checkpoint_ns", "checkpoint_id", "task_id", "idx")


def thread_stream(thread_id: str) -> str:
    """The stream of a LangGraph thread: `langgraph-<thread id>`, or for an id a stream id
    cannot hold (over 200 characters, NUL, a lone surrogate) `langgraph-sha256-<its
    hash>`; the events name the thread itself either way."""
    if len(thread_id) <= 200 and unstorable_character(thread_id) is None:
        return f"langgraph-{thread_id}"
    digest = hashlib.sha256(thread_id.encode("utf-8", "surrogatepass")).hexdigest()
    return f"langgraph-sha256-{digest}"


def checkpoints_in_statement(rows: list[dict[str, Any]]) -> list[StatementRows] | None:
    """The projection of a batch's projected rows when they are checkpoints and writes,
    as rows the statement that inserts the events writes (`StatementRows`); None where an
    event of another type is among them, or one outside its thread's stream.

    They need no order across appends: every row is keyed by its thread, and a thread's
    events are in one stream, whose (stream, version) key makes two appends to it wait
    for each other; appends to two threads touch no row in common. An event in another
    stream (appended by hand) could race its thread's own: it takes the projector."""
    found: dict[tuple[str, bool], list[dict]] = {}
    for row in rows:
        kind = row["type"]
        if kind not in _IN_STATEMENT_TYPES:
            return None  # a thread deleted (its rows go), or any other projected type
        e = decode_event(kind, load_payload(row["data"]), row["event_id"])
        if row["stream_id"] != thread_stream(e.thread_id):  # type: ignore[attr-defined]
            return None
        if isinstance(e, LangGraphCheckpoint):
            checkpoint, values = _checkpoint_rows(e)
            parts = [
                ("langgraph_checkpoints", True, checkpoint),
                ("langgraph_channel_values", True, values),
            ]
        else:
            kept, replaced = _writes_rows(e)  # type: ignore[arg-type]
            parts = [("langgraph_writes", False, kept), ("langgraph_writes", True, replaced)]
        for table, replace, part in parts:
            found.setdefault((table, replace), []).extend(
                {**r, "event_id": row["event_id"]} for r in part
            )
    return [
        StatementRows(t.metadata.tables[table], _KEYS[table], replace, part)
        for (table, replace), part in found.items()
        if part
    ]


_IN_STATEMENT_TYPES = frozenset([LangGraphCheckpoint.type, LangGraphWrites.type])
_KEYS = {
    "langgraph_checkpoints": _CHECKPOINT_KEYS,
    "langgraph_channel_values": _VALUE_KEYS,
    "langgraph_writes": _WRITE_KEYS,
}


def _thread_deleted(c: Connection, e: LangGraphThreadDeleted, r: RecordedEvent) -> None:
    for table in (t.langgraph_writes, t.langgraph_channel_values, t.langgraph_checkpoints):
        c.execute(delete(table).where(table.c.thread_id == e.thread_id))


CHECKPOINT_HANDLERS[LangGraphCheckpoint.type] = _checkpoint
CHECKPOINT_HANDLERS[LangGraphWrites.type] = _writes
CHECKPOINT_HANDLERS[LangGraphThreadDeleted.type] = _thread_deleted
