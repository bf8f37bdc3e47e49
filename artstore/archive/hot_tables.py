"""The two transactions that move a run between the database and its archive.

`remove_run`: once the archive was written and read back, the run's events, the blobs
no other event names and every projection row the run's events made are deleted, and
`run.archived` is appended, in one transaction (the one deletion artstore makes: the
schema lets it through only while the transaction holds a row of `archive_permits`).
`restore_run`: the archived events are inserted again as stored (ids, streams, versions,
types, payload texts and times; new global positions, in their old order), their blobs
with them, projected as a rebuild projects them, and `run.restored` appended.
Both hold appenders off for their whole transaction and write nothing if a check fails.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import delete, func, select
from sqlalchemy.engine import Connection

from artstore.archive.members import (
    RunMembers,
    chunks,
    extent,
    hashes_named_elsewhere,
    run_members,
)
from artstore.errors import ArchiveError
from artstore.events import Event, RunArchived, RunRestored
from artstore.eventstore.blobs import blob_text
from artstore.eventstore.database import recorder_of
from artstore.eventstore.records import check_blob, event_row, recorded_events
from artstore.projections import project
from artstore.redaction import Redactor
from artstore.schema import tables as t

PROJECTION_PAGE = 2000  # events projected at a time, as a rebuild pages them


def archive_stream(run: str) -> str:
    return f"archive-{run}"


@dataclass(frozen=True)
class Archived:
    """What the archive written holds: the removal checks the run still is exactly that."""

    target: str
    manifest_sha256: str
    streams: tuple[str, ...]
    num_events: int
    last_position: int
    blob_hashes: frozenset[str]


def refuse_unarchivable(connection: Connection, members: RunMembers) -> None:
    """Refuse a run still being written, or whose groups another run's steps trained on
    (their train steps' numbers are made of this run's rewards)."""
    status = connection.execute(select(t.runs.c.status).where(t.runs.c.run == members.run)).scalar()
    if status == "running":
        raise ArchiveError(
            f"run {members.run!r} is running (or its trainer died: resume it to end it); "
            "archive it once it has ended"
        )
    steps, named = t.train_steps, t.train_step_groups
    for batch in chunks(members.group_ids):
        other = connection.execute(
            select(steps.c.run)
            .join(named, named.c.train_step_id == steps.c.id)
            .where(named.c.group_id.in_(batch), steps.c.run != members.run)
            .limit(1)
        ).scalar()
        if other is not None:
            raise ArchiveError(
                f"run {other!r} trained on groups of run {members.run!r}: archive {other!r} "
                "first, or keep both"
            )


def remove_run(
    connection: Connection, run: str, archived: Archived, step: Callable[[str], None]
) -> int:
    """Delete the archived run from the database; the number of blobs removed."""
    recorder_of(connection).lock_for_removal(connection)
    members = run_members(connection, run)
    if not members.streams:
        raise ArchiveError(f"run {run!r} holds no events in the database: archived already?")
    refuse_unarchivable(connection, members)
    now = (members.streams, *extent(connection, members.streams))
    if now != (archived.streams, archived.num_events, archived.last_position):
        raise ArchiveError(
            f"run {run!r} changed while it was being archived; nothing was removed, "
            "archive it again"
        )
    # First, so that its position is above every removed one: SQLite numbers an event after
    # the highest stored, and a position must never be handed out twice.
    event = RunArchived(
        run=run,
        target=archived.target,
        manifest_sha256=archived.manifest_sha256,
        num_events=archived.num_events,
        num_blobs=len(archived.blob_hashes),
    )
    _append(connection, archive_stream(run), event)
    connection.execute(t.archive_permits.insert().values(run=run))
    _delete_projected(connection, members)
    for batch in chunks(members.streams):
        connection.execute(delete(t.events).where(t.events.c.stream_id.in_(batch)))
    candidates = set(archived.blob_hashes)
    removable = candidates - hashes_named_elsewhere(connection, members.streams, candidates)
    for batch in chunks(sorted(removable)):
        connection.execute(delete(t.blobs).where(t.blobs.c.hash.in_(batch)))
    connection.execute(delete(t.archive_permits))
    step("removed")
    return len(removable)


def _delete_projected(connection: Connection, members: RunMembers) -> None:
    """Every projection row the run's events made, and the run's coordination rows."""
    run = members.run
    for table in (t.llm_calls, t.rewards, t.latest_rewards, t.trajectory_messages):
        for batch in chunks(members.rollout_ids):
            connection.execute(delete(table).where(table.c.rollout_id.in_(batch)))
    own_steps = select(t.train_steps.c.id).where(t.train_steps.c.run == run)
    connection.execute(
        delete(t.train_step_groups).where(t.train_step_groups.c.train_step_id.in_(own_steps))
    )
    for table in (t.train_steps, t.group_consumptions, t.groups, t.rollouts, t.runs):
        connection.execute(delete(table).where(table.c.run == run))
    for batch in chunks(members.group_ids):
        connection.execute(delete(t.groups).where(t.groups.c.group_id.in_(batch)))
    for table in (*t.COORDINATION_TABLES, t.api_tokens):
        connection.execute(delete(table).where(table.c.run == run))


def restore_run(
    connection: Connection,
    run: str,
    source: str,
    manifest_sha256: str,
    archived_events: list[dict[str, Any]],
    archived_blobs: list[dict[str, Any]],
    step: Callable[[str], None],
) -> list[int]:
    """Insert the archived events and blobs again and project them; their new positions."""
    recorder = recorder_of(connection)
    recorder.lock_appends(connection)
    streams = sorted({e["stream_id"] for e in archived_events})
    for batch in chunks(streams):
        stored = select(func.count()).where(t.events.c.stream_id.in_(batch))
        if connection.execute(stored).scalar():
            raise ArchiveError(f"run {run!r} is in the database: nothing was restored")
    for blob in archived_blobs:
        check_blob(blob["hash"], blob_text(blob["body"], blob["codec"]))
    fields = ("hash", "body", "size", "codec")
    for batch in chunks(archived_blobs):
        rows = [{name: blob[name] for name in fields} for blob in batch]
        recorder.insert_missing(connection, t.blobs, "hash", rows)
    rows = [
        {name: e[name] for name in ("event_id", "stream_id", "version", "type", "data")}
        | {"recorded_at": e["recorded_at"].astimezone(UTC)}
        for e in sorted(archived_events, key=lambda e: e["position"])
    ]
    positions = recorder.insert_events(connection, rows) if rows else []
    recorded = recorded_events(rows, positions)
    for start in range(0, len(recorded), PROJECTION_PAGE):
        project(connection, recorded[start : start + PROJECTION_PAGE], whole_transaction=False)
    event = RunRestored(
        run=run, source=source, manifest_sha256=manifest_sha256, num_events=len(rows)
    )
    _append(connection, archive_stream(run), event)
    step("restored")
    return positions


def _append(connection: Connection, stream_id: str, event: Event) -> None:
    """Append one event at the stream's head, in this transaction (nothing projects it)."""
    head = connection.execute(
        select(func.max(t.events.c.version)).where(t.events.c.stream_id == stream_id)
    ).scalar()
    row = event_row(stream_id, event, Redactor(), datetime.now(UTC))
    recorder_of(connection).insert_events(connection, [{**row, "version": (head or 0) + 1}])
