"""PostgreSQL: appends with nothing to project run side by side; readers stop at a watermark

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-01 14:30:00.000000

Until now every appending transaction held an EXCLUSIVE lock on `append_lock` from its
INSERT into `events` until it committed, so positions were handed out in commit order,
and one commit at a time (its WAL flush included) capped the whole cluster.

From this revision, an INSERT made through `artstore_insert_events(...)` (the event
store's appends that have nothing to project: one statement that commits by itself) is
*concurrent*: it takes `append_lock` in ROW EXCLUSIVE mode (which such appends share, and
which waits for an EXCLUSIVE holder: the other appends, a rebuild of the projections) and
a shared transaction-level advisory lock whose key says "nothing below this position is
mine" (the sequence's last value, read before its rows take their positions). Every other
INSERT into `events` takes the EXCLUSIVE lock as before.

Concurrent appends may commit out of position order, so a reader that follows positions
reads only up to `artstore_safe_position()`: the smaller of the last position handed out
(read first) and the smallest key of a concurrent append still in flight (read after),
in a statement of its own, before the statement that reads the events (a snapshot taken
later). Every position at or below it is committed, rolled back, or held by an EXCLUSIVE
append that every later append waits for: the reader sees every committed event once,
in order, as before. A reader of an older artstore ignores the watermark: upgrade readers
with writers.

SQLite is unchanged (one writer at a time is the file's own rule).
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# The advisory keys of concurrent appends: this offset plus a position. Positions below
# 2**40 keep the keys' high 32 bits (pg_locks.classid) within 256 values of its own.
KEY_OFFSET = 0x4172_7400_0000_0000
_CLASSID_FIRST = KEY_OFFSET >> 32
_CLASSID_LAST = _CLASSID_FIRST + 255

# The last position the sequence handed out (0 before the first).
_HANDED_OUT = (
    "SELECT CASE WHEN is_called THEN last_value ELSE last_value - 1 END FROM events_position_seq"
)

_LOCK_APPENDS = f"""
CREATE OR REPLACE FUNCTION artstore_lock_appends() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF current_setting('artstore.concurrent_append', true) = 'on' THEN
        LOCK TABLE append_lock IN ROW EXCLUSIVE MODE;
        -- Taken before this statement's rows take their positions (all above the key).
        PERFORM pg_advisory_xact_lock_shared({KEY_OFFSET} + ({_HANDED_OUT}));
    ELSE
        LOCK TABLE append_lock IN EXCLUSIVE MODE;
    END IF;
    RETURN NULL;
END $$
"""

_LOCK_APPENDS_BEFORE = """
CREATE OR REPLACE FUNCTION artstore_lock_appends() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    LOCK TABLE append_lock IN EXCLUSIVE MODE;
    RETURN NULL;
END $$
"""

# The setting is set in the body: PostgreSQL 15 refuses a plain user a function's own
# SET clause for a custom setting. Where migration 0003 revoked set_config from PUBLIC
# (run as a superuser) and a plain user writes, the call fails and the writer goes back
# to transactions for good.
_INSERT_EVENTS = """
CREATE FUNCTION artstore_insert_events(
    event_ids varchar[], stream_ids varchar[], versions integer[], types varchar[],
    data json[], recorded_at timestamptz[]
) RETURNS TABLE (inserted_event_id varchar, inserted_position bigint)
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM set_config('artstore.concurrent_append', 'on', true);
    RETURN QUERY
        INSERT INTO events AS e (event_id, stream_id, version, type, data, recorded_at)
        SELECT * FROM unnest(event_ids, stream_ids, versions, types, data, recorded_at)
        RETURNING e.event_id, e.position;
    PERFORM set_config('artstore.concurrent_append', 'off', true);
END $$
"""

_SAFE_POSITION = f"""
CREATE FUNCTION artstore_safe_position() RETURNS bigint LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    handed_out bigint;
    in_flight bigint;
BEGIN
    -- In this order: an append that took a position up to `handed_out` holds its key by now.
    {_HANDED_OUT} INTO handed_out;
    SELECT min(((classid::bigint << 32) | objid::bigint) - {KEY_OFFSET}) INTO in_flight
    FROM pg_locks
    WHERE locktype = 'advisory' AND objsubid = 1
      AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
      AND classid::bigint BETWEEN {_CLASSID_FIRST} AND {_CLASSID_LAST};
    RETURN LEAST(handed_out, in_flight);
END $$
"""


def upgrade() -> None:
    if op.get_context().dialect.name != "postgresql":
        return
    op.execute(_LOCK_APPENDS)
    op.execute(_INSERT_EVENTS)
    op.execute(_SAFE_POSITION)


def downgrade() -> None:
    if op.get_context().dialect.name != "postgresql":
        return
    op.execute(_LOCK_APPENDS_BEFORE)
    op.execute(
        "DROP FUNCTION IF EXISTS artstore_insert_events("
        "varchar[], varchar[], integer[], varchar[], json[], timestamptz[])"
    )
    op.execute("DROP FUNCTION IF EXISTS artstore_safe_position()")
