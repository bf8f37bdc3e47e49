"""`artstore runs` and `artstore show RUN`: tables for people, json and csv for programs."""

from __future__ import annotations

import asyncio
import csv
import io
import json
import os
import re

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import pytest
from recorded_run import RUN, record_run
from trained_run import cli, in_store, one_line_error, train_run_sync

import artstore


@pytest.fixture(autouse=True)
def in_tmp(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)


@pytest.fixture
def recorded(database_url):
    """The hand-made run of tests/support/recorded_run.py: rescored, with failures."""
    in_store(database_url, record_run)
    return RUN


def test_runs_lists_a_trained_run(database_url, tmp_path):
    trained = train_run_sync(database_url, tmp_path / ".art")

    table = cli("runs", "--url", database_url)
    listed = cli("runs", "--format", "json", "--url", database_url)
    rows = cli("runs", "--format", "csv", "--url", database_url)

    assert table.exit_code == 0, table.output
    line = next(line for line in table.stdout.splitlines() if trained.run in line)
    for cell in ("tests/agent", "finished", " 4 ", "4/4", "12/0"):
        assert cell in line, line
    (run,) = json.loads(listed.stdout)
    assert run["run"] == trained.run and run["model"] == "tests/agent"
    assert run["status"] == "finished" and run["steps"] == 4 and run["step"] == 4
    assert run["groups_sealed"] == run["groups_consumed"] == 4
    assert run["rollouts_finished"] == 12 and run["rollouts_failed"] == 0
    assert run["last_batch"] == 3 and 0 <= run["last_batch_reward_mean"] <= 1
    # The one timestamp format of artstore's output, the views' (UTC).
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{6}", run["started_at"])
    (parsed,) = list(csv.DictReader(io.StringIO(rows.stdout)))
    assert parsed["run"] == trained.run and parsed["steps"] == "4"


def created(database_url: str) -> str:
    """An empty store (`runs` and `show` read one; they create nothing)."""

    async def create() -> None:
        await (await artstore.open_store(database_url)).close()

    asyncio.run(create())
    return database_url


def test_runs_of_an_empty_store(database_url):
    created(database_url)
    table = cli("runs", "--url", database_url)
    listed = cli("runs", "--format", "json", "--url", database_url)
    assert table.exit_code == 0 and "no runs in this store" in table.stdout
    assert json.loads(listed.stdout) == []


def test_runs_counts_failures_and_rescored_rewards(database_url, recorded):
    (run,) = json.loads(cli("runs", "--format", "json", "--url", database_url).stdout)
    assert run["status"] == "failed"
    assert run["steps"] == 1  # one completed, one failed
    assert run["groups_sealed"] == 3 and run["groups_consumed"] == 2
    assert run["rollouts_finished"] == 6 and run["rollouts_failed"] == 1
    # Batch 1 is g2, rewarded 1.0 and 1.0 by the run's scorer "correct".
    assert run["last_batch"] == 1 and run["last_batch_reward_mean"] == 1.0


def test_show_prints_steps_groups_rewards_consumption_and_failures(database_url, recorded):
    result = cli("show", recorded, "--url", database_url)

    assert result.exit_code == 0, result.output
    out = result.stdout
    for title in ("train steps", "groups", "rewards per scorer", "consumption per", "failures"):
        assert title in out
    for text in (
        "arith/agent-001",
        "0 → 1",
        "completed",
        "failed",
        "RuntimeError",
        "CUDA out of memory",
        "ToolError",
        "the search tool timed out",
        "correct mean",
        "judge mean",
    ):
        assert text in out, text


def test_show_json_has_every_section_worked_out_by_hand(database_url, recorded):
    result = cli("show", recorded, "--format", "json", "--url", database_url)
    assert result.exit_code == 0, result.output
    shown = json.loads(result.stdout)

    assert shown["run"]["status"] == "failed"
    assert shown["run"]["error"] == "RuntimeError: CUDA out of memory"
    assert (shown["run"]["rollouts_finished"], shown["run"]["rollouts_failed"]) == (6, 1)

    first, second = shown["steps"]
    assert (first["step_before"], first["step"], first["status"]) == (0, 1, "completed")
    assert first["groups"] == 2 and first["batches"] == [0]
    # Trained on "correct" before g0 was re-scored: r0a 1.0, r0b 0.0, r1a 0.5.
    assert first["reward_mean"] == pytest.approx(0.5)
    assert first["metrics"] == {"loss": 0.25, "reward_mean": 0.5, "num_groups_trainable": 1.0}
    assert first["pushed_to"] == "s3://bucket/agent-001/0001"
    assert (second["status"], second["error"]) == ("failed", "RuntimeError: CUDA out of memory")
    assert second["reward_mean"] == 1.0

    groups = {g["group_id"]: g for g in shown["groups"]}
    # Latest policy rewards: g0 correct (1.0 + 0.25) / 2, judge (0.8 + 0.4) / 2.
    assert groups["g0"]["rewards"] == {"correct": 0.625, "judge": pytest.approx(0.6)}
    assert groups["g1"]["rewards"] == {"correct": 0.5, "judge": 0.3}
    assert groups["g2"]["rewards"] == {"correct": 1.0}
    assert groups["g0"]["consumed_by"] == ["arith/agent-001@1"]
    assert groups["g2"]["consumed_by"] == []
    assert (groups["g0"]["size"], groups["g0"]["validation"], groups["g1"]["failed"]) == (2, 1, 1)

    rewards = {r["scorer"]: r for r in shown["rewards"]}
    # correct: r0a 1.0, r0b 0.25, r1a 0.5, r2a 1.0, r2b 1.0 (validation r0v left out).
    assert rewards["correct"]["rollouts"] == 5 and rewards["correct"]["groups"] == 3
    assert rewards["correct"]["reward_mean"] == pytest.approx(0.75)
    assert (rewards["correct"]["reward_min"], rewards["correct"]["reward_max"]) == (0.25, 1.0)
    assert (rewards["correct"]["events"], rewards["correct"]["rescored_events"]) == (4, 1)
    assert rewards["judge"]["reward_mean"] == pytest.approx(0.5)

    (consumption,) = shown["consumption"]
    assert consumption == {
        "model": "arith/agent-001",
        "groups_consumed": 2,
        "steps_completed": 1,
        "steps_failed": 1,
        "last_step": 1,
        "scorers": ["correct"],
        "last_consumed_at": consumption["last_consumed_at"],
    }

    failures = [(f["kind"], f["error_type"], f["error_message"]) for f in shown["failures"]]
    assert failures == [
        ("rollout", "ToolError", "the search tool timed out"),
        ("train step", "RuntimeError", "CUDA out of memory"),
        ("run", None, "RuntimeError: CUDA out of memory"),
    ]
    assert shown["failures"][0]["id"] == "r1b"


def test_show_one_section_as_csv_or_json(database_url, recorded):
    failures = cli(
        "show", recorded, "--section", "failures", "--format", "csv", "--url", database_url
    )
    groups = cli("show", recorded, "--section", "groups", "--format", "json", "--url", database_url)
    both = cli(
        "show",
        recorded,
        "--section",
        "rewards",
        "--section",
        "consumption",
        "--format",
        "csv",
        "--url",
        database_url,
    )

    rows = list(csv.DictReader(io.StringIO(failures.stdout)))
    assert [row["kind"] for row in rows] == ["rollout", "train step", "run"]
    assert [g["group_id"] for g in json.loads(groups.stdout)] == ["g0", "g1", "g2"]
    assert both.stdout.startswith("# rewards\nscorer,")
    assert "\n\n# consumption\nmodel," in both.stdout


def test_show_unknown_run_is_a_clear_error(database_url):
    created(database_url)
    result = cli("show", "nope", "--url", database_url, columns=40)
    assert result.exit_code == 1
    assert "no run 'nope' in this store (see `artstore runs`)" in one_line_error(result)
