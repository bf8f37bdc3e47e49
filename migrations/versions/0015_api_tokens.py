"""api_tokens: the hashed tokens of `artstore serve`

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-04 19:45:00.000000

`artstore serve` admits a client by a token it was shown once: a run token (`artstore
token create --run R --scope read|write`) or the token minted when a rollout starts,
which names the rollout in its agent's base URL and dies when the rollout ends. Only the
SHA-256 of each token is kept, here and never in an event. A rollout token's row also
holds the lease of the server process serving its rollout (`lease_expires_at`): a server
killed outright leaves its rollouts to be recorded as abandoned once the lease expires. The reader role of
`artstore sql` is not given this table (revision 0003 grants it the views alone).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "api_tokens",
        sa.Column("token_hash", sa.String(length=64), nullable=False),
        sa.Column("kind", sa.String(length=20), nullable=False),
        sa.Column("scope", sa.String(length=20), nullable=False),
        sa.Column("run", sa.String(length=200), nullable=False),
        sa.Column("rollout_id", sa.String(length=64), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("ended_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("lease_expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("token_hash", name=op.f("pk_api_tokens")),
    )
    op.create_index(op.f("ix_api_tokens_rollout_id"), "api_tokens", ["rollout_id"], unique=False)


def downgrade() -> None:
    op.drop_index(op.f("ix_api_tokens_rollout_id"), table_name="api_tokens")
    op.drop_table("api_tokens")
