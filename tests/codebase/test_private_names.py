"""No module of artstore imports another module's private name (`_name`).

What two modules share is public in the module that owns it, or moved below both; the
layers themselves are checked by `lint-imports` (pyproject.toml, `[tool.importlinter]`).
"""

from __future__ import annotations

import ast
from pathlib import Path

import artstore

PACKAGE = Path(artstore.__file__).parent


def private_imports(source: str) -> list[tuple[int, str]]:
    """(line, "module: name") of each private name `source` imports from artstore."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.ImportFrom):
            continue
        module = node.module or ""
        if node.level == 0 and not module.startswith("artstore"):
            continue
        found += [
            (node.lineno, f"{'.' * node.level}{module}: {alias.name}")
            for alias in node.names
            if alias.name.startswith("_") and not alias.name.startswith("__")
        ]
    return found


def test_no_module_imports_a_private_name_of_another() -> None:
    found = [
        f"{path.relative_to(PACKAGE.parent)}:{line} imports {what}"
        for path in sorted(PACKAGE.rglob("*.py"))
        for line, what in private_imports(path.read_text(encoding="utf-8"))
    ]
    assert found == [], "\n".join(found)


def test_the_check_finds_a_private_import() -> None:
    source = (
        "from artstore.training.framework import _Place, Public\n"
        "from .sibling import _helper\n"
        "from os import _exit\n"
        "from artstore import __version__\n"
    )
    assert private_imports(source) == [
        (1, "artstore.training.framework: _Place"),
        (2, ".sibling: _helper"),
    ]
