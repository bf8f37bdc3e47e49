"""The PostgreSQL role `artstore_reader`, as whom `artstore sql` and the viewer run a user's
query: it reads the views, and runs only the functions of an allow-list.

Why an allow-list of functions: some built-in functions run SQL given as text (`ts_stat`,
`ts_rewrite`, `query_to_xml`, `table_to_xml`...), take the advisory locks that trainers
and concurrent appends hold (`pg_advisory_lock`), or change the session (`set_config`).
A query that reached them could stop a trainer, hold readers below a position, or leave
the role. Checking the query's text for their names would be a deny-list that the next
function, or a function calling another, gets around; privileges are checked by the
database at every call, however it is reached.

How: PostgreSQL grants EXECUTE on every function to PUBLIC, of which every role is a
member, and no role can be denied what PUBLIC holds. So the reader is confined by taking
EXECUTE from PUBLIC on every function it could reach that is not allowed, in this
database (function privileges are per database), and giving it back, by name, to the
store's own users: the database's owner and the user who confines (a superuser needs no
grant). Other roles that use this database lose those functions too, which is why the
allow-list is generous with what only computes: see `allowed_function`.

Only a function's owner may change its grants, and the built-in ones belong to the
bootstrap superuser: a store whose user is not a superuser cannot confine the reader.
`artstore sql` then refuses to run (`unconfined_function`) rather than run unconfined,
and says to run `artstore db upgrade` once as a superuser. Migration 0013 confines the
reader; `artstore db upgrade` confines it again (after `CREATE EXTENSION`, say).
"""

from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.engine import Connection

READER_ROLE = "artstore_reader"

# Functions that are not immutable but only compute (time, randomness, formatting,
# JSON building, full-text search, sizes), allowed by name in pg_catalog and
# information_schema. None reads a table, runs SQL given as text or takes a lock.
ALLOWED_NAMES = (
    # time
    "now",
    "clock_timestamp",
    "statement_timestamp",
    "transaction_timestamp",
    "timeofday",
    "age",
    "date_part",
    "extract",
    "date_trunc",
    "timezone",
    "make_timestamptz",
    "to_char",
    "to_date",
    "to_timestamp",
    "to_number",
    "generate_series",
    "overlaps",
    "pg_sleep",
    "pg_sleep_for",
    "pg_sleep_until",
    # values
    "random",
    "format",
    "concat",
    "concat_ws",
    "array_to_string",
    "pg_typeof",
    "pg_column_size",
    # JSON
    "to_json",
    "to_jsonb",
    "row_to_json",
    "array_to_json",
    "json_build_object",
    "json_build_array",
    "jsonb_build_object",
    "jsonb_build_array",
    "json_to_record",
    "json_to_recordset",
    "jsonb_to_record",
    "jsonb_to_recordset",
    "jsonb_path_exists_tz",
    "jsonb_path_match_tz",
    "jsonb_path_query_tz",
    "jsonb_path_query_array_tz",
    "jsonb_path_query_first_tz",
    # full-text search (ts_stat and the text form of ts_rewrite run SQL: not named)
    "to_tsvector",
    "to_tsquery",
    "plainto_tsquery",
    "phraseto_tsquery",
    "websearch_to_tsquery",
    "ts_headline",
    # information_schema's views call it (the reader's and every other role's)
    "_pg_index_position",
)

# Whether the function `p` (a row of pg_proc) is allowed: built in, and immutable (by
# PostgreSQL's own contract it reads no table and changes nothing), an aggregate or
# window function, the function of an operator or a cast, or named above.
ALLOWED_FUNCTION = """(
    p.pronamespace IN ('pg_catalog'::regnamespace, 'information_schema'::regnamespace)
    AND p.prokind IN ('f', 'a', 'w')
    AND (
        p.provolatile = 'i'
        OR p.prokind IN ('a', 'w')
        OR EXISTS (SELECT FROM pg_catalog.pg_operator o WHERE o.oprcode = p.oid)
        OR EXISTS (SELECT FROM pg_catalog.pg_cast c WHERE c.castfunc = p.oid)
        OR p.proname = ANY (CAST(:allowed AS name[]))
    )
)"""

# Functions the reader could run (its schemas, its privileges) that are not allowed.
_REACHABLE_NOT_ALLOWED = f"""
    SELECT p.oid::regprocedure::text AS signature, pg_has_role(p.proowner, 'USAGE') AS owned
    FROM pg_catalog.pg_proc p
    WHERE NOT {ALLOWED_FUNCTION}
      AND has_schema_privilege(:reader, p.pronamespace, 'USAGE')
      AND has_function_privilege(:reader, p.oid, 'EXECUTE')
    ORDER BY p.oid
"""


def _parameters() -> dict[str, object]:
    return {"reader": READER_ROLE, "allowed": list(ALLOWED_NAMES)}


def reader_exists(connection: Connection) -> bool:
    found = connection.execute(text("SELECT to_regrole(:r) IS NOT NULL"), {"r": READER_ROLE})
    return bool(found.scalar())


def confine(connection: Connection) -> list[str]:
    """Take EXECUTE from PUBLIC (and the reader) on every function the reader could run
    that is not allowed and that this user may change; give it to the store's users.
    Returns the functions still open to the reader (those of other owners, when this
    user is not a superuser): empty when the reader is confined."""
    if not reader_exists(connection):
        return []
    superuser, owner = connection.execute(
        text(
            "SELECT rolsuper, pg_get_userbyid((SELECT datdba FROM pg_database "
            "WHERE datname = current_database())) FROM pg_roles WHERE rolname = current_user"
        )
    ).one()
    found = connection.execute(text(_REACHABLE_NOT_ALLOWED), _parameters()).all()
    mine = [signature for signature, owned in found if superuser or owned]
    if mine:
        functions = ", ".join(mine)
        connection.execute(
            text(f"REVOKE EXECUTE ON FUNCTION {functions} FROM PUBLIC, {READER_ROLE}")
        )
        keepers = _keepers(connection, owner)
        if keepers:
            connection.execute(text(f"GRANT EXECUTE ON FUNCTION {functions} TO {keepers}"))
    return [
        signature
        for signature, _ in connection.execute(text(_REACHABLE_NOT_ALLOWED), _parameters())
    ]


def _keepers(connection: Connection, owner: str) -> str:
    """The store's users who need a grant of their own: the database's owner and this
    user, unless superusers (who need none); as a GRANT's list of role names."""
    names = connection.execute(
        text(
            "SELECT DISTINCT quote_ident(rolname) FROM pg_roles "
            "WHERE rolname IN (current_user, :owner) AND NOT rolsuper"
        ),
        {"owner": owner},
    ).scalars()
    return ", ".join(names)


# One function the reader could run that is not allowed, if any (the role must exist).
FIRST_UNCONFINED = text(_REACHABLE_NOT_ALLOWED + " LIMIT 1")


def first_unconfined_parameters() -> dict[str, object]:
    return _parameters()


UNCONFINED_HINT = (
    "run `artstore db upgrade` once as a PostgreSQL superuser: it takes EXECUTE on them "
    "from PUBLIC and gives it back to the store's users (docs/guarantees.md)"
)
