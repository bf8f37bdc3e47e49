"""`artstore rescore`: new rewards from the command line, RULER included, and bad input."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import pytest
from mixed_run import record_interleaved
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

from artstore.analysis import query
from artstore.groups import group_rollouts
from artstore.testing.inference_server import LocalInferenceServer

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
        "--again",
        "--format",
        "json",
        "--url",
        database_url,
    )
    shown = cli(
        "show", trained.run, "--section", "rewards", "--format", "json", "--url", database_url
    )
    resumed = cli(  # without --again: nothing left to score
        "rescore", trained.run, "--reward", f"{module}:by_length", "--scorer", "length",
        "--url", database_url,
    )  # fmt: skip

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
    assert resumed.exit_code == 0, resumed.output
    assert "no group left to score as 'length'" in resumed.stdout
    assert "4 groups scored as 'length' before were left as they are (--again" in " ".join(
        resumed.stdout.split()
    )


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
        "--format",
        "json",
        "--url",
        database_url,
    )
    assert finish.exit_code == 0, finish.output
    assert [row["group_id"] for row in json.loads(finish.stdout)] == trained.group_ids[1:]


# A judge that scores the first FREE groups of its process at once and makes the others
# wait until the gate file exists; each call that returns writes its group's question to
# the calls file (a reward function may be an LLM judge that costs money: count them).
COUNTED_JUDGE = """
import asyncio, os, pathlib

CALLS = pathlib.Path(os.environ["JUDGE_CALLS"])
GATE = pathlib.Path(os.environ["JUDGE_GATE"])
FREE = int(os.environ["JUDGE_FREE"])
started = 0


async def judge(scenario, results, trajectories):
    global started
    started += 1
    if started > FREE:
        while not GATE.exists():
            await asyncio.sleep(0.05)
    with CALLS.open("a") as calls:
        calls.write(scenario["question"] + "\\n")
    return [0.25] * len(trajectories)
"""


async def judged(store) -> dict[str, int]:
    """How many rewards by "counted" each rollout has, as v_rewards shows them."""
    rows = await query(
        store,
        "SELECT rollout_id, count(*) FROM v_rewards WHERE scorer = 'counted' GROUP BY rollout_id",
    )
    return dict(rows.rows)


def test_a_rescore_killed_midway_resumes_and_scores_each_group_once(
    database_url, tmp_path, monkeypatch
):
    group_ids = in_store(database_url, lambda s: record_interleaved(s, seed=3, groups=8, size=2))
    module = reward_module(tmp_path, COUNTED_JUDGE)
    calls, gate = tmp_path / "calls.txt", tmp_path / "gate"
    for name, value in (("JUDGE_CALLS", calls), ("JUDGE_GATE", gate), ("JUDGE_FREE", 3)):
        monkeypatch.setenv(name, str(value))
    rescore = ["rescore", "mixed", "--reward", f"{module}:judge", "--scorer", "counted"]
    output = tmp_path / "first.out"
    with output.open("w") as out:
        first = subprocess.Popen(
            [str(Path(sys.executable).with_name("artstore")), *rescore, "--url", database_url],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 300
        while len(in_store(database_url, judged)) < 3 * 2:  # three groups of two recorded
            assert first.poll() is None, output.read_text()
            assert time.monotonic() < deadline, "three groups were not scored in 5 minutes"
            time.sleep(0.2)
    finally:
        first.send_signal(signal.SIGKILL)  # midway: the other groups wait for the judge
        first.wait()
    assert first.returncode == -signal.SIGKILL
    scored_first = in_store(database_url, judged)

    gate.touch()
    second = cli(*rescore, "--format", "json", "--url", database_url)

    assert second.exit_code == 0, second.output
    resumed = [row["group_id"] for row in json.loads(second.stdout)]
    assert resumed == [g for g in group_ids if f"{g}r0" not in scored_first]
    assert len(resumed) == 5
    # Each group went to the judge once, and each rollout has one reward by it.
    questions = sorted(calls.read_text().split())
    assert questions == sorted(f"q{number}" for number in range(len(group_ids)))
    assert in_store(database_url, judged) == {f"{g}r{n}": 1 for g in group_ids for n in (0, 1)}


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
