"""The README's five-minute tour runs as written, in order (in this process, as the shell
would split it), and its terminal-view snippet in a shell. `artstore ui`, which serves
until stopped, is tested in test_cli_inspect.py."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

from trained_run import cli

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"


def bash_blocks(section: str) -> list[str]:
    """The ```bash blocks of a README section (up to its next heading of any level)."""
    text = README.read_text()
    start = text.index(section) + len(section)
    following = re.search(r"\n#+ ", text[start:])
    body = text[start : start + following.start()] if following else text[start:]
    return re.findall(r"```bash\n(.*?)```", body, re.S)


def commands(block: str) -> list[str]:
    """The block's commands: continuation lines joined, comments and `artstore ui` left out."""
    joined = block.replace("\\\n", " ")
    found = []
    for line in joined.splitlines():
        line = re.sub(r"\s+#.*$", "", line).strip()
        if line and not line.startswith("#") and not line.startswith("artstore ui"):
            found.append(line)
    return found


def shell(command: str, cwd: Path) -> subprocess.CompletedProcess:
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    env = {
        **os.environ,
        "PYTHONPATH": path,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "COLUMNS": "120",
    }
    env.pop("ARTSTORE_URL", None)
    return subprocess.run(
        ["bash", "-c", command], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )


def test_the_tour_and_the_terminal_views_run_as_written(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("ARTSTORE_URL", raising=False)
    (tour,) = bash_blocks("## A five-minute tour")
    steps = commands(tour)
    assert steps[0] == "artstore demo" and len(steps) == 8
    assert "artstore ui" in tour  # the last step, left to the viewer's own tests

    results = []
    for step in steps:
        words = shlex.split(step)
        assert words[0] == "artstore"
        results.append(cli(*words[1:], columns=120))
    for step, result in zip(steps, results, strict=True):
        assert result.exit_code == 0, (step, result.output)
    group, dry_run = results[3], results[6]
    assert "a205c658-0ddf-5a28-9aa2-0b783e1ad976" in group.stdout
    assert "would train 8 groups in 4 steps" in dry_run.stdout  # a dry run with a plan

    (views,) = [b for b in bash_blocks("## Looking at runs") if "artstore trajectory" in b]
    chat = shell(views, tmp_path)
    assert chat.returncode == 0, chat.stderr
    assert "How many legs do" in chat.stdout and "assistant" in chat.stdout
