"""PostgreSQL: the reader role runs only the functions of an allow-list

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-02 09:00:00.000000

`artstore_reader` (0003) could run every function PUBLIC may run: those that run SQL
given as text (`ts_stat`, `ts_rewrite`, `query_to_xml`, `table_to_xml`...) and those that
take the advisory locks trainers and concurrent appends hold. This revision takes EXECUTE
on every function the reader could reach and that is not on the allow-list of
artstore/eventstore/reader_role.py from PUBLIC (and the reader), and gives it back to the
database's owner and the migrating user. Only a superuser may change the grants of the
built-in functions: migrated by another user, the store works, and `artstore sql` refuses
to run until a superuser runs `artstore db upgrade` (which confines the reader again,
whatever the revision). SQLite is unchanged (its authorizer and read-only file).

Downgrading leaves the reader confined: a superuser gives a function back to PUBLIC with
`GRANT EXECUTE ON FUNCTION ... TO PUBLIC` where some other role needs it.
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

from artstore.eventstore import reader_role

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    if op.get_context().dialect.name == "postgresql":
        reader_role.confine(op.get_bind())


def downgrade() -> None:
    pass
