"""Every difference between the databases lives in one module per database.

Only `artstore/eventstore/sqlite.py` and `artstore/eventstore/postgres.py` (and the
migrations, which Alembic runs per database) may say which database they run on; the rest
asks its database or its connection's recorder (`artstore.eventstore.recorder`). Read with
`ast`, so that comments and docstrings may name the databases freely.
"""

from __future__ import annotations

import ast
from pathlib import Path

import artstore

PACKAGE = Path(artstore.__file__).parent
NAMES = ("sqlite", "postgresql", "postgres")
# Where naming a database is the job.
ALLOWED = {
    "eventstore/sqlite.py": "SQLite's module",
    "eventstore/postgres.py": "PostgreSQL's module",
    "migrations/": "Alembic runs each migration on one database, per dialect",
    # The registry: SQLAlchemy's name for a database -> artstore's module for it.
    "eventstore/database.py": "the registry of databases (DATABASES), `connect`, and "
    "`recorder_of(connection)`: the registry's lookup by name",
    # A URL a person wrote names its database by its scheme, before any database exists.
    "urls.py": "parses URL schemes into SQLAlchemy's async drivers",
}


def _names_a_database(value: object) -> bool:
    return isinstance(value, str) and value.lower().startswith(NAMES)


def _is_dialect(node: ast.AST) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr == "dialect") or (
        isinstance(node, ast.Name) and node.id == "dialect"
    )


def naming_of_databases(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, what) for each place `tree` says which database it runs on."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr == "name" and _is_dialect(node.value):
            found.append((node.lineno, "reads dialect.name"))
        elif isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            operands += [
                e for o in operands if isinstance(o, (ast.Tuple, ast.List, ast.Set)) for e in o.elts
            ]
            if any(_is_dialect(o) for o in operands) or any(
                isinstance(o, ast.Constant) and _names_a_database(o.value) for o in operands
            ):
                found.append((node.lineno, "compares with a database's name"))
        elif isinstance(node, ast.Dict) and any(
            isinstance(key, ast.Constant) and _names_a_database(key.value) for key in node.keys
        ):
            found.append((node.lineno, "a table keyed by database names"))
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("startswith", "endswith")
            and any(isinstance(a, ast.Constant) and _names_a_database(a.value) for a in node.args)
        ):
            found.append((node.lineno, "tests a string for a database's name"))
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
            "sqlalchemy.dialects"
        ):
            found.append((node.lineno, f"imports {node.module}"))
        elif isinstance(node, ast.Import) and any(
            alias.name.startswith("sqlalchemy.dialects") for alias in node.names
        ):
            found.append((node.lineno, "imports sqlalchemy.dialects"))
    return sorted(found)


def test_only_the_database_modules_name_a_database():
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE).as_posix()
        if any(relative.startswith(allowed) for allowed in ALLOWED):
            continue
        for line, what in naming_of_databases(ast.parse(path.read_text(), relative)):
            offenders.append(f"artstore/{relative}:{line}: {what}")
    assert offenders == []


def test_the_check_sees_each_way_of_naming_a_database():
    source = """
if connection.dialect.name == "postgresql": pass
if database.dialect != "x": pass
INSERTS = {"sqlite": 1}
if url.startswith("postgres"): pass
from sqlalchemy.dialects.postgresql import insert
if backend in ("x", "sqlite"): pass
"""
    assert [line for line, _ in naming_of_databases(ast.parse(source))] == [2, 2, 3, 4, 5, 6, 7]


def test_the_database_modules_themselves_are_seen_naming_their_database():
    # The allowance is needed: without it the check would find them (it is not vacuous).
    for module in ("eventstore/sqlite.py", "eventstore/postgres.py"):
        assert naming_of_databases(ast.parse((PACKAGE / module).read_text()))
