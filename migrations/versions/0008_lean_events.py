"""a leaner event log: no index on events.type

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01 15:00:00.000000

Every append wrote the index on `events.type` as well as the table and its two unique
keys; nothing needs it. Each query artstore makes by type names the streams too (and is
served by the unique (stream_id, version) key); `read_all(types=...)` walks the log in
position order and filters. Dropped on both databases (one schema serves both); no event
is touched. A downgrade builds the index again from the stored events.
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.drop_index("ix_events_type", table_name="events")


def downgrade() -> None:
    op.create_index("ix_events_type", "events", ["type"], unique=False)
