"""SQLite: the events table without AUTOINCREMENT (one page less per commit)

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-01 17:30:00.000000

On SQLite, AUTOINCREMENT made every append also rewrite `sqlite_sequence` (one page of
the five or six a single-event commit writes). What it guards against cannot happen to
artstore's events: a position handed out again after the highest event is deleted. The
triggers refuse every DELETE, UPDATE and REPLACE of a stored event, and the store's
writer numbers its events itself after the highest position ever handed out (the
highest stored, or the counter this migration keeps where the two differ), holding the
file's write lock: positions stay increasing, gap-free as appends commit them, and never
reused.

SQLite cannot take AUTOINCREMENT off a table in place, so the table is rebuilt in this
migration's transaction (SQLite's own procedure for a table change): a new table with
the same columns, keys and names, every event copied as it is stored (position, id and
payload byte for byte), the old table dropped, the new one renamed, the triggers created
again from their stored SQL. That copies the whole event log once: a large store needs
as much free disk again and some time. A store whose AUTOINCREMENT counter is above its
highest position (events deleted by hand before artstore refused it) keeps the counter
as a row of `sqlite_sequence`, which the writer reads.

PostgreSQL is untouched (its positions come from a sequence, which never goes back).
A downgrade rebuilds the table with AUTOINCREMENT, its counter at the highest position.
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op
from sqlalchemy.engine import Connection

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

COLUMNS = "position, event_id, stream_id, version, type, data, recorded_at"

# The table as `artstore.schema.tables.events` declares it, under a temporary name.
CREATE_EVENTS = """CREATE TABLE events_rebuilt (
\tposition INTEGER NOT NULL{autoincrement},
\tevent_id VARCHAR(36) NOT NULL,
\tstream_id VARCHAR(255) NOT NULL,
\tversion INTEGER NOT NULL,
\ttype VARCHAR(100) NOT NULL,
\tdata JSON NOT NULL,
\trecorded_at DATETIME NOT NULL,
\t{primary_key}CONSTRAINT uq_events_event_id UNIQUE (event_id),
\tCONSTRAINT uq_events_stream_id_version UNIQUE (stream_id, version)
)"""


def upgrade() -> None:
    if op.get_context().dialect.name != "sqlite":
        return
    _rebuild(op.get_bind(), autoincrement=False)


def downgrade() -> None:
    if op.get_context().dialect.name != "sqlite":
        return
    _rebuild(op.get_bind(), autoincrement=True)


def _rebuild(connection: Connection, *, autoincrement: bool) -> None:
    def scalar(statement: str) -> object:
        return connection.exec_driver_sql(statement).scalar()

    highest = int(scalar("SELECT coalesce(max(position), 0) FROM events") or 0)
    counter = 0
    if scalar("SELECT count(*) FROM sqlite_master WHERE name = 'sqlite_sequence'"):
        counter = int(scalar("SELECT max(seq) FROM sqlite_sequence WHERE name = 'events'") or 0)
    # Every other object on the table (its triggers; explicit indexes, if any were added),
    # made again from the SQL SQLite keeps for it.
    others = connection.exec_driver_sql(
        "SELECT type, name, sql FROM sqlite_master "
        "WHERE tbl_name = 'events' AND type IN ('trigger', 'index') AND sql IS NOT NULL "
        "ORDER BY type DESC, name"
    ).all()
    for kind, name, _sql in others:
        connection.exec_driver_sql(f'DROP {kind.upper()} "{name}"')
    primary_key = "CONSTRAINT pk_events PRIMARY KEY (position), \n\t"
    create = CREATE_EVENTS.format(
        autoincrement=" PRIMARY KEY AUTOINCREMENT" if autoincrement else "",
        primary_key="" if autoincrement else primary_key,
    )
    connection.exec_driver_sql(create)
    connection.exec_driver_sql(
        f"INSERT INTO events_rebuilt ({COLUMNS}) SELECT {COLUMNS} FROM events ORDER BY position"
    )
    connection.exec_driver_sql("DROP TABLE events")  # its sqlite_sequence row goes with it
    connection.exec_driver_sql("ALTER TABLE events_rebuilt RENAME TO events")
    for _kind, _name, sql in sorted(others, key=lambda other: other[0] != "index"):
        connection.exec_driver_sql(sql)
    # The highest position ever handed out stays the floor of the next one.
    floor = max(highest, counter)
    if autoincrement and floor:
        set_counter = f"UPDATE sqlite_sequence SET seq = {floor} WHERE name = 'events'"
        if not connection.exec_driver_sql(set_counter).rowcount:
            connection.exec_driver_sql(
                f"INSERT INTO sqlite_sequence (name, seq) VALUES ('events', {floor})"
            )
    elif not autoincrement and counter > highest:
        connection.exec_driver_sql(
            f"INSERT INTO sqlite_sequence (name, seq) VALUES ('events', {counter})"
        )
