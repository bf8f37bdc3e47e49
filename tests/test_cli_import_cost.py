"""`artstore --help` stays quick: importing the console script's module loads neither
SQLAlchemy, the event store, ART nor LangChain (each command imports what it needs)."""

from __future__ import annotations

import json
import subprocess
import sys

HEAVY = ["sqlalchemy", "art", "langchain_core", "artstore.eventstore", "artstore.store"]


def test_the_command_line_imports_nothing_heavy() -> None:
    script = (
        "import json, sys\n"
        "import artstore.cli  # what the console script imports\n"
        f"print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=120
    )
    assert json.loads(done.stdout) == []


def test_help_and_version_run() -> None:
    for flag in ["--help", "--version"]:
        done = subprocess.run(
            ["artstore", flag],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        assert "artstore" in done.stdout
