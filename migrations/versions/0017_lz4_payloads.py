"""lz4_payloads: PostgreSQL compresses the text and JSON columns with lz4

Revision ID: 0017
Revises: 0015
Create Date: 2026-12-04 23:00:00.000000

PostgreSQL compresses a value when its row is over ~2 KB (TOAST), with pglz by default,
which gives up on a value whose first kilobyte it cannot shrink and is several times
slower than lz4. On a server built with lz4 (14 and later; `default_toast_compression`
lists it), every column stored out of line where needed (text, varchar, json: the event
payloads, blob bodies, message contents) is set to lz4 here. Values written from now on
use it; values already stored keep theirs until rewritten (a `VACUUM FULL` rewrites them,
not run here: it locks the tables for as long as it takes). Reading is unchanged: the
database decompresses either kind, and every view reads the same text. On a server
without lz4, and on SQLite, this revision changes nothing.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0017"
down_revision: str | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# The columns of this schema's tables whose type may be compressed (storage "extended").
_COMPRESSIBLE = sa.text(
    "SELECT c.relname, a.attname FROM pg_attribute a "
    "JOIN pg_class c ON c.oid = a.attrelid "
    "JOIN pg_namespace n ON n.oid = c.relnamespace "
    "JOIN pg_type t ON t.oid = a.atttypid "
    "WHERE n.nspname = current_schema() AND c.relkind = 'r' AND a.attnum > 0 "
    "AND NOT a.attisdropped AND a.attstorage = 'x' AND c.relname <> 'alembic_version' "
    "ORDER BY c.relname, a.attnum"
)
_LZ4_AVAILABLE = sa.text(
    "SELECT 'lz4' = ANY(enumvals) FROM pg_settings WHERE name = 'default_toast_compression'"
)


def _set_compression(method: str) -> None:
    if op.get_context().dialect.name != "postgresql":
        return
    connection = op.get_bind()
    if not connection.execute(_LZ4_AVAILABLE).scalar():
        return  # before PostgreSQL 14, or built without lz4: pglz stays
    for table, column in connection.execute(_COMPRESSIBLE).all():
        op.execute(f'ALTER TABLE "{table}" ALTER COLUMN "{column}" SET COMPRESSION {method}')


def upgrade() -> None:
    _set_compression("lz4")


def downgrade() -> None:
    _set_compression("pglz")
