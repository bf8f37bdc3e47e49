"""CheckOnlyBackend: the CPU `art.Backend` the rest of artstore's tests train against."""

from __future__ import annotations

import ast
import importlib
import inspect
import json
import math
import os
import types
from itertools import takewhile
from pathlib import Path
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import art
import pytest
from openai.types.chat import ChatCompletionMessage, ChatCompletionTokenLogprob
from openai.types.chat.chat_completion import Choice, ChoiceLogprobs

from artstore.art_versions import (
    NEW_TRAIN_KEYWORDS,
    history_class,
    rewards_have_zero_variance,
    train_keywords_of_this_art,
)
from artstore.backends import (
    CHECKPOINT_FILE,
    NO_SERVER_BASE_URL,
    CheckOnlyBackend,
    TrajectoryCheckError,
    check_only_backend,
    group_advantages,
)

BASE_URL = "http://127.0.0.1:8765/v1"


def choice(content: str = "hello", *, tokens: int = 3, logprobs: bool = True) -> Choice:
    return Choice(
        index=0,
        finish_reason="stop",
        message=ChatCompletionMessage(role="assistant", content=content),
        logprobs=(
            ChoiceLogprobs(
                content=[
                    ChatCompletionTokenLogprob(
                        token=f"t{i}", logprob=-0.1 * (i + 1), bytes=None, top_logprobs=[]
                    )
                    for i in range(tokens)
                ]
            )
            if logprobs
            else None
        ),
    )


def trajectory(reward: float, *, tokens: int = 3, item: Any = None) -> art.Trajectory:
    last = choice(tokens=tokens) if item is None else item
    return art.Trajectory(
        messages_and_choices=[{"role": "user", "content": "hi"}, last], reward=reward
    )


def group(*rewards: float, tokens: int = 3, **metadata: Any) -> art.TrajectoryGroup:
    return art.TrajectoryGroup(
        [trajectory(r, tokens=tokens) for r in rewards], metadata=metadata or None
    )


@pytest.fixture(autouse=True)
def no_wandb(monkeypatch: pytest.MonkeyPatch) -> None:
    # model.log reports to W&B whenever WANDB_API_KEY is set; these tests stay offline.
    monkeypatch.delenv("WANDB_API_KEY", raising=False)


def new_model(tmp_path: Path) -> art.TrainableModel:
    return art.TrainableModel(
        name="m",
        project="p",
        run_name="m",  # required by ART >= 0.5.20, ignored by 0.5.18
        base_model="Qwen/Qwen2.5-0.5B-Instruct",
        base_path=str(tmp_path / "unused"),
    )


@pytest.fixture
def backend(tmp_path: Path) -> CheckOnlyBackend:
    return CheckOnlyBackend(
        path=tmp_path / "art",
        inference_base_url=BASE_URL,
        inference_api_key="sk-test",
        push_dir=tmp_path / "bucket",
    )


@pytest.fixture
async def model(backend: CheckOnlyBackend, tmp_path: Path) -> art.TrainableModel:
    m = new_model(tmp_path)
    await m.register(backend)
    return m


# -- registration ---------------------------------------------------------------------------


async def test_register_points_model_at_backend(
    backend: CheckOnlyBackend, model: art.TrainableModel
) -> None:
    assert model.inference_base_url == BASE_URL
    assert model.inference_api_key == "sk-test"
    # LocalBackend's naming: vLLM serves LoRA adapters as name@step.
    assert model.inference_model_name == "m@0"
    assert backend._model_inference_name(model, step=3) == "m@3"
    assert model.base_path == backend.path
    assert (Path(backend.path) / "p/models/m/model.json").is_file()
    # Checkpoint 0 exists after register, as LocalBackend's service creates it.
    assert backend.checkpoint_dir(model, 0).is_dir()
    assert await model.get_step() == 0


async def test_register_without_server_url_points_nowhere(tmp_path: Path) -> None:
    m = new_model(tmp_path)
    await m.register(CheckOnlyBackend(path=tmp_path / "art"))
    assert m.inference_base_url == NO_SERVER_BASE_URL
    assert m.inference_api_key == "default"


def test_factory_is_importable_as_module_colon_name(tmp_path: Path) -> None:
    module, _, name = "artstore.backends:check_only_backend".partition(":")
    factory = getattr(importlib.import_module(module), name)
    made = factory(path=tmp_path / "x")
    assert isinstance(made, CheckOnlyBackend)
    assert check_only_backend is factory


# -- step -----------------------------------------------------------------------------------


async def test_step_advances_and_persists_across_instances(
    backend: CheckOnlyBackend, model: art.TrainableModel, tmp_path: Path
) -> None:
    first = await backend.train(model, [group(1.0, 0.0)])
    assert isinstance(first, art.types.LocalTrainResult)
    assert first.step == 1
    assert first.checkpoint_path == str(backend.checkpoint_dir(model, 1))
    second = await backend.train(model, [group(0.0, 1.0)])
    assert second.step == 2
    assert await model.get_step() == 2
    assert backend._model_inference_name(model) == "m@2"

    # A fresh backend (another process, after a crash) sees the step from disk.
    again = CheckOnlyBackend(path=tmp_path / "art", inference_base_url=BASE_URL)
    fresh = new_model(tmp_path)
    await fresh.register(again)
    assert await fresh.get_step() == 2
    assert (await again.train(fresh, [group(1.0, 0.0)])).step == 3

    record = again.read_checkpoint(fresh, 2)
    assert record["step"] == 2
    assert record["metrics"]["num_groups"] == 1.0
    names = sorted(p.name for p in (Path(backend.path) / "p/models/m/checkpoints").iterdir())
    assert names == ["0000", "0001", "0002", "0003"]


async def test_leftover_staging_dir_is_not_a_step(
    backend: CheckOnlyBackend, model: art.TrainableModel
) -> None:
    # What a SIGKILL during _write_checkpoint can leave behind.
    (backend.checkpoint_dir(model, 0).parent / ".tmp-0001-abc").mkdir()
    assert await model.get_step() == 0
    assert (await backend.train(model, [group(1.0, 0.0)])).step == 1


async def test_save_checkpoint_false_still_advances(
    backend: CheckOnlyBackend, model: art.TrainableModel
) -> None:
    result = await backend.train(model, [group(1.0, 0.0)], save_checkpoint=False)
    assert result.step == 1
    assert result.checkpoint_path is None
    assert await model.get_step() == 1


async def test_delete_checkpoint_files(
    backend: CheckOnlyBackend, model: art.TrainableModel
) -> None:
    for _ in range(3):
        await backend.train(model, [group(1.0, 0.0)])
    await backend._delete_checkpoint_files(model, [1, 3])
    kept = sorted(p.name for p in backend.checkpoint_dir(model, 0).parent.iterdir())
    assert kept == ["0001", "0003"]
    assert await model.get_step() == 3


# -- advantages -----------------------------------------------------------------------------


def _arts_tokenize_trajectory_groups() -> Any:
    """ART's own `tokenize_trajectory_groups` (art/preprocessing/tokenize.py), compiled from
    the installed source with its per-trajectory tokenizer stubbed out (torch is not
    installed here), so the advantages it computes can be compared with ours."""
    import art.preprocessing as preprocessing

    source = (Path(preprocessing.__file__).parent / "tokenize.py").read_text()
    func = next(
        node
        for node in ast.parse(source).body
        if isinstance(node, ast.FunctionDef) and node.name == "tokenize_trajectory_groups"
    )
    func.returns = None  # annotations name torch/transformers types: drop them
    for arg in [*func.args.args, *func.args.kwonlyargs]:
        arg.annotation = None

    def tokenized(advantage: float, trajectory: Any) -> types.SimpleNamespace:
        return types.SimpleNamespace(
            advantage=advantage,
            trajectory=trajectory,
            token_ids=[1, 2],
            logprobs=[math.nan, -0.1],
            assistant_mask=[0, 1],
        )

    def tokenize_trajectory(tokenizer, image_processor, history, advantage, *args, **kw):
        return tokenized(advantage, args[1])  # ART 0.5.18

    def assemble_vllm_training_sequences(*, advantage, trajectory, **kw):
        return [tokenized(advantage, trajectory)]  # ART 0.5.20 and later

    namespace = {
        "math": math,
        "random": __import__("random"),
        "takewhile": takewhile,
        "History": art.trajectories.History,
        "LegacyHistory": history_class(),
        "tokenize_trajectory": tokenize_trajectory,
        "assemble_vllm_training_sequences": assemble_vllm_training_sequences,
        "rewards_have_zero_variance": rewards_have_zero_variance,
    }
    exec(compile(ast.Module(body=[func], type_ignores=[]), "tokenize.py", "exec"), namespace)
    return namespace["tokenize_trajectory_groups"]


@pytest.mark.parametrize("scale_rewards", [True, False])
def test_group_advantages_match_arts_tokenizer(scale_rewards: bool) -> None:
    arts = _arts_tokenize_trajectory_groups()
    for rewards in (
        [1.0, 0.0],
        [1.0, 0.0, 0.5],
        [0.2, 0.9, 0.4, 0.4],
        [3.0, -1.0, 0.5],
        [1.0, 1.0, 0.0],
    ):
        g = group(*rewards)
        results = arts(None, [g], False, scale_rewards, shuffle_group_trajectories=False)
        by_trajectory = {id(r.trajectory): r.advantage for r in results}
        ours = group_advantages(rewards, scale_rewards=scale_rewards)
        for t, advantage in zip(g.trajectories, ours, strict=True):
            # ART drops exactly the trajectories whose advantage is 0.
            assert by_trajectory.get(id(t), 0.0) == pytest.approx(advantage, abs=1e-12)


def test_group_advantages_known_example() -> None:
    # mean 0.5, population std 0.5: (r - 0.5) / (0.5 + 1e-6)
    assert group_advantages([1.0, 0.0, 1.0, 0.0]) == pytest.approx(
        [0.5 / (0.5 + 1e-6), -0.5 / (0.5 + 1e-6)] * 2
    )
    assert group_advantages([1.0, 0.0], scale_rewards=False) == [0.5, -0.5]
    assert group_advantages([0.1, 0.1, 0.1]) == [0.0, 0.0, 0.0]
    assert group_advantages([7.0]) == [0.0]
    assert group_advantages([]) == []
    with pytest.raises(ValueError, match="finite"):
        group_advantages([1.0, math.nan])


async def test_train_reports_arts_advantages(
    backend: CheckOnlyBackend, model: art.TrainableModel
) -> None:
    result = await backend.train(model, [group(1.0, 0.0, 0.5, tokens=4), group(2.0, 2.0)])
    assert backend.last_advantages[0] == pytest.approx(group_advantages([1.0, 0.0, 0.5]))
    assert backend.last_advantages[1] == [0.0, 0.0]
    m = result.metrics
    assert m["num_groups"] == 2
    assert m["num_groups_trainable"] == 1
    assert m["num_groups_skipped_no_reward_spread"] == 1
    assert m["num_trajectories"] == 5
    # The 0.5 reward equals its group's mean: advantage 0, dropped like ART does.
    assert m["num_trajectories_trainable"] == 2
    assert m["num_trainable_tokens"] == 8
    assert m["data/step_trainer_tokens"] == 8
    assert m["data/step_num_groups_trainable"] == 1
    assert m["data/step_num_gradient_steps"] == 0
    assert m["mean_abs_advantage"] == pytest.approx(abs(backend.last_advantages[0][0]))
    assert m["reward_mean"] == pytest.approx(1.1)
    assert m["learning_rate"] == 5e-6
    assert not any(key.startswith("loss") for key in m)  # nothing trained, no loss invented


async def test_groups_without_reward_spread_are_skipped_and_step_still_advances(
    backend: CheckOnlyBackend, model: art.TrainableModel
) -> None:
    groups = [group(1.0, 1.0), group(0.1, 0.1, 0.1), group(0.3), art.TrajectoryGroup([])]
    result = await backend.train(model, groups)
    # LocalBackend advances the step when nothing is trainable (it copies the checkpoint).
    assert result.step == 1
    assert result.metrics["num_groups_trainable"] == 0
    assert result.metrics["num_groups_skipped_no_reward_spread"] == 3
    assert result.metrics["num_groups_empty"] == 1
    assert result.metrics["num_trainable_tokens"] == 0
    assert result.metrics["mean_abs_advantage"] == 0
    assert backend.last_advantages == [[0.0, 0.0], [0.0, 0.0, 0.0], [0.0], []]


async def test_normalize_advantages_false_disables_scaling(
    backend: CheckOnlyBackend, model: art.TrainableModel
) -> None:
    await backend.train(model, [group(1.0, 0.0)], normalize_advantages=False)
    assert backend.last_advantages == [[0.5, -0.5]]


# -- rejected input ---------------------------------------------------------------------------


async def test_choice_left_as_dict_by_model_validate_is_rejected(
    backend: CheckOnlyBackend, model: art.TrainableModel
) -> None:
    good = trajectory(1.0)
    revived = art.Trajectory.model_validate(trajectory(0.0).model_dump())
    assert isinstance(revived.messages_and_choices[1], dict)
    with pytest.raises(TrajectoryCheckError) as info:
        await backend.train(model, [group(1.0, 0.0), art.TrajectoryGroup([good, revived])])
    message = str(info.value)
    assert "group 1, trajectory 1" in message
    assert "serialised as a plain dict" in message
    assert "group 0" not in message
    assert isinstance(info.value, ValueError)
    assert await model.get_step() == 0  # nothing recorded


@pytest.mark.parametrize(
    ("item", "expected"),
    [
        (choice(logprobs=False), "Choice without logprobs"),
        (choice(tokens=0), "logprobs hold no tokens"),
        ({"role": "assistant", "content": "hello"}, "assistant message as a plain dict"),
    ],
)
async def test_untrainable_last_turn_is_rejected(
    backend: CheckOnlyBackend, model: art.TrainableModel, item: Any, expected: str
) -> None:
    bad = trajectory(0.0, item=item)
    with pytest.raises(ValueError, match=expected) as info:
        await backend.train(model, [art.TrajectoryGroup([trajectory(1.0), bad])])
    assert "group 0, trajectory 1: no trainable Choice with logprobs" in str(info.value)


async def test_even_groups_without_spread_are_checked(
    backend: CheckOnlyBackend, model: art.TrainableModel
) -> None:
    bad = trajectory(1.0, item=choice(logprobs=False))
    with pytest.raises(ValueError, match="group 0, trajectory 1"):
        await backend.train(model, [art.TrajectoryGroup([trajectory(1.0), bad])])


async def test_allow_training_without_logprobs(
    backend: CheckOnlyBackend, model: art.TrainableModel
) -> None:
    plain = trajectory(0.0, item={"role": "assistant", "content": "hello"})
    result = await backend.train(
        model,
        [art.TrajectoryGroup([trajectory(1.0, tokens=2), plain])],
        allow_training_without_logprobs=True,
    )
    assert result.step == 1
    assert result.metrics["num_trainable_tokens"] == 2  # only logprob tokens are counted


async def test_assistant_dict_as_context_is_fine(
    backend: CheckOnlyBackend, model: art.TrainableModel
) -> None:
    t = art.Trajectory(
        messages_and_choices=[
            {"role": "user", "content": "example"},
            {"role": "assistant", "content": "few-shot answer"},
            {"role": "user", "content": "hi"},
            choice(),
        ],
        reward=1.0,
    )
    assert (await backend.train(model, [art.TrajectoryGroup([t, trajectory(0.0)])])).step == 1


async def test_unknown_kwarg_and_bad_arguments(
    backend: CheckOnlyBackend, model: art.TrainableModel
) -> None:
    with pytest.raises(TypeError):
        await backend.train(model, [group(1.0, 0.0)], learning_rat=1e-5)  # type: ignore[call-arg]
    with pytest.raises(ValueError, match="loss_fn"):
        await backend.train(model, [group(1.0, 0.0)], loss_fn="dpo")  # type: ignore[arg-type]
    assert await model.get_step() == 0


def test_train_signature_mirrors_local_backend() -> None:
    # LocalBackend cannot be imported without torch: read its signature from the source.
    source = (Path(art.__file__).parent / "local" / "backend.py").read_text()
    local_backend = next(
        node
        for node in ast.parse(source).body
        if isinstance(node, ast.ClassDef) and node.name == "LocalBackend"
    )
    train = next(
        node
        for node in local_backend.body
        if isinstance(node, ast.AsyncFunctionDef) and node.name == "train"
    )
    theirs = {
        arg.arg: ast.literal_eval(default)
        for arg, default in zip(train.args.kwonlyargs, train.args.kw_defaults, strict=True)
    }
    ours = {
        name: parameter.default
        for name, parameter in inspect.signature(CheckOnlyBackend.train).parameters.items()
        if parameter.kind is inspect.Parameter.KEYWORD_ONLY
        # Keywords of newer ARTs, refused by CheckOnlyBackend where this ART lacks them.
        and (name not in NEW_TRAIN_KEYWORDS or name in train_keywords_of_this_art())
    }
    assert list(ours) == list(theirs)
    assert ours == theirs


def test_sft_is_out_of_scope(backend: CheckOnlyBackend, tmp_path: Path) -> None:
    with pytest.raises(NotImplementedError, match="supervised fine-tuning"):
        backend._train_sft(new_model(tmp_path), [], art.types.TrainSFTConfig(), {})


# -- push -----------------------------------------------------------------------------------


async def test_push_copies_the_model_directory(
    backend: CheckOnlyBackend, model: art.TrainableModel, tmp_path: Path
) -> None:
    assert backend.can_push
    await backend.train(model, [group(1.0, 0.0)])
    await backend._experimental_push_to_s3(model, s3_bucket="b", prefix="/runs/")
    pushed = tmp_path / "bucket/b/runs/p/models/m"
    record = json.loads((pushed / "checkpoints/0001" / CHECKPOINT_FILE).read_text())
    assert record["step"] == 1
    assert (pushed / "model.json").is_file()

    # delete=True behaves like `aws s3 sync --delete`: what the source lacks goes.
    await backend._delete_checkpoint_files(model, [1])
    await backend._experimental_push_to_s3(model, s3_bucket="b", prefix="runs", delete=True)
    assert sorted(p.name for p in (pushed / "checkpoints").iterdir()) == ["0001"]


async def test_push_without_push_dir_is_not_implemented(tmp_path: Path) -> None:
    backend = CheckOnlyBackend(path=tmp_path / "art")
    m = new_model(tmp_path)
    await m.register(backend)
    assert not backend.can_push
    with pytest.raises(NotImplementedError, match="push_dir"):
        await backend._experimental_push_to_s3(m)


# -- model.log --------------------------------------------------------------------------------


async def test_model_log_accepts_the_result(
    backend: CheckOnlyBackend, model: art.TrainableModel
) -> None:
    groups = [group(1.0, 0.0, scenario_id="s1"), group(0.5, 0.5)]
    result = await backend.train(model, groups)
    await model.log(groups, metrics=result.metrics, step=result.step, split="train")

    model_dir = Path(backend.path) / "p/models/m"
    assert (model_dir / "trajectories/train/0001.parquet").is_file()
    rows = [json.loads(line) for line in (model_dir / "history.jsonl").read_text().splitlines()]
    row = rows[-1]
    assert row["step"] == 1
    assert row["train/num_groups"] == 2
    assert row["train/num_groups_skipped_no_reward_spread"] == 1
    assert row["data/step_num_groups_trainable"] == 1
    assert row["train/reward"] == pytest.approx(0.5)
    assert await model.get_step() == 1
