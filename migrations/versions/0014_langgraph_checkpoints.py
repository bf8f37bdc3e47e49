"""LangGraph checkpoints: the projection tables of `artstore.langgraph.checkpointer`

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-04 19:45:00.000000

Checkpoints and pending writes are events (`langgraph.checkpoint`, `langgraph.writes`,
`langgraph.thread_deleted`, in the stream `langgraph-<thread id>`); these three tables say
where each checkpoint, channel value and write of a thread is in the log, so that a read
is a few lookups by key. They are projections: emptied and filled again by a rebuild.
Nothing else changes.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _position() -> sa.types.TypeEngine:
    return sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "langgraph_checkpoints",
        sa.Column("thread_id", sa.Text(), nullable=False),
        sa.Column("checkpoint_ns", sa.Text(), nullable=False),
        sa.Column("checkpoint_id", sa.Text(), nullable=False),
        sa.Column("parent_checkpoint_id", sa.Text(), nullable=True),
        sa.Column("position", _position(), nullable=False),
        sa.PrimaryKeyConstraint(
            "thread_id", "checkpoint_ns", "checkpoint_id", name="pk_langgraph_checkpoints"
        ),
    )
    op.create_table(
        "langgraph_channel_values",
        sa.Column("thread_id", sa.Text(), nullable=False),
        sa.Column("checkpoint_ns", sa.Text(), nullable=False),
        sa.Column("channel", sa.Text(), nullable=False),
        sa.Column("version", sa.Text(), nullable=False),
        sa.Column("position", _position(), nullable=False),
        sa.PrimaryKeyConstraint(
            "thread_id", "checkpoint_ns", "channel", "version", name="pk_langgraph_channel_values"
        ),
    )
    op.create_table(
        "langgraph_writes",
        sa.Column("thread_id", sa.Text(), nullable=False),
        sa.Column("checkpoint_ns", sa.Text(), nullable=False),
        sa.Column("checkpoint_id", sa.Text(), nullable=False),
        sa.Column("task_id", sa.Text(), nullable=False),
        sa.Column("idx", sa.Integer(), nullable=False),
        sa.Column("position", _position(), nullable=False),
        sa.PrimaryKeyConstraint(
            "thread_id",
            "checkpoint_ns",
            "checkpoint_id",
            "task_id",
            "idx",
            name="pk_langgraph_writes",
        ),
    )


def downgrade() -> None:
    for table in ("langgraph_writes", "langgraph_channel_values", "langgraph_checkpoints"):
        op.drop_table(table)
