"""archive_permits: the one deletion artstore makes, `artstore archive`

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-04 23:00:00.000000

`artstore archive RUN` removes a run's events and the blobs nothing else names from the
database, once the archive holding them was written and read back. The triggers that
refuse every DELETE on `events` and `blobs` let a DELETE through while a row of
`archive_permits` exists, and only the archive's transaction writes one: it inserts the
row, deletes, removes the row and commits, so no committed state ever holds a permit.
UPDATE, TRUNCATE and SQLite's REPLACE stay refused to everyone. On PostgreSQL the reader
role of `artstore sql` has no privilege on the table (nor on `events` and `blobs` beyond
what 0003 gave it: nothing), so it can neither take a permit nor delete.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0016"
down_revision: str | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

APPEND_ONLY_TABLES = ("events", "blobs")

_REFUSE_CHANGE = """
CREATE OR REPLACE FUNCTION artstore_refuse_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    {permit}RAISE EXCEPTION 'artstore: % are immutable, % refused', TG_TABLE_NAME, TG_OP
        USING ERRCODE = 'integrity_constraint_violation';
END $$
"""
_PERMIT = (
    "IF TG_OP = 'DELETE' AND EXISTS (SELECT 1 FROM archive_permits) THEN\n"
    "        RETURN OLD;\n"
    "    END IF;\n    "
)


def upgrade() -> None:
    op.create_table(
        "archive_permits",
        sa.Column("run", sa.String(length=200), nullable=False),
        sa.PrimaryKeyConstraint("run", name=op.f("pk_archive_permits")),
    )
    if op.get_bind().dialect.name == "postgresql":
        op.execute("REVOKE ALL ON archive_permits FROM PUBLIC")
        op.execute(_REFUSE_CHANGE.format(permit=_PERMIT))
    else:
        _sqlite_delete_triggers("WHEN NOT EXISTS (SELECT 1 FROM archive_permits) ")


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(_REFUSE_CHANGE.format(permit=""))
    else:
        _sqlite_delete_triggers("")
    op.drop_table("archive_permits")


def _sqlite_delete_triggers(condition: str) -> None:
    for table in APPEND_ONLY_TABLES:
        op.execute(f"DROP TRIGGER IF EXISTS {table}_refuse_delete")
        op.execute(
            f"CREATE TRIGGER {table}_refuse_delete BEFORE DELETE ON {table} {condition}"
            f"BEGIN SELECT RAISE(ABORT, 'artstore: {table} are immutable, "
            "DELETE refused'); END"
        )
