"""Every error a user can cause is one clear line: usage errors, bad options, bad files."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from recorded_run import RUN, record_run
from trained_run import cli

import artstore
from artstore.errors import ConfigurationError
from artstore.exchange import export_jsonl
from artstore.training import TrainingConfig, TrainingFramework


def assert_one_line(result: Any, exit_code: int) -> str:
    assert result.exit_code == exit_code, result.output
    assert result.stderr.count("\n") == 1, result.stderr  # one line, no boxed panel
    assert "╭" not in result.stderr and "Traceback" not in result.output
    return result.stderr.strip()


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["sql", "--bogus", "SELECT 1"], "No such option: --bogus (see artstore sql --help)"),
        (["show"], "Missing argument 'RUN'"),
        (["runs", "--format", "xml"], "Invalid value for '--format'"),
        (["sql", "--timeout", "-1", "SELECT 1"], "Invalid value for '--timeout'"),
        (["db", "upgrade", "--nope"], "No such option: --nope (see artstore db upgrade --help)"),
        (["frobnicate"], "No such command 'frobnicate'"),
        (["replay", "r", "--max-staleness", "many"], "Invalid value for '--max-staleness'"),
    ],
)
def test_usage_errors_are_one_line(args, says):
    assert says in assert_one_line(cli(*args), 2)


@pytest.mark.parametrize("rate", ["nan", "-5", "0", "inf"])
def test_replay_refuses_a_learning_rate_that_is_no_rate(rate, tmp_path):
    result = cli("replay", "r", "--dry-run", "--learning-rate", rate, "--url", tmp_path / "x.db")
    assert "--learning-rate must be a positive number" in assert_one_line(result, 2)
    assert not (tmp_path / "x.db").exists()


def test_jsonl_export_refuses_an_existing_file_unless_forced(recorded_url, tmp_path):
    out = tmp_path / "run.jsonl"
    out.write_text("keep me\n")
    refused = cli("export", RUN, out, "--url", recorded_url)
    assert "run.jsonl exists; nothing was written (--force overwrites it)" in assert_one_line(
        refused, 1
    )
    assert out.read_text() == "keep me\n"
    forced = cli("export", RUN, out, "--force", "--url", recorded_url)
    assert forced.exit_code == 0, forced.output
    assert out.read_text().count("\n") > 1


async def exported_lines(url: str, path: Path) -> list[dict[str, Any]]:
    async with await artstore.open_store(url) as store:
        await export_jsonl(store, RUN, path)
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.parametrize(
    ("field", "value", "says"),
    [
        ("run", "arith-001", "run: Input should be a valid dictionary"),
        ("group", "g0", "group: Input should be a valid dictionary"),
        ("rewards", ["0.5"], "rewards.0: Input should be a valid dictionary"),
        ("trajectory", {"tools": "search"}, "trajectory.tools: Input should be a valid list"),
        ("started_at", "yesterday", "started_at: Input should be a valid datetime"),
        ("rollout_id", None, "rollout_id: Input should be a valid string"),
    ],
)
async def test_a_jsonl_line_of_the_wrong_shape_names_the_field(store, tmp_path, field, value, says):
    await record_run(store)
    url = str(store.database.url)
    lines = await exported_lines(url, tmp_path / "good.jsonl")
    lines[1][field] = value
    bad = tmp_path / "bad.jsonl"
    bad.write_text("".join(json.dumps(line) + "\n" for line in lines))
    result = await asyncio.to_thread(cli, "import", bad, "--run", "copy", "--url", url)
    assert assert_one_line(result, 1).startswith(f"error: {bad}, line 2: {says}")


def test_a_parquet_group_index_that_is_no_number_is_one_line(tmp_path):
    path = tmp_path / "0001.parquet"
    pq.write_table(
        pa.table(
            {
                "group_index": ["first"],
                "reward": [1.0],
                "messages": [[{"role": "user", "content": "hi"}]],
            }
        ),
        path,
    )
    result = cli("import", path, "--url", tmp_path / "store.db")
    assert "group_index is 'first', not a whole number" in assert_one_line(result, 1)


async def test_scenarios_that_are_not_a_list_are_refused(store):
    with pytest.raises(ConfigurationError, match="not a str"):
        await TrainingFramework(store).run_training(
            model=object(),
            scenarios="What is 2+2?",
            agent_function=lambda scenario, thread_id: "4",
            reward_function=lambda s, r, t: [1.0],
            config=TrainingConfig(epochs=1, batch_size=1, group_size=1),
        )
    assert await store.read_all() == []
