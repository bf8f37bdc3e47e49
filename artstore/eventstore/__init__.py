"""The event store: append-only streams of events in SQLite or PostgreSQL."""

from artstore.eventstore.blobs import blob_hash, encode_blob
from artstore.eventstore.records import (
    ANY,
    NO_STREAM,
    AppendResult,
    PendingAppend,
    RecordedEvent,
)
from artstore.eventstore.store import EventStore

__all__ = [
    "ANY",
    "NO_STREAM",
    "AppendResult",
    "EventStore",
    "PendingAppend",
    "RecordedEvent",
    "blob_hash",
    "encode_blob",
]
