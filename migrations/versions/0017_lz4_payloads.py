"""lz4_payloads: PostgreSQL compresses event payloads and blob bodies with lz4

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-04 23:00:00.000000

PostgreSQL compresses a value when its row is over ~2 KB (TOAST), with pglz by default.
Measured on the corpus of tools/corpus.py (400 rollouts, each column's values written
again under each method): `events.data` takes the same space under both (5.2 MB), and
`blobs.body`, whose large bodies are deflated already (eventstore/blob_deflate.py) and
so cannot shrink, too (15.3 MB) but pglz spends 3x as long finding that out (239 ms
against 72). So these two columns, which every append writes, are set to lz4, on a
server built with it (14 and later; `default_toast_compression` lists it). The
projections' text columns keep pglz: on the same run `trajectory_messages.content` took
7.1 MB under pglz and 9.0 MB under lz4. Values written from now on use lz4; values
already stored keep theirs until rewritten. Reading is unchanged: the database
decompresses either kind. On a server without lz4, and on SQLite, this revision changes
nothing.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0017"
down_revision: str | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

COLUMNS = (("events", "data"), ("blobs", "body"))
_LZ4_AVAILABLE = sa.text(
    "SELECT 'lz4' = ANY(enumvals) FROM pg_settings WHERE name = 'default_toast_compression'"
)


def _set_compression(method: str) -> None:
    if op.get_context().dialect.name != "postgresql":
        return
    if not op.get_bind().execute(_LZ4_AVAILABLE).scalar():
        return  # before PostgreSQL 14, or built without lz4: pglz stays
    for table, column in COLUMNS:
        op.execute(f"ALTER TABLE {table} ALTER COLUMN {column} SET COMPRESSION {method}")


def upgrade() -> None:
    _set_compression("lz4")


def downgrade() -> None:
    _set_compression("pglz")
