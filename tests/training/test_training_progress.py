"""`TrainingFramework` says what it does: a line per train step, and when there is nothing
to do, says that and records nothing."""

from __future__ import annotations

import os
import re
from pathlib import Path

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import pytest
from trained_run import event_count, latest_rewards, train_run


async def test_a_line_per_step_then_nothing_to_do_on_a_finished_run(
    store, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trained = await train_run(store, tmp_path / ".art")  # 2 epochs of 2 scenarios, 1 per batch
    said = capsys.readouterr().err.splitlines()

    assert said[0] == (
        "run legs: started; 2 epochs of 2 batches (4 train steps), 3 rollouts per scenario"
    )
    steps = [line for line in said if re.match(r"run legs: batch \d/4", line)]
    assert [line.split(": ")[1] for line in steps] == [
        "batch 1/4 (epoch 0)",
        "batch 2/4 (epoch 0)",
        "batch 3/4 (epoch 1)",
        "batch 4/4 (epoch 1)",
    ]
    for number, (line, group_id) in enumerate(zip(steps, trained.group_ids, strict=True)):
        rewards = await latest_rewards(store, group_id, "reward")
        assert line.endswith(
            f"step {number} → {number + 1}, 1 group, reward mean {sum(rewards) / 3:.3g}"
        )
    assert said[-1] == (
        "run legs finished: model tests/agent at step 4; this call trained 4 steps and ran "
        "12 rollouts (0 failed)"
    )

    before = await event_count(store)
    await train_run(store, tmp_path / ".art")  # the same run again: nothing left to do

    assert capsys.readouterr().err.splitlines() == [
        "run legs is already finished: its 4 train steps were trained (model tests/agent at "
        "step 4); nothing to do"
    ]
    assert await event_count(store) == before  # nothing recorded


async def test_quiet_when_asked(store, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from artstore.art_versions import trainable_model
    from artstore.backends import CheckOnlyBackend
    from artstore.demo.task import agent, demo_policy, make_scenarios, reward
    from artstore.testing.inference_server import LocalInferenceServer
    from artstore.training import TrainingConfig, TrainingFramework

    async with LocalInferenceServer(policy=demo_policy) as server:
        backend = CheckOnlyBackend(
            path=tmp_path, inference_base_url=server.base_url, inference_api_key=server.api_key
        )
        model = trainable_model(name="quiet", project="tests", base_model="Qwen/Qwen2.5-0.5B")
        await model.register(backend)
        summary = await TrainingFramework(store, progress=False).run_training(
            model=model,
            scenarios=make_scenarios(1),
            agent_function=agent,
            reward_function=reward,
            config=TrainingConfig(epochs=1, batch_size=1, group_size=2, validation_samples=0),
        )
    assert summary.steps_trained == [1]
    assert "run tests/quiet" not in capsys.readouterr().err
