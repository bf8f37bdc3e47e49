"""`artstore archive` / `artstore restore`: a run moved out of the database and back.

On SQLite and PostgreSQL, on the recorded run of tests/support/recorded_run.py, beside a
rollout of another run that shares two of its blobs (the system message, the tool list).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest
from archive_helpers import event_count, run_streams, run_views, stored_events
from command_line import run_artstore
from langchain_core.messages import AIMessage, HumanMessage
from recorded_run import RUN, SYSTEM, TOOLS, record_run
from sqlalchemy import text
from training_helpers import projections

from artstore.analysis.sql import run_read_only
from artstore.archive import archive_run, restore_run
from artstore.archive.files import read_archive, run_location
from artstore.documents import messages as lc
from artstore.errors import ArchiveError, QueryRefusedError
from artstore.events import LLMCall, RolloutFinished, RolloutStarted, RunFinished
from artstore.eventstore import blob_hash
from artstore.eventstore.blobs import canonical_json

OTHER_ROLLOUT = "other-rollout"


async def record_other_run(store) -> set[str]:
    """A rollout of another run naming two of the recorded run's blobs; its blob hashes."""
    blobs = {}
    for body in (lc.dump_message(SYSTEM), canonical_json(TOOLS)):
        blobs[blob_hash(body)] = body
    system, tools = list(blobs)
    question, answer = lc.dump_message(HumanMessage("2+3?")), lc.dump_message(AIMessage("5"))
    blobs |= {blob_hash(question): question, blob_hash(answer): answer}
    at = datetime(2026, 3, 2, tzinfo=UTC)
    await store.append(
        f"rollout-{OTHER_ROLLOUT}",
        [
            RolloutStarted(
                rollout_id=OTHER_ROLLOUT, run="other", model="m", role="policy", started_at=at
            ),
            LLMCall(
                call_id="other-call",
                index=0,
                input=[system, blob_hash(question)],
                output=blob_hash(answer),
                tools=tools,
                started_at=at,
            ),
            RolloutFinished(rollout_id=OTHER_ROLLOUT, result="5", duration_s=1.0),
        ],
        blobs=blobs,
    )
    return set(blobs)


async def blob_hashes(store) -> set[str]:
    async with store.database.read() as connection:
        return set((await connection.execute(text("SELECT hash FROM blobs"))).scalars())


async def projections_equal_a_rebuild(store) -> None:
    before = await projections(store)
    await store.rebuild_projections()
    assert await projections(store) == before


async def test_an_archived_run_comes_back_as_stored_and_projected_as_a_rebuild(
    store, tmp_path: Path
):
    await record_run(store)
    other_blobs = await record_other_run(store)
    streams = await run_streams(store, RUN)
    events, views = await stored_events(store, streams), await run_views(store, RUN)
    other_views = await run_views(store, "other")
    target = str(tmp_path / "archive")

    archived = await archive_run(store, RUN, target)

    # Written, read back: every event as stored, with its position in this database.
    archive = read_archive(target, RUN)
    assert archive.manifest_sha256 == archived.manifest_sha256
    assert [
        tuple(e[k] for k in ("event_id", "stream_id", "version", "type", "data"))
        for e in archive.events
    ] == [e[:5] for e in events]
    manifest = archive.manifest
    assert {f["kind"] for f in manifest["files"]} == {"events", "blobs"}
    assert all(len(f["sha256"]) == 64 and f["rows"] > 0 for f in manifest["files"])
    assert manifest["num_events"] == len(events) == archived.num_events
    # Removed: the run's events, rows and blobs; kept: what the other run names.
    assert await stored_events(store, streams) == []
    assert all(rows == [] for rows in (await run_views(store, RUN)).values())
    assert await run_views(store, "other") == other_views
    left = await blob_hashes(store)
    assert other_blobs <= left
    assert archived.blobs_removed == archived.num_blobs - 2 and len(left) == len(other_blobs)
    (marker,) = await store.read_stream(f"archive-{RUN}")
    assert (
        marker.type == "run.archived" and marker.data["manifest_sha256"] == archive.manifest_sha256
    )
    await projections_equal_a_rebuild(store)
    with pytest.raises(ArchiveError, match="archived already"):
        await archive_run(store, RUN, target)

    restored = await restore_run(store, RUN, target)

    assert restored.num_events == len(events)
    assert await stored_events(store, streams) == events  # byte for byte, in their order
    assert await run_views(store, RUN) == views
    assert await run_views(store, "other") == other_views
    await projections_equal_a_rebuild(store)
    assert [e.type for e in await store.read_stream(f"archive-{RUN}")] == [
        "run.archived",
        "run.restored",
    ]
    with pytest.raises(ArchiveError, match="is in the database"):
        await restore_run(store, RUN, target)

    # Archived again: a new archive replaces the first, whose files are removed.
    again = await archive_run(store, RUN, target)
    fs, where = run_location(target, RUN)
    named = {"manifest.json", *(f["name"] for f in read_archive(target, RUN).manifest["files"])}
    assert {path.rsplit("/", 1)[-1] for path in fs.ls(where, detail=False)} == named
    assert again.manifest_sha256 != archived.manifest_sha256 and again.num_events == len(events)


async def test_a_damaged_archive_or_a_running_run_is_refused_and_nothing_changes(
    store, tmp_path: Path
):
    await record_run(store)
    target = str(tmp_path / "archive")
    await archive_run(store, RUN, target)
    fs, where = run_location(target, RUN)
    (events_file,) = [
        f for f in read_archive(target, RUN).manifest["files"] if f["kind"] == "events"
    ]
    segment = Path(where) / events_file["name"]
    damaged = bytearray(segment.read_bytes())
    damaged[len(damaged) // 2] ^= 0xFF
    segment.write_bytes(bytes(damaged))
    with pytest.raises(ArchiveError, match="checksum"):
        await restore_run(store, RUN, target)
    with pytest.raises(ArchiveError, match="no archive"):
        await restore_run(store, RUN, str(tmp_path / "elsewhere"))
    assert await event_count(store, "rollout-") == 0

    await store.append("run-live", [RunFinished(run="live")])  # no row: not a run yet
    await record_run_started(store, "live")
    with pytest.raises(ArchiveError, match="is running"):
        await archive_run(store, "live", target)
    assert await event_count(store, "run-live") == 2
    assert not fs.exists(f"{run_location(target, 'live')[1]}/manifest.json")


async def record_run_started(store, run: str) -> None:
    from artstore.events import RunStarted

    started = RunStarted(
        run=run, project="p", model="m", config={}, scenarios=[], scorer="s", trainer="h:1"
    )
    await store.append(f"run-{run}", [started])


async def test_no_query_can_take_a_permit_or_delete_and_no_ordinary_statement_deletes(store):
    await record_run(store)
    for statement in (
        "INSERT INTO archive_permits (run) VALUES ('x')",
        "DELETE FROM events",
        "DELETE FROM blobs",
    ):
        with pytest.raises(QueryRefusedError):
            await run_read_only(store.database, statement)
    for statement in ("DELETE FROM events", "DELETE FROM blobs"):
        with pytest.raises(Exception, match="immutable"):
            async with store.database.write() as connection:
                await connection.execute(text(statement))
    assert await event_count(store, "rollout-") > 0


def test_the_commands_archive_restore_and_query_an_archived_run(recorded_url: str, tmp_path):
    target = str(tmp_path / "archive")
    question = "SELECT run, status, num_rollouts, num_groups, last_step FROM v_runs"
    asked = run_artstore("sql", question, "--format", "csv", "--url", recorded_url)
    assert asked.exit_code == 0 and RUN in asked.stdout
    archived = run_artstore("archive", RUN, "--to", target, "--url", recorded_url)
    assert archived.exit_code == 0, archived.stderr
    assert f"archived run {RUN} to {target}" in archived.stdout
    empty = run_artstore("sql", question, "--format", "csv", "--url", recorded_url)
    assert empty.stdout.splitlines() == asked.stdout.splitlines()[:1]  # the header alone
    answered = run_artstore("sql", question, "--format", "csv", "--archived", target)
    assert answered.exit_code == 0, answered.stderr
    assert answered.stdout == asked.stdout  # the same views over the archive
    again = run_artstore("archive", RUN, "--to", target, "--url", recorded_url)
    assert again.exit_code == 1 and "archived already" in again.stderr
    restored = run_artstore(
        "restore", RUN, "--from", target, "--url", recorded_url, "--format", "json"
    )
    assert restored.exit_code == 0, restored.stderr
    summary = json.loads(restored.stdout)
    assert summary["run"] == RUN and summary["num_events"] == 39
