"""`artstore demo`: a whole training run offline, twice in a row, then what it suggests."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import time

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import pytest
from trained_run import cli


@pytest.fixture(autouse=True)
def in_tmp(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("ARTSTORE_URL", raising=False)


def suggested_commands(output: str) -> list[list[str]]:
    """The `artstore ...` lines the demo prints under "Try next:"."""
    hints = output.split("Try next:", 1)[1]
    return [shlex.split(line)[1:] for line in hints.splitlines() if line.startswith("  artstore ")]


def test_demo_runs_twice_on_the_default_sqlite_store_and_its_suggestions_work(tmp_path):
    first = subprocess.run(
        ["artstore", "demo"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COLUMNS": "200"},
    )
    second = cli("demo")

    assert first.returncode == 0, first.stderr
    assert "Recorded run demo-1" in first.stdout
    assert second.exit_code == 0, second.output
    assert "Recorded run demo-2" in second.stdout  # a new run each time
    assert (tmp_path / ".artstore" / "artstore.db").is_file()
    assert (tmp_path / ".art" / "artstore-demo" / "models" / "demo-2" / "checkpoints").is_dir()

    runs = {run["run"]: run for run in json.loads(cli("runs", "--format", "json").stdout)}
    assert set(runs) == {"demo-1", "demo-2"}
    for run in runs.values():
        assert run["status"] == "finished" and run["steps"] == 4
        assert run["groups_sealed"] == run["groups_consumed"] == 8
        assert run["rollouts_finished"] == 32 and run["rollouts_failed"] == 0

    # It says plainly that nothing learns here.
    assert "updates no weights: the policy does not learn" in " ".join(second.stdout.split())
    assert "artstore ui" in second.stdout.split("Try next:", 1)[1]

    # Every command it suggests works, in order: show, rescore, dry run, replay, sql.
    commands = suggested_commands(second.stdout)
    assert [c[0] for c in commands] == ["runs", "show", "rescore", "replay", "replay", "sql"]
    results = [cli(*command) for command in commands]
    for command, result in zip(commands, results, strict=True):
        assert result.exit_code == 0, (command, result.output)
    dry_run, replayed, query = results[3], results[4], results[5]
    # The dry run has something to show: the second model has trained on nothing yet.
    assert "--dry-run" in commands[3]
    assert "demo-2-strict (at step 0), scorer 'strict': would train 8 groups in 4 steps" in (
        dry_run.stdout
    )
    assert dry_run.stdout.count("planned") == 8
    assert "artstore-demo/demo-2-strict is at step 4 (trained 4 steps on 8 groups)" in (
        replayed.stdout
    )
    assert "strict" in query.stdout and "reward" in query.stdout


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
def test_demo_on_postgresql(database_url, tmp_path):
    result = cli("demo", "--url", database_url, "--workdir", tmp_path / "work")
    shown = cli("show", "demo-1", "--section", "steps", "--format", "json", "--url", database_url)

    assert result.exit_code == 0, result.output
    assert "Recorded run demo-1" in result.stdout
    assert f"--url {database_url}" in result.stdout
    assert (tmp_path / "work" / ".art" / "artstore-demo" / "models" / "demo-1").is_dir()
    assert not (tmp_path / ".artstore").exists()  # nothing written to the default store
    steps = json.loads(shown.stdout)
    assert [(s["step_before"], s["step"], s["status"]) for s in steps] == [
        (0, 1, "completed"),
        (1, 2, "completed"),
        (2, 3, "completed"),
        (3, 4, "completed"),
    ]


def train_steps_recorded(url: str) -> int:
    shown = cli("show", "demo-1", "--section", "steps", "--format", "json", "--url", url)
    return len(json.loads(shown.stdout)) if shown.exit_code == 0 else 0


@pytest.mark.slow
def test_an_interrupted_demo_is_resumed_without_training_a_group_twice(database_url, tmp_path):
    artstore_command = ["artstore", "demo", "--url", database_url]
    workdir = ["--workdir", str(tmp_path / "work")]
    demo = subprocess.Popen(
        [*artstore_command, *workdir], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        deadline = time.monotonic() + 300
        while train_steps_recorded(database_url) < 1 and demo.poll() is None:
            assert time.monotonic() < deadline, "the demo trained no step in 5 minutes"
            time.sleep(0.2)
        demo.send_signal(signal.SIGINT)  # Ctrl-C, after its first step
        _, stderr = demo.communicate(timeout=120)
    finally:
        demo.kill()
    assert demo.returncode == 130, stderr
    assert "`artstore demo --resume demo-1` resumes it where it stopped" in stderr

    resumed = subprocess.run(
        [*artstore_command, *workdir, "--resume", "demo-1"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming demo run demo-1" in resumed.stderr
    assert "Recorded run demo-1" in resumed.stdout
    shown = cli("show", "demo-1", "--section", "steps", "--format", "json", "--url", database_url)
    steps = json.loads(shown.stdout)
    # Every step once, in order, however far the first process got.
    assert [(s["step_before"], s["step"], s["status"]) for s in steps] == [
        (0, 1, "completed"),
        (1, 2, "completed"),
        (2, 3, "completed"),
        (3, 4, "completed"),
    ]
    runs = cli("runs", "--format", "json", "--url", database_url)
    assert [(r["run"], r["status"]) for r in json.loads(runs.stdout)] == [("demo-1", "finished")]
    groups = cli(
        "sql",
        "--url",
        database_url,
        "--format",
        "json",
        "SELECT group_id, batch, num_consumptions FROM v_groups ORDER BY batch, group_id",
    )
    assert groups.exit_code == 0, groups.output
    sealed = json.loads(groups.stdout)
    # 2 epochs x 4 questions: each group trained exactly once, in the step of its batch.
    assert len(sealed) == len({g["group_id"] for g in sealed}) == 8
    assert [g["num_consumptions"] for g in sealed] == [1] * 8

    unknown = cli("demo", "--url", database_url, "--resume", "demo-9")
    assert unknown.exit_code == 1
    assert "no demo run 'demo-9'" in unknown.stderr


def test_resuming_a_finished_demo_says_so_and_shows_whose_steps_are_whose(database_url):
    assert cli("demo", "--url", database_url).exit_code == 0
    rescored = cli(
        "rescore", "demo-1", "--reward", "artstore.demo:strict_reward", "--scorer", "strict",
        "--url", database_url,
    )  # fmt: skip
    assert rescored.exit_code == 0, rescored.output
    replayed = cli(
        "replay", "demo-1", "--scorer", "strict", "--model", "demo-1-strict",
        "--backend", "artstore.backends:check_only_backend", "--url", database_url,
    )  # fmt: skip
    assert replayed.exit_code == 0, replayed.output
    counts = "SELECT count(*) AS n FROM v_rollouts UNION ALL SELECT count(*) FROM v_train_steps"
    before = cli("sql", "--url", database_url, "--format", "csv", counts).stdout

    resumed = cli("demo", "--url", database_url, "--resume", "demo-1")

    assert resumed.exit_code == 0, resumed.output
    assert "resuming" not in resumed.stderr
    assert "demo run demo-1 is already finished (4 train steps completed): nothing to resume" in (
        resumed.stderr
    )
    assert cli("sql", "--url", database_url, "--format", "csv", counts).stdout == before
    # The table names the model of each step: the run's own, then the replayed one.
    table = resumed.stdout.split("train steps of demo-1", 1)[1].split("\n\n", 1)[0]
    rows = [line.split() for line in table.strip().splitlines()]
    assert rows[0][:2] == ["model", "step"]
    assert [(row[0], row[1]) for row in rows[1:]] == [
        *(("artstore-demo/demo-1", str(step)) for step in range(1, 5)),
        *(("artstore-demo/demo-1-strict", str(step)) for step in range(1, 5)),
    ]


def test_the_suggestions_name_the_store_only_where_artstore_url_does_not(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A store given by $ARTSTORE_URL is found by the suggested commands as it was by the
    demo; one given by --url is named in each (a password never: the variable instead)."""
    from types import SimpleNamespace

    from artstore.cli.demo import _print_what_next

    result = SimpleNamespace(run="demo-1", model="artstore-demo/demo-1", art_path=".art")
    plain, secret = "postgresql://u@db/x", "postgresql://u:pw@db/x"

    def suggested(url: str, environment: str | None) -> list[list[str]]:
        if environment is None:
            monkeypatch.delenv("ARTSTORE_URL", raising=False)
        else:
            monkeypatch.setenv("ARTSTORE_URL", environment)
        _print_what_next(result, "a store", url, None)
        return suggested_commands(capsys.readouterr().out)

    assert not any("--url" in command for command in suggested(plain, plain))
    assert not any("--url" in command for command in suggested(secret, secret))
    assert all(plain in command for command in suggested(plain, None))
    named = suggested(secret, None)
    assert all("$ARTSTORE_URL" in command for command in named), named
    assert not any("pw" in " ".join(command) for command in named)
