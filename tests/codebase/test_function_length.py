"""No function of artstore, its benchmarks (tools/) or its examples is longer than a
newcomer reads in one go: 80 lines at most.

A longer one is split into named steps. Counted from `def` to the last line, docstring and
nested functions included. Alembic revisions are left out: a revision keeps the code it
was written with (migrations/versions/, never edited once released).
"""

from __future__ import annotations

import ast
from pathlib import Path

import artstore

LONGEST = 80
PACKAGE = Path(artstore.__file__).parent
REPOSITORY = Path(__file__).resolve().parents[2]


def _functions(path: Path) -> list[tuple[str, int, int]]:
    """(name, first line, lines) of each function and method in the module at `path`."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    return [
        (node.name, node.lineno, node.end_lineno - node.lineno + 1)
        for node in ast.walk(tree)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
    ]


def _modules() -> list[Path]:
    # rglob does not enter artstore/migrations (a link to ../migrations): the revisions.
    scripts = [*(REPOSITORY / "tools").rglob("*.py"), *(REPOSITORY / "examples").rglob("*.py")]
    return sorted(PACKAGE.rglob("*.py")) + sorted(scripts)


def test_no_function_is_longer_than_80_lines() -> None:
    too_long = [
        f"{path}:{line} {name} ({lines} lines)"
        for path in _modules()
        for name, line, lines in _functions(path)
        if lines > LONGEST
    ]
    assert too_long == [], "split these into named steps:\n" + "\n".join(too_long)


def test_the_check_reads_every_module_and_counts_a_long_function(tmp_path: Path) -> None:
    modules = _modules()
    assert PACKAGE / "store.py" in modules and PACKAGE / "cli" / "app.py" in modules
    assert REPOSITORY / "tools" / "bench_queries.py" in modules
    assert REPOSITORY / "examples" / "langgraph_agent.py" in modules
    body = "".join(f"    x{i} = {i}\n" for i in range(LONGEST))
    (tmp_path / "long.py").write_text(f"def long():\n{body}\n\ndef short():\n    return 1\n")
    assert _functions(tmp_path / "long.py") == [("long", 1, LONGEST + 1), ("short", 84, 2)]
