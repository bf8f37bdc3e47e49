"""coordination of rollout workers: worker_runs, rollout_claims, group_claims

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01 08:30:00.000000

Workers on many hosts claim a run's rollouts and seals from these tables (leases with
fencing tokens; artstore/workers/claims.py). They are created on both databases, so that
one schema serves both, but only PostgreSQL uses them: SQLite serves one machine.

On PostgreSQL a trigger also announces every sealed group of a run on the run's channel
(`artstore_` + the first 16 hex digits of md5(run)), whichever process sealed it, so that
trainers wait on LISTEN instead of polling (artstore/workers/notify.py).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

JSON = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")

NOTIFY_SEALED = [
    """
CREATE FUNCTION artstore_notify_group_sealed() RETURNS trigger AS $$
BEGIN
    IF NEW.data->>'run' IS NOT NULL THEN
        PERFORM pg_notify('artstore_' || substr(md5(NEW.data->>'run'), 1, 16), 'sealed');
    END IF;
    RETURN NULL;
END
$$ LANGUAGE plpgsql
""",
    """
CREATE TRIGGER events_notify_group_sealed AFTER INSERT ON events
FOR EACH ROW WHEN (NEW.type = 'group.sealed')
EXECUTE FUNCTION artstore_notify_group_sealed()
""",
]


def upgrade() -> None:
    op.create_table(
        "worker_runs",
        sa.Column("run", sa.String(length=200), nullable=False),
        sa.Column("model", sa.String(length=200), nullable=False),
        sa.Column("trainer", sa.String(length=200), nullable=False),
        sa.Column("database_id", sa.String(length=200), nullable=False),
        sa.Column("status", sa.String(length=20), nullable=False),
        sa.Column("policy_step", sa.Integer(), nullable=False),
        sa.Column("next_batch", sa.Integer(), nullable=False),
        sa.Column("max_steps_off_policy", sa.Integer(), nullable=False),
        sa.Column("models", JSON, nullable=False),
        sa.Column("reward_function", sa.String(length=500), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("run", name=op.f("pk_worker_runs")),
    )
    op.create_table(
        "rollout_claims",
        sa.Column("group_id", sa.String(length=64), nullable=False),
        sa.Column("slot", sa.Integer(), nullable=False),
        sa.Column("run", sa.String(length=200), nullable=False),
        sa.Column("batch", sa.Integer(), nullable=False),
        sa.Column("role", sa.String(length=20), nullable=False),
        sa.Column("status", sa.String(length=20), nullable=False),
        sa.Column("token", sa.BigInteger(), nullable=False),
        sa.Column("worker", sa.String(length=200), nullable=True),
        sa.Column("rollout_id", sa.String(length=64), nullable=True),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("lease_expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("group_id", "slot", name=op.f("pk_rollout_claims")),
    )
    with op.batch_alter_table("rollout_claims", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_rollout_claims_run_status_batch"),
            ["run", "status", "batch"],
            unique=False,
        )
    op.create_table(
        "group_claims",
        sa.Column("group_id", sa.String(length=64), nullable=False),
        sa.Column("run", sa.String(length=200), nullable=False),
        sa.Column("epoch", sa.Integer(), nullable=False),
        sa.Column("batch", sa.Integer(), nullable=False),
        sa.Column("scenario_index", sa.Integer(), nullable=False),
        sa.Column("status", sa.String(length=20), nullable=False),
        sa.Column("token", sa.BigInteger(), nullable=False),
        sa.Column("worker", sa.String(length=200), nullable=True),
        sa.Column("lease_expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("group_id", name=op.f("pk_group_claims")),
    )
    with op.batch_alter_table("group_claims", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_group_claims_run_status_batch"),
            ["run", "status", "batch"],
            unique=False,
        )
    if op.get_context().dialect.name == "postgresql":
        for statement in NOTIFY_SEALED:
            op.execute(statement)


def downgrade() -> None:
    if op.get_context().dialect.name == "postgresql":
        op.execute("DROP TRIGGER IF EXISTS events_notify_group_sealed ON events")
        op.execute("DROP FUNCTION IF EXISTS artstore_notify_group_sealed()")
    with op.batch_alter_table("group_claims", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_group_claims_run_status_batch"))
    op.drop_table("group_claims")
    with op.batch_alter_table("rollout_claims", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_rollout_claims_run_status_batch"))
    op.drop_table("rollout_claims")
    op.drop_table("worker_runs")
