"""blobs.codec: a blob's body may be stored in a compact form

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01 15:00:00.000000

`blobs.codec` names the form `blobs.body` is stored in: NULL for the blob's text itself
(every blob stored before this revision), `logprob-columns/1` for the compact form of
artstore/eventstore/blob_codec.py (token logprobs kept as columns), which reads back as
exactly the same text. Stored blobs are left as they are: a nullable column added, no row
rewritten (blobs are append-only).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("blobs", sa.Column("codec", sa.String(length=32), nullable=True))


def downgrade() -> None:
    # Compact bodies would be unreadable without their codec: refuse while any exists.
    compact = op.get_bind().execute(sa.text("SELECT count(*) FROM blobs WHERE codec IS NOT NULL"))
    if compact.scalar():
        raise RuntimeError("blobs stored in a compact form exist: cannot downgrade below 0007")
    op.drop_column("blobs", "codec")
