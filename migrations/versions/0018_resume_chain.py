"""rollout_claims.resume_rollout_id: the attempt a slot's next rollout resumes

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-05 02:45:00.000000

A worker that claims a slot again resumes the rollout the slot's previous claim started
(its answered calls are served back). When that claim was lost before its rollout started
(its worker's first heartbeat came late), its rollout id names nothing, and the attempt
before it, abandoned by that claimant, was resumed by nobody: its calls were paid again.
The claim now keeps the attempt to resume apart from its rollout id, and moves it on only
to a rollout that started (artstore/workers/claims.py).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0018"
down_revision: str | None = "0017"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("rollout_claims") as table:
        table.add_column(sa.Column("resume_rollout_id", sa.String(length=64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("rollout_claims") as table:
        table.drop_column("resume_rollout_id")
