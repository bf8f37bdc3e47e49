"""Every code block of the documentation runs as pasted, in order, in one fresh directory.

The pages of docs/ run in the order of the site's navigation (mkdocs.yml), as a reader who
follows the site pastes them; the README's blocks are copies of the pages' (checked here),
so they run with them. Shell blocks run in bash, Python blocks are whole scripts run with
`python`, SQL blocks run through `artstore sql` (in the test's process). On SQLite the
blocks use the default store (`.artstore/artstore.db` in the directory); on PostgreSQL
`ARTSTORE_URL` points them at a fresh database of the test.

Left out: blocks marked `<!-- not run: REASON -->` on the line above their fence (they
install artstore and run this very suite, or need hosts of the reader's own), lines that
start `artstore ui` (a server that runs until stopped; tests/viewer/test_viewer.py and
tests/cli/test_cli_inspect.py test it), and, on ART before 0.5.20, the PipelineTrainer block
(ART has no PipelineTrainer there; the page says so). Which blocks run is decided inside
the test, so the PostgreSQL half runs on every ART.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from budget import LONG
from command_line import run_artstore

from artstore.art_versions import has_pipeline_trainer

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
CI = ROOT / ".ci" / "run"
INSTALL_AND_TEST = 'python -m pip install -e ".[dev]"\npython -m pytest\n'
PIPELINE_TRAINER = "artstore.pipeline_trainer("
LANGUAGES = {"bash", "python", "sql"}  # the blocks that run; `text`, `toml`... are shown only
# Names a reader would take for code that runs, which the runner would pass over.
LOOKALIKES = {"", "sh", "shell", "console", "zsh", "py", "python3", "pycon", "postgresql"}
FENCED = re.compile(r"(?:^<!-- not run: (.*?) -->\n)?^```(\w*)\n(.*?)^```$", re.S | re.M)


@dataclass(frozen=True)
class Block:
    page: str  # relative to the repository
    language: str
    code: str
    line: int  # the page's line of its opening fence
    not_run: str | None  # why it is not run, when it is not

    @property
    def name(self) -> str:
        return f"{self.page}:{self.line} ({self.language})"


def blocks_of(path: Path) -> list[Block]:
    """The fenced blocks of a page, in order."""
    text = path.read_text()
    page = str(path.relative_to(ROOT))
    return [
        Block(page, m.group(2), m.group(3), text.count("\n", 0, m.start(2)) + 1, m.group(1))
        for m in FENCED.finditer(text)
    ]


def site_pages() -> list[Path]:
    """The pages of docs/ in the order of the site's navigation."""

    def flatten(items) -> list[str]:
        found = []
        for item in items:
            value = next(iter(item.values())) if isinstance(item, dict) else item
            found += flatten(value) if isinstance(value, list) else [value]
        return found

    nav = yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"]
    return [DOCS / page for page in flatten(nav)]


def docs_blocks() -> list[Block]:
    return [block for page in site_pages() for block in blocks_of(page)]


def blocks_to_run(blocks: list[Block], *, pipeline_trainer: bool) -> list[Block]:
    """The blocks that run and are not marked, but the PipelineTrainer's where ART lacks it."""
    return [
        b
        for b in blocks
        if b.language in LANGUAGES
        and b.not_run is None
        and (pipeline_trainer or PIPELINE_TRAINER not in b.code)
    ]


def without_ui(code: str) -> str:
    """A shell block without its `artstore ui` commands (servers that run until stopped)."""
    return "".join(
        line
        for line in code.splitlines(keepends=True)
        if not line.lstrip().startswith("artstore ui")
    )


def environment(database_url: str) -> dict[str, str]:
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        "COLUMNS": "120",
    }
    env.pop("WANDB_API_KEY", None)
    env.pop("ARTSTORE_URL", None)
    if not database_url.startswith("sqlite"):
        env["ARTSTORE_URL"] = database_url  # the CLI's and open_store()'s default
    return env


def run_block(block: Block, workdir: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    if block.language == "bash":
        command = ["bash", "-e", "-o", "pipefail", "-c", without_ui(block.code)]
    elif block.language == "python":
        script = workdir / f"{Path(block.page).stem}_{block.line}.py"
        script.write_text(block.code)
        command = [sys.executable, script.name]
    elif block.language == "sql":
        return run_sql_block(block, workdir, env)
    else:
        raise AssertionError(f"{block.name}: no way to run a {block.language!r} block")
    return subprocess.run(
        command, cwd=workdir, env=env, capture_output=True, text=True, timeout=540, check=False
    )


def output_of(results: dict[Block, subprocess.CompletedProcess], marker: str) -> str:
    """stdout and stderr of the one block that contains `marker`."""
    (found,) = [r for b, r in results.items() if marker in b.code]
    return found.stdout + found.stderr


def test_the_readme_has_the_install_and_test_commands_right_under_its_title():
    text = README.read_text()
    first = blocks_of(README)[0]
    assert text.startswith("# artstore\n\n<!-- not run: ")
    assert (first.language, first.code, first.line) == ("bash", INSTALL_AND_TEST, 4)


def test_ci_runs_the_readme_install_and_test_commands():
    """.ci/run runs each command of the README's first block, adding only options of its own."""
    ci_lines = []
    for line in CI.read_text().splitlines():
        try:
            ci_lines.append(shlex.split(line, comments=True))
        except ValueError:  # a line of the Python it runs, or one that goes on below
            continue
    for command in INSTALL_AND_TEST.splitlines():
        words = shlex.split(command)
        found = [
            line
            for line in ci_lines
            if [w for w in line if not w.startswith("-") or w in words] == words
        ]
        assert found, f".ci/run does not run the README's {command!r}"


def test_every_block_of_the_readme_runs_as_a_block_of_a_page():
    in_pages = {(b.language, b.code, b.not_run is None) for b in docs_blocks()}
    for block in blocks_of(README):
        assert (block.language, block.code, block.not_run is None) in in_pages, block.name


def test_every_page_is_in_the_site_navigation():
    pages = {path.relative_to(DOCS) for path in DOCS.rglob("*.md")}
    assert pages == {path.relative_to(DOCS) for path in site_pages()}


def test_every_block_runs_or_says_why_not():
    for block in [*blocks_of(README), *docs_blocks()]:
        assert block.language not in LOOKALIKES, f"{block.name}: say bash, python or sql"
        if block.not_run is not None:
            assert block.language in LANGUAGES and block.not_run.strip(), block.name


def test_the_pipeline_trainer_block_is_left_out_only_where_art_lacks_it():
    blocks = docs_blocks()
    (pipeline,) = [b for b in blocks if PIPELINE_TRAINER in b.code]
    with_it = blocks_to_run(blocks, pipeline_trainer=True)
    assert pipeline in with_it
    assert blocks_to_run(blocks, pipeline_trainer=False) == [b for b in with_it if b != pipeline]


# As pasted, the blocks use the default store: SQLite, a reader's first run. The whole site
def run_sql_block(block: Block, workdir: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    """`artstore sql --file` on the block, in this process (the command's own code, less a
    new interpreter's start per block: the views page alone has a dozen blocks)."""
    query = workdir / f"{Path(block.page).stem}_{block.line}.sql"
    query.write_text(block.code)
    args = ["sql", "--format", "json", "--file", query.name]
    with contextlib.chdir(workdir):
        result = run_artstore(*args, env={"ARTSTORE_URL": env.get("ARTSTORE_URL")})
    return subprocess.CompletedProcess(args, result.exit_code, result.stdout, result.stderr)


# again on PostgreSQL is the long budget (ARTSTORE_LONG=1): it is the suite's longest test,
# and every command, script and view the pages show is tested on both databases elsewhere.
PAGES_DATABASES = ["sqlite", "postgresql"] if LONG else ["sqlite"]


@pytest.mark.slow
@pytest.mark.parametrize("database_url", PAGES_DATABASES, indirect=True)
def test_every_block_runs_as_pasted_in_order(database_url, tmp_path):
    blocks = blocks_to_run(docs_blocks(), pipeline_trainer=has_pipeline_trainer())
    env = environment(database_url)
    results: dict[Block, subprocess.CompletedProcess] = {}
    for block in blocks:
        result = run_block(block, tmp_path, env)
        assert result.returncode == 0, f"{block.name}\n{result.stdout}\n{result.stderr}"
        results[block] = result
    on_sqlite = database_url.startswith("sqlite")
    assert (tmp_path / ".artstore" / "artstore.db").exists() == on_sqlite

    # The tour: the demo's run, its first group (in every store), a replay's plan.
    tour = output_of(results, "artstore demo")
    assert "artstore ui" in next(b.code for b in results if "artstore demo" in b.code)
    assert re.search(r"^demo-1 +artstore-demo/demo-1 +finished +4 ", tour, re.M)
    assert "a205c658-0ddf-5a28-9aa2-0b783e1ad976" in tour
    assert "would train 8 groups in 4 steps" in tour

    # The scripts say what they did.
    trained = output_of(results, "artstore.TrainingFramework(store)")
    assert "run email/agent-001 finished: model email/agent-001 at step 2" in trained
    loop = output_of(results, "artstore.durable_rollouts(")
    assert [line for line in loop.splitlines() if line.startswith("step ")] == [
        f"step {n}: 2 groups trained" for n in (1, 2, 3)
    ]
    assert re.search(
        r"'Final answer: [^']+': \d+ tokens with logprobs", output_of(results, "store.rollout(")
    )
    if has_pipeline_trainer():
        assert "pipe-1 trained to step" in output_of(results, PIPELINE_TRAINER)

    # Re-scoring and the terminal views.
    assert "judge-v2" in output_of(results, "artstore rescore demo-1 --reward my_rewards:judge")
    chat = output_of(results, "artstore trajectory $(")
    assert "How many legs do" in chat and "assistant" in chat
    assert (tmp_path / "steps.csv").read_text().splitlines()[0] == "model,step,reward_mean"

    # Every SQL example returns rows on what the blocks before it recorded.
    for block, result in results.items():
        if block.language == "sql":
            assert json.loads(result.stdout), f"{block.name} returned no rows"

    # Export and import: ART reads the parquet, the copy holds the run.
    assert "2 groups" in output_of(results, "exported/trajectories/train/0001.parquet")
    copy = output_of(results, "--url sqlite:///copy.db")
    assert re.search(r"^demo-1 +artstore-demo/demo-1 +imported ", copy, re.M)

    listed = subprocess.run(
        ["artstore", "runs", "--format", "json"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    runs = {run["run"]: run["status"] for run in json.loads(listed.stdout)}
    expected = {
        "demo-1": "finished",
        "email/agent-001": "finished",
        "agent-001": "finished",
        "my-run": "recorded",
        "artstore-demo/demo-1": "imported",
        "demo-1-step-3": "imported",
    }
    if has_pipeline_trainer():
        expected["pipe-1"] = "finished"
    assert runs == expected
