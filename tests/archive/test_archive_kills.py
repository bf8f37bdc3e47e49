"""A SIGKILL at any step of `artstore archive` or `artstore restore` loses nothing: the
run is left whole in the database or whole in the archive, and the command run again
finishes the work. Each kill is a real child process killing itself at a named step
(tests/support/archive_driver.py); on SQLite and PostgreSQL, the steps shared out between
the two databases (all on both under ARTSTORE_LONG=1, `points_in_budget`).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from archive_driver import ARCHIVE_POINTS, RESTORE_POINTS, run_killed
from archive_helpers import run_streams, run_views, stored_events
from crash_runs import forkserver, points_in_budget
from recorded_run import RUN, record_run
from training_helpers import projections

from artstore.archive import archive_run, restore_run
from artstore.archive.files import read_archive, utc
from artstore.errors import ArchiveError

pytestmark = pytest.mark.slow


def killed_at(processes, command: str, url: str, target: str, point: str) -> None:
    child = processes.Process(target=run_killed, args=(command, url, target, RUN, point))
    child.start()
    child.join(timeout=120)
    if child.is_alive():
        child.kill()
        pytest.fail(f"{command} killed at {point} hung")
    assert child.exitcode == -9, f"{command} at {point} exited {child.exitcode}"


async def where_the_run_is(store, streams: list[str], events: list[tuple], target: str) -> str:
    """ "database" or "archive": wherever it is, it is whole there (and not half elsewhere)."""
    stored = await stored_events(store, streams)
    if stored:
        assert stored == events
        return "database"
    fields = ("event_id", "stream_id", "version", "type", "data")
    archived = [
        (*(e[k] for k in fields), e["recorded_at"]) for e in read_archive(target, RUN).events
    ]
    assert archived == [(*e[:5], utc(e[5])) for e in events]
    return "archive"


async def consistent(store) -> None:
    before = await projections(store)
    await store.rebuild_projections()
    assert await projections(store) == before


async def test_a_kill_at_any_step_leaves_the_run_whole_in_one_place(
    store, database_url: str, tmp_path: Path
):
    url = database_url
    await record_run(store)
    streams = await run_streams(store, RUN)
    events, views = await stored_events(store, streams), await run_views(store, RUN)
    target = str(tmp_path / "archive")
    processes = forkserver(["archive_driver"])

    for point in points_in_budget(ARCHIVE_POINTS, url):
        killed_at(processes, "archive", url, target, point)
        place = await where_the_run_is(store, streams, events, target)
        assert place == ("archive" if point.startswith("committed") else "database"), point
        await consistent(store)
    try:
        await archive_run(store, RUN, target)
    except ArchiveError as exc:  # the kill after the commit archived it already
        assert "archived already" in str(exc)
    assert await where_the_run_is(store, streams, events, target) == "archive"

    for point in points_in_budget(RESTORE_POINTS, url):
        killed_at(processes, "restore", url, target, point)
        place = await where_the_run_is(store, streams, events, target)
        assert place == ("database" if point.startswith("committed") else "archive"), point
        await consistent(store)
    if not await stored_events(store, streams):
        await restore_run(store, RUN, target)
    assert await stored_events(store, streams) == events
    assert await run_views(store, RUN) == views
    await consistent(store)
