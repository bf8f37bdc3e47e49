"""`artstore --help` stays quick: importing the console script's module loads neither
SQLAlchemy, the event store, ART nor LangChain (each command imports what it needs); and a
command that reads a store (`artstore runs`) loads neither ART nor the training loop."""

from __future__ import annotations

import json
import subprocess
import sys

HEAVY = ["sqlalchemy", "art", "litellm", "langchain_core", "artstore.eventstore", "artstore.store"]
# What reading a run list does not need: ART, and the loop that records (capture, LangChain).
NOT_FOR_READING = [
    "art",
    "litellm",
    "langchain_core",
    "artstore.capture",
    "artstore.training.framework",
]


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


def test_listing_runs_imports_neither_art_nor_the_training_loop(recorded_url: str) -> None:
    script = (
        "import json, sys\n"
        "from artstore.cli import main\n"
        f"sys.argv = ['artstore', 'runs', '--url', {recorded_url!r}, '--format', 'json']\n"
        "try:\n"
        "    main()\n"
        "except SystemExit as exit:\n"
        "    assert not exit.code, exit.code\n"
        f"print(json.dumps([m for m in {NOT_FOR_READING!r} if m in sys.modules]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=120
    )
    *listed, loaded = done.stdout.strip().splitlines()
    assert [row["run"] for row in json.loads("\n".join(listed))] == ["arith-001"]
    assert json.loads(loaded) == []


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


COMMANDS = [
    [],
    *[[name] for name in ("replay", "rescore", "runs", "show", "group", "trajectory", "ui")],
    *[[name] for name in ("sql", "export", "import", "worker", "demo", "db")],
    ["db", "upgrade"],
    ["db", "current"],
    ["db", "rebuild-projections"],
]


def test_help_at_80_columns_shows_flags_as_flags_and_cuts_no_word() -> None:
    from typer.testing import CliRunner

    from artstore.cli import app

    for command in COMMANDS:
        shown = CliRunner().invoke(app, [*command, "--help"], env={"COLUMNS": "80"})
        assert shown.exit_code == 0, (command, shown.output)
        assert "--help" in shown.stdout
        assert "<bool>" not in shown.stdout, (command, shown.stdout)  # a flag takes no value
        assert "…" not in shown.stdout, (command, shown.stdout)  # nothing cut off
        assert max(len(line) for line in shown.stdout.splitlines()) <= 80, shown.stdout
    replay = CliRunner().invoke(app, ["replay", "--help"], env={"COLUMNS": "80"}).stdout
    dry_run = next(line for line in replay.splitlines() if "--dry-run " in line)
    assert dry_run.split("--dry-run", 1)[1].split()[0] == "Print"  # its help, no type between
