"""No secret in what artstore prints: log lines and error messages are redacted as events are.

A failing agent's exception holds the model's API key (as a client's 401 error does);
the training loop's warning, the RolloutsFailedError that stops the run, and the command
line's one-line errors all come out without it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from recorded_run import RUN
from training_helpers import length_reward, scenarios, scripted_agent, trainable_model
from typer.testing import CliRunner

from artstore.cli import app
from artstore.redaction import REDACTED
from artstore.testing.inference_server import LocalInferenceServer
from artstore.training import RolloutsFailedError, TrainingConfig, TrainingFramework


@pytest.fixture
def server() -> Iterator[LocalInferenceServer]:
    with LocalInferenceServer() as running:
        yield running


async def test_the_training_loop_prints_no_key(store, server, tmp_path, caplog, monkeypatch):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    model, _ = await trainable_model(tmp_path, server)
    key = model.inference_api_key
    assert key and len(key) >= 8
    calls: dict[int, int] = {}

    async def leaky(scenario: dict[str, Any], thread_id: str) -> str:
        calls[scenario["id"]] = calls.get(scenario["id"], 0) + 1
        if scenario["id"] == 1 or calls[scenario["id"]] == 1:
            raise RuntimeError(f"401 Unauthorized: invalid key {key} for {thread_id}")
        return await scripted_agent(scenario, thread_id)

    caplog.set_level(logging.INFO, logger="artstore")
    with pytest.raises(RolloutsFailedError) as raised:
        await TrainingFramework(store).run_training(
            model=model,
            scenarios=scenarios(2),
            agent_function=leaky,
            reward_function=length_reward,
            config=TrainingConfig(epochs=1, batch_size=2, group_size=3),
        )
    message = str(raised.value)
    assert key not in message and REDACTED in message and "401 Unauthorized" in message
    assert raised.value.__cause__ is None  # the agent's exception, key and all, is not chained
    warnings = [r.getMessage() for r in caplog.records if r.name.startswith("artstore")]
    assert any("rollouts failed and are left out" in w for w in warnings), warnings
    assert all(key not in w for w in warnings)
    assert any(REDACTED in w for w in warnings)


def test_a_command_line_error_prints_no_key(recorded_url, tmp_path: Path, monkeypatch):
    secret = "sk-live-not-for-your-eyes-0123"
    monkeypatch.setenv("JUDGE_API_KEY", secret)
    (tmp_path / "leaky_rewards.py").write_text(
        "import os\n"
        "def judge(scenario, results, trajectories):\n"
        "    raise RuntimeError('judge refused key ' + os.environ['JUDGE_API_KEY'])\n"
    )
    monkeypatch.chdir(tmp_path)
    command = ["rescore", RUN, "--reward", "leaky_rewards:judge", "--scorer", "judge2"]
    result = CliRunner().invoke(app, [*command, "--url", recorded_url])
    assert result.exit_code == 1
    assert "judge refused key" in result.stderr and secret not in result.output
    assert result.stderr.count("\n") == 1
