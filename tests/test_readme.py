"""Every fenced block of README.md runs as pasted, in order, in one fresh directory.

A reader who pastes the blocks from top to bottom gets what the README says: shell blocks
run in bash, Python blocks are whole scripts run with `python`, SQL blocks run through
`artstore sql`. On SQLite the blocks use the default store (`.artstore/artstore.db` in the
directory); on PostgreSQL `ARTSTORE_URL` points them at a fresh database of the test.

Left out: the first block (it installs artstore and runs this very suite), lines that start
`artstore ui` (a server that runs until stopped; tests/test_viewer.py and
tests/test_cli_inspect.py test it), and, on ART before 0.5.20, the PipelineTrainer block
(ART has no PipelineTrainer there; the README says so). Which blocks run is decided
inside the test, so the PostgreSQL half runs on every ART.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from artstore.art_versions import has_pipeline_trainer

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
INSTALL_AND_TEST = 'python -m pip install -e ".[dev]"\npython -m pytest\n'
PIPELINE_TRAINER = "artstore.pipeline_trainer("


@dataclass(frozen=True)
class Block:
    language: str
    code: str
    line: int  # the README line of its opening fence

    @property
    def name(self) -> str:
        return f"README.md:{self.line} ({self.language})"


def readme_blocks() -> list[Block]:
    """The fenced blocks of the README, in order."""
    text = README.read_text()
    return [
        Block(m.group(1), m.group(2), text.count("\n", 0, m.start()) + 1)
        for m in re.finditer(r"^```(\w*)\n(.*?)^```$", text, re.S | re.M)
    ]


def blocks_to_run(blocks: list[Block], *, pipeline_trainer: bool) -> list[Block]:
    """All blocks but the install-and-test one, and the PipelineTrainer's where ART lacks it."""
    return [b for b in blocks[1:] if pipeline_trainer or PIPELINE_TRAINER not in b.code]


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
        script = workdir / f"readme_{block.line}.py"
        script.write_text(block.code)
        command = [sys.executable, script.name]
    elif block.language == "sql":
        query = workdir / f"readme_{block.line}.sql"
        query.write_text(block.code)
        command = ["artstore", "sql", "--format", "json", "--file", query.name]
    else:
        raise AssertionError(f"{block.name}: no way to run a {block.language!r} block")
    return subprocess.run(
        command, cwd=workdir, env=env, capture_output=True, text=True, timeout=540, check=False
    )


def output_of(results: dict[Block, subprocess.CompletedProcess], marker: str) -> str:
    """stdout and stderr of the one block that contains `marker`."""
    (found,) = [r for b, r in results.items() if marker in b.code]
    return found.stdout + found.stderr


def test_the_first_block_installs_and_tests():
    first = readme_blocks()[0]
    assert (first.language, first.code, first.line) == ("bash", INSTALL_AND_TEST, 1)


def test_the_pipeline_trainer_block_is_left_out_only_where_art_lacks_it():
    blocks = readme_blocks()
    (pipeline,) = [b for b in blocks if PIPELINE_TRAINER in b.code]
    assert pipeline in blocks_to_run(blocks, pipeline_trainer=True)
    assert pipeline not in blocks_to_run(blocks, pipeline_trainer=False)
    assert len(blocks_to_run(blocks, pipeline_trainer=False)) == len(blocks) - 2


@pytest.mark.slow
def test_every_block_runs_as_pasted_in_order(database_url, tmp_path):
    blocks = blocks_to_run(readme_blocks(), pipeline_trainer=has_pipeline_trainer())
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
