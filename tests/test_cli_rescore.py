"""`artstore rescore`: new rewards from the command line, RULER included, and bad input."""

from __future__ import annotations

import json
import os
import uuid

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import pytest
from recorded_run import RUN, record_run
from trained_run import (
    cli,
    event_count,
    in_store,
    judge_policy,
    judge_score,
    latest_rewards,
    one_line_error,
    train_run_sync,
)

from artstore.testing.inference_server import LocalInferenceServer
from artstore.training.groups import group_rollouts

pytestmark = pytest.mark.filterwarnings("ignore:Pydantic serializer warnings")


@pytest.fixture(autouse=True)
def in_tmp(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.chdir(tmp_path)  # reward modules written here are importable
    monkeypatch.delenv("WANDB_API_KEY", raising=False)


@pytest.fixture
def trained(database_url, tmp_path):
    return train_run_sync(database_url, tmp_path / ".art")


def reward_module(tmp_path, source: str) -> str:
    """Write a module of reward functions into the current directory; returns its name."""
    name = f"rewards_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(source)
    return name


def test_rescore_records_a_new_scorer_and_keeps_the_old_one(database_url, trained, tmp_path):
    module = reward_module(
        tmp_path,
        "def by_length(scenario, results, trajectories):\n"
        "    print('scoring', scenario['question'])  # to stderr: --format json stays clean\n"
        "    return [len(r['answer']) / 100 for r in results]\n",
    )
    old = {
        g: in_store(database_url, lambda s, g=g: latest_rewards(s, g, "reward"))
        for g in trained.group_ids
    }

    table = cli(
        "rescore",
        trained.run,
        "--reward",
        f"{module}:by_length",
        "--scorer",
        "length",
        "--url",
        database_url,
    )
    listed = cli(
        "rescore",
        trained.run,
        "--reward",
        f"{module}:by_length",
        "--scorer",
        "length",
        "--format",
        "json",
        "--url",
        database_url,
    )
    shown = cli(
        "show", trained.run, "--section", "rewards", "--format", "json", "--url", database_url
    )

    assert table.exit_code == 0, table.output
    assert "length mean" in table.stdout and "reward mean" in table.stdout
    assert f"re-scored 4 groups of {trained.run} as 'length'" in table.stdout
    rows = json.loads(listed.stdout)
    assert "scoring How many legs" in listed.stderr
    assert [row["group_id"] for row in rows] == trained.group_ids
    for row in rows:
        done = in_store(database_url, lambda s, g=row["group_id"]: group_rollouts(s, g))
        lengths = [len(done.results[rid]["answer"]) / 100 for rid in done.policy]
        assert row["reward_mean"] == pytest.approx(sum(lengths) / len(lengths))
        assert row["run_reward_mean"] == pytest.approx(sum(old[row["group_id"]]) / 3)
    for group_id, rewards in old.items():
        assert (
            in_store(database_url, lambda s, g=group_id: latest_rewards(s, g, "reward")) == rewards
        )
    scorers = {row["scorer"]: row for row in json.loads(shown.stdout)}
    assert scorers["reward"]["events"] == 4 and scorers["reward"]["rescored_events"] == 0
    assert scorers["length"]["events"] == 8 and scorers["length"]["rescored_events"] == 8


def test_a_reward_function_that_raises_names_the_group(database_url, trained, tmp_path):
    module = reward_module(
        tmp_path,
        "calls = []\n"
        "def flaky(scenario, results, trajectories):\n"
        "    calls.append(1)\n"
        "    if len(calls) == 2:\n"
        "        raise KeyError('answer')\n"
        "    return [1.0] * len(trajectories)\n",
    )
    result = cli(
        "rescore",
        trained.run,
        "--reward",
        f"{module}:flaky",
        "--scorer",
        "flaky",
        "--concurrency",
        "1",
        "--url",
        database_url,
        columns=40,
    )

    assert result.exit_code == 1
    line = one_line_error(result)
    assert f"group {trained.group_ids[1]}" in line
    assert "the reward function raised KeyError: 'answer'" in line
    assert "1 of 4 groups" in line
    first = in_store(database_url, lambda s: latest_rewards(s, trained.group_ids[0], "flaky"))
    assert first == [1.0, 1.0, 1.0]  # kept
    finish = cli(
        "rescore",
        trained.run,
        "--reward",
        "artstore.demo:strict_reward",
        "--scorer",
        "flaky",
        "--only-missing",
        "--format",
        "json",
        "--url",
        database_url,
    )
    assert finish.exit_code == 0, finish.output
    assert [row["group_id"] for row in json.loads(finish.stdout)] == trained.group_ids[1:]


MALFORMED_REWARDS = [
    ("artstore.demo", "not of the form module:attribute"),
    ("no_such_module_xyz:score", "no module named 'no_such_module_xyz'"),
    ("artstore.demo:no_such_function", "has no attribute 'no_such_function'"),
    ("artstore.demo.task:LEGS", "is a dict, not a reward function"),
]


def test_a_malformed_reward_is_a_usage_error(database_url):
    in_store(database_url, record_run)
    before = in_store(database_url, event_count)
    for spec, message in MALFORMED_REWARDS:
        result = cli(
            "rescore", RUN, "--reward", spec, "--scorer", "x", "--url", database_url, columns=40
        )
        assert result.exit_code == 2, (spec, result.output)
        assert message in one_line_error(result), spec
    assert in_store(database_url, event_count) == before


def test_unknown_run_is_a_clear_error(database_url):
    in_store(database_url, event_count)  # a store, holding no run (no store: test_cli_no_store)
    result = cli(
        "rescore",
        "nope",
        "--reward",
        "artstore.demo:strict_reward",
        "--scorer",
        "x",
        "--url",
        database_url,
        columns=40,
    )
    assert result.exit_code == 1
    assert "no run 'nope' in this store" in one_line_error(result)


def test_ruler_from_the_command_line(database_url, trained, monkeypatch):
    with LocalInferenceServer(policy=judge_policy) as judge:
        # The ready-made RULER scorer reads its judge from the environment (LiteLLM's own
        # variables for the endpoint and key).
        monkeypatch.setenv("ARTSTORE_RULER_JUDGE_MODEL", "openai/test-model")
        monkeypatch.setenv("OPENAI_API_BASE", judge.base_url)
        monkeypatch.setenv("OPENAI_BASE_URL", judge.base_url)
        monkeypatch.setenv("OPENAI_API_KEY", judge.api_key)
        result = cli(
            "rescore",
            trained.run,
            "--reward",
            "artstore.training.ruler:ruler",
            "--scorer",
            "ruler",
            "--format",
            "json",
            "--url",
            database_url,
        )
        assert len(judge.requests) == 4

    assert result.exit_code == 0, result.output
    for row in json.loads(result.stdout):
        done = in_store(database_url, lambda s, g=row["group_id"]: group_rollouts(s, g))
        expected = [judge_score(done.results[rid]["tools_used"]) for rid in done.policy]
        assert (
            in_store(database_url, lambda s, g=row["group_id"]: latest_rewards(s, g, "ruler"))
            == expected
        )
