"""Queries of many streams at once that read each stream through its index.

`WHERE stream_id IN (...)` with hundreds of ids is what a batch asks of `events` (the
heads of the streams it appends to, the calls and trajectories of the rollouts it
finishes). How each database is made to read such a list through the (stream, version)
index, whatever its statistics say, is its recorder's (`Recorder.select_heads`,
`Recorder.select_streams`; PostgreSQL's reasons are in artstore.eventstore.postgres).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from sqlalchemy.engine import Connection
from sqlalchemy.sql import Select

from artstore.eventstore.database import recorder_of
from artstore.eventstore.recorder import Recorder


def stream_heads(connection: Connection, stream_ids: Iterable[str]) -> dict[str, int]:
    """The version of each of these streams that has events (streams without are left out)."""
    ids = sorted(set(stream_ids))
    if not ids:
        return {}
    query = recorder_of(connection).select_heads(ids)
    return {stream_id: version for stream_id, version in connection.execute(query) if version}


def events_of_streams(
    recorder: Recorder,
    stream_ids: Sequence[str],
    columns: Sequence[Any],
    event_type: str | None = None,
) -> Select:
    """`columns` of the events in these streams (of type `event_type` only, when given),
    by stream id and version (each id at most once in `stream_ids`)."""
    return recorder.select_streams(stream_ids, columns, event_type)
