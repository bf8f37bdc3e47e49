"""SQL views for analysis (v_runs, v_rollouts, v_llm_calls, ...)

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30 09:00:00.000000

The views are declared once, in artstore/schema/views.py, and compiled here for the
database being migrated. README.md ("SQL views") documents their columns.
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

from artstore.schema import views

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    for statement in views.create_statements(op.get_context().dialect):
        op.execute(statement)


def downgrade() -> None:
    for statement in views.drop_statements():
        op.execute(statement)
