"""What an event store stores and hands back: events as recorded, results of appends,
and the row an event becomes (`event_row`: encoded, redacted, checked for JSON)."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Table, select
from sqlalchemy.engine import Connection

from artstore.errors import InvalidEventError, WrongExpectedVersionError
from artstore.events import Event, decode_event, encode_event
from artstore.eventstore.blobs import blob_hash, load_payload, payload_json
from artstore.redaction import Redactor
from artstore.schema.tables import events

ANY: int | None = None  # expected_version: append whatever the stream's version
NO_STREAM = 0  # expected_version: the stream must not exist yet


@dataclass(frozen=True)
class RecordedEvent:
    """An event as stored: its envelope and its JSON payload."""

    position: int
    event_id: str
    stream_id: str
    version: int
    type: str
    data: dict[str, Any]
    recorded_at: datetime

    def decode(self) -> Event:
        """The typed event (raises UnknownEventTypeError for a type artstore does not declare)."""
        return decode_event(self.type, self.data, self.event_id)


@dataclass(frozen=True)
class PendingAppend:
    """One append of `append_together_nowait`: what `append` takes."""

    stream_id: str
    events: Sequence[Event]
    expected_version: int | None = ANY
    blobs: Mapping[str, str] | None = None


@dataclass(frozen=True)
class AppendResult:
    stream_id: str
    version: int  # the stream's version after the append
    positions: list[int]
    written: bool  # False when the append was a retry of one already stored


# Called inside the appending transaction with the events just written and the blob
# texts the transaction's appends carried, by hash: projections. Synchronous, so that a
# whole write transaction runs in one call.
Projector = Callable[[Connection, list[RecordedEvent], Mapping[str, str]], None]
# Whether a batch's event rows (before their INSERT) may be projected side by side with
# other appends: their projections need no order across appends.
SideBySide = Callable[[Connection, list[dict[str, Any]]], bool]


@dataclass(frozen=True)
class StatementRows:
    """Projection rows that the statement inserting their events writes (PostgreSQL), so
    that an append with them is one statement that commits by itself.

    Each row holds its columns but `position`, and `event_id`: the event whose position
    the statement gives it. On a key already stored, `replace` keeps the newer position
    (an upsert), else the row stored; without `keys`, a row whose key is stored refuses
    the statement, as the projector's INSERT refuses its transaction. Only for rows that
    need no order across appends: such a statement shares the append lock
    (artstore.projections.side_by_side)."""

    table: Table
    keys: tuple[str, ...]
    replace: bool
    rows: list[dict[str, Any]]


@dataclass(frozen=True)
class StatementAdds:
    """Numbers that the statement inserting their events adds to rows already stored
    (PostgreSQL): each row of `rows` holds `key`, `event_id` (the event whose insert it
    follows) and a value per column of `counts` (added) and `sums` (added as SQL's SUM
    adds: a NULL is skipped, NULL until a value comes). One row per key: a statement may
    not change a row twice. A key with no stored row changes nothing. Only for numbers
    that need no order across appends (see `StatementRows`)."""

    table: Table
    key: str
    counts: tuple[str, ...]
    sums: tuple[str, ...]
    rows: list[dict[str, Any]]


StatementPart = StatementRows | StatementAdds
# `in_statement(rows)`: the projection of these event rows (those of an append's batch
# that the projector projects, before their INSERT) as `StatementRows` and
# `StatementAdds`, or None where any of them needs the projector.
InStatement = Callable[[list[dict[str, Any]]], list[StatementPart] | None]
# Called inside the appending transaction before an append's events are written; raising
# refuses that append alone (nothing of it is written). Workers check their lease this way.
Condition = Callable[[Connection], None]


def event_row(
    stream_id: str, event: Event, redact: Redactor, recorded_at: datetime
) -> dict[str, Any]:
    type_name, data = encode_event(event)
    try:
        encoded = payload_json(data)  # refuse NaN and anything else that is not JSON, now
    except (TypeError, ValueError) as exc:
        raise InvalidEventError(f"{type_name!r} event is not valid JSON: {exc}") from None
    redacted = redact(encoded)
    if redacted != encoded:  # a secret in the payload: store the redacted document
        encoded = payload_json(json.loads(redacted))
    return {
        "event_id": event.event_id,
        "stream_id": stream_id,
        "type": type_name,
        "data": encoded,
        "recorded_at": recorded_at,
    }


def follows(stream_id: str, version: int, event_id: str) -> Callable[[Connection], None]:
    """An append condition: the event at `version` of `stream_id`, if stored, is `event_id`.

    For a writer that queues appends before the earlier ones commit (a rollout's calls,
    each expecting the version the previous one will make): when an earlier one is refused
    and another writer's event takes its version, the next one would otherwise be written
    after that event. Not stored yet (it is in the same transaction) passes: the unique
    (stream, version) key settles that case.
    """

    def condition(connection: Connection) -> None:
        found = connection.execute(
            select(events.c.event_id).where(
                events.c.stream_id == stream_id, events.c.version == version
            )
        ).scalar()
        if found is not None and found != event_id:
            raise WrongExpectedVersionError(
                stream_id,
                version,
                version,
                f"stream {stream_id!r}: another writer's event took version {version}, "
                "which this append was to follow; nothing was written",
            )

    return condition


def check_blob(digest: Any, text: Any) -> None:
    """Content addressing holds only if every text is stored under its own hash."""
    try:
        actual = blob_hash(text)
    except (AttributeError, UnicodeEncodeError) as exc:
        raise InvalidEventError(
            f"blob {str(digest)[:16]}...: its text must be a str that UTF-8 can hold "
            f"({type(exc).__name__}); nothing was written"
        ) from None
    if actual != digest:
        raise InvalidEventError(
            f"blob {str(digest)[:16]}...: its text's SHA-256 is {actual[:16]}...; a blob is "
            "stored under the SHA-256 of its text, nothing was written"
        )


def recorded_events(rows: list[dict[str, Any]], positions: list[int]) -> list[RecordedEvent]:
    return [
        RecordedEvent(
            position=position,
            event_id=row["event_id"],
            stream_id=row["stream_id"],
            version=row["version"],
            type=row["type"],
            data=load_payload(row["data"]),
            recorded_at=row["recorded_at"],
        )
        for row, position in zip(rows, positions, strict=True)
    ]


def recorded_from_row(row: Any) -> RecordedEvent:
    data = row.data if isinstance(row.data, dict) else json.loads(row.data)
    recorded_at = row.recorded_at
    if recorded_at.tzinfo is None:  # SQLite keeps no zone; artstore writes UTC
        recorded_at = recorded_at.replace(tzinfo=UTC)
    return RecordedEvent(
        position=row.position,
        event_id=row.event_id,
        stream_id=row.stream_id,
        version=row.version,
        type=row.type,
        data=data,
        recorded_at=recorded_at,
    )
