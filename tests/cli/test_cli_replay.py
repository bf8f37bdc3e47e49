"""`artstore replay`: dry runs, training a second model, staleness, and bad input."""

from __future__ import annotations

import json
import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import pytest
from recorded_run import RUN, record_run
from trained_run import (
    checkpoint_record,
    cli,
    event_count,
    in_store,
    latest_rewards,
    one_line_error,
    train_run_sync,
)

from artstore.backends import group_advantages

BACKEND = "artstore.backends:check_only_backend"
INTO_SECOND = ["--model", "second", "--backend", BACKEND]  # train a second model on the CPU


@pytest.fixture(autouse=True)
def in_tmp(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    # check_only_backend keeps its state in ./.art: the test's own directory.
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)


@pytest.fixture
def trained(database_url, tmp_path):
    return train_run_sync(database_url, tmp_path / ".art")


def test_dry_run_prints_the_plan_and_writes_nothing(database_url, trained, tmp_path):
    before = in_store(database_url, event_count)

    table = cli("replay", trained.run, "--dry-run", "--model", "second", "--url", database_url)
    listed = cli(
        "replay", trained.run, "--dry-run", *INTO_SECOND, "--format", "json", "--url", database_url
    )
    csv = cli(
        "replay",
        trained.run,
        "--dry-run",
        "--model",
        "second",
        "--format",
        "csv",
        "--url",
        database_url,
    )

    assert table.exit_code == 0, table.output
    assert "would train 4 groups in 4 steps" in table.stdout
    assert "dry run: nothing trained or recorded" in table.stdout
    assert table.stdout.count("planned") == 4
    assert listed.exit_code == 0, listed.output
    rows = json.loads(listed.stdout)
    assert [row["group_id"] for row in rows] == trained.group_ids
    assert [row["train_step"] for row in rows] == [1, 2, 3, 4]
    assert [row["staleness"] for row in rows] == [0, 0, 0, 0]
    assert {row["status"] for row in rows} == {"planned"}
    for row in rows:
        rewards = in_store(
            database_url, lambda s, g=row["group_id"]: latest_rewards(s, g, "reward")
        )
        assert row["rewards"] == rewards
        assert row["advantages"] == pytest.approx(group_advantages(rewards))
        assert row["model"] == "tests/second" and row["scorer"] == "reward"
    assert csv.exit_code == 0
    assert csv.stdout.splitlines()[0].startswith("train_step,group,batch")
    assert len(csv.stdout.splitlines()) == 5
    assert in_store(database_url, event_count) == before
    # Not even registered with the backend: a real one would start its servers.
    assert not (tmp_path / ".art" / "tests" / "models" / "second").exists()


def test_rescore_then_replay_trains_a_second_model_on_the_new_scorer(
    database_url, trained, tmp_path
):
    rescored = cli(
        "rescore",
        trained.run,
        "--reward",
        "artstore.demo:strict_reward",
        "--scorer",
        "strict",
        "--url",
        database_url,
    )
    replay_strict = ["replay", trained.run, "--scorer", "strict", *INTO_SECOND]
    replayed = cli(*replay_strict, "--format", "json", "--url", database_url)
    again = cli(*replay_strict, "--url", database_url)
    shown = cli(
        "show", trained.run, "--section", "consumption", "--format", "json", "--url", database_url
    )

    assert rescored.exit_code == 0, rescored.output
    assert replayed.exit_code == 0, replayed.output
    rows = json.loads(replayed.stdout)
    assert [row["status"] for row in rows] == ["trained"] * 4
    for row in rows:
        record = checkpoint_record(tmp_path / ".art", "second", row["train_step"])
        strict = in_store(database_url, lambda s, g=row["group_id"]: latest_rewards(s, g, "strict"))
        assert row["rewards"] == strict
        assert record["advantages"][0] == pytest.approx(group_advantages(strict))
    assert again.exit_code == 0
    assert "would train" not in again.stdout and "4 consumed before" in again.stdout
    consumption = {row["model"]: row for row in json.loads(shown.stdout)}
    assert consumption["tests/agent"]["groups_consumed"] == 4
    assert consumption["tests/agent"]["scorers"] == ["reward"]
    assert consumption["tests/second"]["groups_consumed"] == 4
    assert consumption["tests/second"]["scorers"] == ["strict"]

    # In SQL, v_runs.model_key names the run's own model as the train steps name it.
    own_steps = cli(
        "sql", "--url", database_url, "--format", "json",
        "SELECT r.model, r.model_key, s.model AS trained, count(*) AS steps FROM v_runs AS r "
        "JOIN v_train_steps AS s ON s.run = r.run AND s.model = r.model_key "
        "GROUP BY r.model, r.model_key, s.model",
    )  # fmt: skip
    assert own_steps.exit_code == 0, own_steps.output
    assert json.loads(own_steps.stdout) == [
        {"model": "agent", "model_key": "tests/agent", "trained": "tests/agent", "steps": 4}
    ]


def test_max_staleness_skips_stale_groups(database_url, trained, tmp_path):
    # `ahead` first trains on another run (2 steps); the groups of `trained` come from
    # policy steps 0..3, so in one step at step 2 they are 2, 1, 0 and -1 steps old.
    other = train_run_sync(database_url, tmp_path / ".art", run="other", epochs=1)
    first = cli(
        "replay", other.run, "--backend", BACKEND, "--model", "ahead", "--url", database_url
    )
    options = [
        "--backend",
        BACKEND,
        "--model",
        "ahead",
        "--groups-per-step",
        "4",
        "--max-staleness",
        "1",
        "--format",
        "json",
        "--url",
        database_url,
    ]
    planned = cli("replay", trained.run, "--dry-run", *options)
    replayed = cli("replay", trained.run, *options)
    again = cli("replay", trained.run, *options)

    assert first.exit_code == 0, first.output
    assert planned.exit_code == 0, planned.output
    rows = json.loads(planned.stdout)
    assert [(row["staleness"], row["status"]) for row in rows] == [
        (1, "planned"),
        (0, "planned"),
        (-1, "planned"),
        (2, "skipped: stale"),
    ]
    assert rows[-1]["group_id"] == trained.group_ids[0]
    assert replayed.exit_code == 0, replayed.output
    assert [row["status"] for row in json.loads(replayed.stdout)] == ["trained"] * 3 + [
        "skipped: stale"
    ]
    # The stale group stays unconsumed, and stays too stale.
    assert [row["status"] for row in json.loads(again.stdout)] == ["skipped: stale"]


MALFORMED_BACKENDS = [
    ("artstore.backends", 2, "not of the form module:attribute"),
    ("no_such_module_xyz:factory", 2, "no module named 'no_such_module_xyz'"),
    ("artstore.backends:no_such_factory", 2, "has no attribute 'no_such_factory'"),
    ("artstore.backends:CHECKPOINT_FILE", 2, "neither an art.Backend nor a factory"),
    ("artstore.backends:group_advantages", 1, "the factory raised TypeError"),
    ("json:dumps", 1, "the factory raised TypeError"),
    ("builtins:dict", 2, "returned a dict, not an art.Backend"),
]


def test_a_malformed_backend_is_one_line_and_trains_nothing(database_url):
    in_store(database_url, record_run)  # a run recorded event by event: quick to make
    before = in_store(database_url, event_count)
    for spec, status, message in MALFORMED_BACKENDS:
        result = cli(
            "replay",
            RUN,
            "--model",
            "second",
            "--backend",
            spec,
            "--url",
            database_url,
            columns=40,
        )
        assert result.exit_code == status, (spec, result.output)
        assert message in one_line_error(result), spec
    assert in_store(database_url, event_count) == before


def test_unknown_run_and_missing_backend_are_clear_errors(database_url, tmp_path):
    in_store(database_url, event_count)  # a store, holding no run (no store: test_cli_no_store)
    unknown = cli("replay", "nope", "--dry-run", "--url", database_url, columns=40)
    assert unknown.exit_code == 1
    assert "no run 'nope' in this store" in one_line_error(unknown)
    missing = cli("replay", "nope", "--url", database_url, columns=40)
    assert missing.exit_code == 2
    assert "--backend is needed" in one_line_error(missing)
