"""SQLite lookups (`Database.run_lookup`, a checkpoint's `get`) run on the event loop's
thread when the file can be read at once; one that SQLite says is busy runs again in a
reader thread, which waits for the file; any other error is raised as it is."""

from __future__ import annotations

import sqlite3
import threading

import pytest
from sqlalchemy import func, select, text
from sqlalchemy.exc import OperationalError

import artstore
from artstore.schema.tables import events


def busy() -> OperationalError:
    """What SQLite raises when another process holds what a read needs."""
    cause = sqlite3.OperationalError("database is locked")
    cause.sqlite_errorcode = sqlite3.SQLITE_BUSY
    return OperationalError("SELECT", {}, cause)


@pytest.fixture
def sqlite_url(tmp_path, migrated_templates) -> str:
    return migrated_templates.sqlite_copy(tmp_path / "artstore.db")


async def test_a_lookup_runs_on_the_loops_thread_and_in_a_reader_when_busy(sqlite_url):
    async with await artstore.open_store(sqlite_url) as store:
        loop_thread = threading.get_ident()
        ran: list[int] = []

        def count(connection):
            ran.append(threading.get_ident())
            return connection.execute(select(func.count()).select_from(events)).scalar()

        assert await store.database.run_lookup(count) == 0
        assert ran == [loop_thread]

        ran.clear()

        def busy_on_the_loop(connection):
            if threading.get_ident() == loop_thread:
                ran.append(loop_thread)
                raise busy()
            return count(connection)

        assert await store.database.run_lookup(busy_on_the_loop) == 0
        assert ran[0] == loop_thread and ran[1:] != [] and loop_thread not in ran[1:]

        ran.clear()

        def broken(connection):
            ran.append(threading.get_ident())
            connection.execute(text("SELECT * FROM no_such_table"))

        with pytest.raises(Exception, match="no_such_table"):
            await store.database.run_lookup(broken)
        assert ran == [loop_thread]
