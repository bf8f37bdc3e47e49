"""`artstore archive` and `artstore restore`: a run moved out of the database and back.

`archive_run(store, run, target)` writes the run's events and blobs, as stored, to zstd
parquet segments with a manifest under `target` (a directory or an fsspec URL such as
`s3://bucket/prefix`), reads every file back and checks it, and only then removes the
run from the database in one transaction that appends `run.archived`.
`restore_run(store, run, source)` reads the archive back, checks it, and inserts the
events and blobs again in one transaction that projects them and appends `run.restored`.
A process killed at any point leaves the run whole in the database or whole in the
archive. `files.py`: the archive's files; `members.py`: what belongs to a run;
`hot_tables.py`: the two transactions.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from artstore.archive.files import read_archive, remove_unnamed, utc, write_archive
from artstore.archive.hot_tables import Archived, refuse_unarchivable, remove_run
from artstore.archive.hot_tables import restore_run as restore_rows
from artstore.archive.members import (
    blob_rows,
    event_rows,
    named_hashes,
    run_members,
)
from artstore.errors import ArchiveError
from artstore.schema.migrate import HEAD_REVISION
from artstore.urls import redact

if TYPE_CHECKING:
    from artstore.store import Store

Step = Callable[[str], None]

__all__ = ["ArchiveSummary", "archive_run", "restore_run"]


@dataclass(frozen=True)
class ArchiveSummary:
    """What an archive or a restore moved."""

    run: str
    location: str  # the target or source, a password in a URL left out
    manifest_sha256: str
    num_events: int
    num_blobs: int  # blobs in the archive
    blobs_removed: int = 0  # archive: blobs no other event named, deleted with the run


def _nothing(name: str) -> None:
    pass


async def archive_run(
    store: Store, run: str, target: str, *, on_step: Step = _nothing
) -> ArchiveSummary:
    """Archive `run` to `target` and remove it from the database.

    `on_step(name)` is told each step done: "read", "segment" (each file written),
    "manifest", "verified", "removed" (inside the transaction, before it commits),
    "committed"."""
    location = redact(target)
    streams, events, blobs = await store.database.run_read(lambda c: _read_run(c, run))
    on_step("read")
    about = {
        "artstore_version": _version(),
        "schema_revision": HEAD_REVISION,
        "created_at": datetime.now(UTC).isoformat(),
        "source_database": store.dialect,
    }
    sha = await asyncio.to_thread(write_archive, target, run, events, blobs, about, on_step)
    archived = Archived(
        target=location,
        manifest_sha256=sha,
        streams=streams,
        num_events=len(events),
        last_position=events[-1]["position"],
        blob_hashes=frozenset(b["hash"] for b in blobs),
    )

    removed = await store.events.write_transaction(lambda c: remove_run(c, run, archived, on_step))
    on_step("committed")
    await asyncio.to_thread(remove_unnamed, target, run, sha)
    return ArchiveSummary(run, location, sha, len(events), len(blobs), removed)


async def restore_run(
    store: Store, run: str, source: str, *, on_step: Step = _nothing
) -> ArchiveSummary:
    """Bring `run` back into the database from its archive under `source`.

    `on_step(name)`: "read" (the archive read back and checked), "restored" (inside the
    transaction, before it commits), "committed"."""
    location = redact(source)
    archive = await asyncio.to_thread(read_archive, source, run)
    on_step("read")

    await store.events.write_transaction(
        lambda c: restore_rows(
            c, run, location, archive.manifest_sha256, archive.events, archive.blobs, on_step
        )
    )
    on_step("committed")
    return ArchiveSummary(
        run, location, archive.manifest_sha256, len(archive.events), len(archive.blobs)
    )


def _read_run(connection: Any, run: str) -> tuple[tuple[str, ...], list[dict], list[dict]]:
    members = run_members(connection, run)
    if not members.streams:
        raise ArchiveError(
            f"no run {run!r} in the database (archived already? `artstore restore` brings one back)"
        )
    refuse_unarchivable(connection, members)
    events = [row._asdict() for row in event_rows(connection, members.streams)]
    for event in events:
        event["recorded_at"] = utc(event["recorded_at"])
    hashes = named_hashes(event["data"] for event in events)
    blobs = [row._asdict() for row in blob_rows(connection, hashes)]
    return members.streams, events, blobs


def _version() -> str:
    from artstore import __version__

    return __version__
