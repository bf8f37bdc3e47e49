"""A CPU stand-in for ART's trainers: checks trajectory groups, advances the step, trains nothing.

`CheckOnlyBackend` implements the `art.Backend` protocol (art/backend.py) the way
`art.LocalBackend` does (art/local/backend.py), minus the GPU:

- `train` validates every group as ART's tokenizer would need it (trainable `Choice`
  objects with logprobs; on ART >= 0.5.20, trajectories of captured exchanges tokenized
  by ART itself from the inference server's token ids, as its trainer does), computes
  ART's group-relative advantages, and advances the step by writing a checkpoint
  directory. No weights exist and none are updated; the metrics
  say so (`data/step_num_gradient_steps` is 0) and contain no invented loss.
- The step lives on disk exactly where LocalBackend keeps it,
  `<path>/<project>/models/<name>/checkpoints/<step:04d>/`, and `_get_step` is the highest
  such directory, so it survives the process (the training loop is crash-tested on that).
- Inference is not served here: `_prepare_backend_for_training` returns the URL and key
  given to the constructor (a local OpenAI-compatible test server, for instance).

`art` itself is imported lazily (it is slow to import). ART's advantages are computed by
`artstore.advantages.group_advantages`, which `artstore replay --dry-run` and the analysis
pages use without a backend.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import os
import shutil
import tempfile
import time
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from artstore.advantages import group_advantages
from artstore.art_api import art_module
from artstore.art_versions import (
    NEW_TRAIN_KEYWORDS,
    check_exchange_trajectory,
    has_exchange_data,
    lineage_name,
    train_keywords_of_this_art,
)

if TYPE_CHECKING:
    from art import dev
    from art.model import Model, TrainableModel
    from art.trajectories import Trajectory, TrajectoryGroup
    from art.types import LocalTrainResult, TrainSFTConfig

__all__ = [
    "CHECKPOINT_FILE",
    "NO_SERVER_BASE_URL",
    "CheckOnlyBackend",
    "TrajectoryCheckError",
    "group_advantages",
    "trajectory_digest",
]

#: File written into every checkpoint directory (the step's record: metrics, advantages).
CHECKPOINT_FILE = "check_only.json"

#: Returned as the inference URL when the backend was given none: the discard port on the
#: loopback interface, where nothing listens, so a stray inference call fails fast with a
#: connection error instead of reaching some unrelated server.
NO_SERVER_BASE_URL = "http://127.0.0.1:9/v1"

# How many problems a TrajectoryCheckError lists before summarising the rest.
_MAX_REPORTED_PROBLEMS = 10


def trajectory_digest(trajectory: Trajectory) -> str:
    """A hash of a trajectory's conversation (messages and choices, additional histories,
    tools), blind to its ids, reward, metadata and times."""
    conversation = trajectory.model_dump(
        mode="json", include={"messages_and_choices", "additional_histories", "tools"}
    )
    text = json.dumps(conversation, sort_keys=True, separators=(",", ":"), allow_nan=True)
    return hashlib.sha256(text.encode()).hexdigest()


class TrajectoryCheckError(ValueError):
    """Some trajectories cannot be trained on; `problems` holds one line per trajectory."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        shown = problems[:_MAX_REPORTED_PROBLEMS]
        more = len(problems) - len(shown)
        lines = [f"{len(problems)} trajectories cannot be trained on:", *shown]
        if more:
            lines.append(f"... and {more} more")
        lines.append(
            "ART trains only on openai Choice objects carrying logprobs "
            "(openai.types.chat.chat_completion.Choice). Trajectory.model_validate() leaves "
            "choices as plain dicts: rebuild them as Choice objects, or pass "
            "allow_training_without_logprobs=True to train on plain assistant messages."
        )
        super().__init__("\n".join(lines))


def _looks_like_serialized_choice(item: dict[str, Any]) -> bool:
    """A dumped Choice: {"finish_reason", "index", "logprobs", "message"}, no "role"."""
    return "role" not in item and "message" in item and ("logprobs" in item or "index" in item)


def _check_trajectory(
    trajectory: Trajectory, allow_without_logprobs: bool, inference_name: str
) -> tuple[str, int]:
    """Return (problem or "", trainable token count) for one trajectory.

    A trajectory of ART's captured exchanges (ART >= 0.5.20) is checked as ART's trainer
    tokenizes it (`check_exchange_trajectory`): exact inference-provided token ids,
    logprobs on every sampled token; one that also holds legacy histories is refused, as
    ART refuses it.

    A trajectory is trainable when one of its histories (the main one and
    `additional_histories`, as ART tokenizes them) holds a trainable assistant turn: a
    `Choice` with logprob tokens, or, with `allow_without_logprobs`, any `Choice` or plain
    assistant dict (art/preprocessing/tokenize.py, lines 331-346). Plain assistant dicts are
    fine as context (few-shot turns); they only matter when nothing else is trainable. A
    Choice serialised to a dict has no "role" and would crash ART's tokenizer (KeyError), so
    it is always a problem.
    """

    if has_exchange_data(trajectory):
        if (
            trajectory.messages_and_choices
            or trajectory.tools is not None
            or trajectory.additional_histories
        ):
            return (
                "it holds both captured exchanges and legacy histories "
                "(messages_and_choices, tools, additional_histories), which ART refuses",
                0,
            )
        return check_exchange_trajectory(
            trajectory, inference_name, allow_training_without_logprobs=allow_without_logprobs
        )
    histories = [
        ("messages_and_choices", trajectory.messages_and_choices),
        *(
            (f"additional_histories[{h}].messages_and_choices", history.messages_and_choices)
            for h, history in enumerate(trajectory.additional_histories)
        ),
    ]
    fatal: list[str] = []
    notes: list[str] = []
    trainable = False
    tokens = 0
    for where, items in histories:
        for k, item in enumerate(items):
            item_trainable, item_tokens, note, problem = _check_item(
                f"{where}[{k}]", item, allow_without_logprobs
            )
            trainable = trainable or item_trainable
            tokens += item_tokens
            notes.extend([note] if note else [])
            fatal.extend([problem] if problem else [])
    if fatal:
        return "; ".join(fatal), tokens
    if not trainable:
        what = "no trainable assistant message"
        if not allow_without_logprobs:
            what = "no trainable Choice with logprobs"
        detail = "; ".join(notes) if notes else "it has no assistant turn at all"
        return f"{what} ({detail})", tokens
    return "", tokens


def _check_item(
    label: str, item: Any, allow_without_logprobs: bool
) -> tuple[bool, int, str | None, str | None]:
    """One item of a history: (trainable, its logprob tokens, a note on why it is not
    trainable, a problem that makes the whole trajectory untrainable)."""
    from openai.types.chat.chat_completion import Choice

    if isinstance(item, Choice):
        logprobs = item.logprobs
        token_logprobs = (logprobs.content or logprobs.refusal or []) if logprobs else []
        if token_logprobs:
            return True, len(token_logprobs), None, None
        if allow_without_logprobs:
            return True, 0, None, None
        if logprobs is None:
            return False, 0, f"{label} is a Choice without logprobs", None
        return False, 0, f"{label} is a Choice whose logprobs hold no tokens", None
    if isinstance(item, dict):
        if _looks_like_serialized_choice(item):
            return (
                False,
                0,
                None,
                f"{label} is a Choice serialised as a plain dict "
                "(keys message/logprobs, no role), which is not trainable",
            )
        if item.get("role") == "assistant":
            if allow_without_logprobs:
                return True, 0, None, None
            return False, 0, f"{label} is an assistant message as a plain dict", None
        return False, 0, None, None
    return (
        False,
        0,
        None,
        f"{label} is a {type(item).__name__}, neither a message dict nor an openai Choice",
    )


# What a step does not record of `train`'s arguments: those that are not keyword arguments
# of the trainer, the two that must be None, and `verbose`.
_NOT_RECORDED = frozenset(
    {"self", "model", "trajectory_groups", "loss_fn_config", "adam_params", "verbose"}
)


@dataclass
class _CheckedGroups:
    """The groups of a train step, checked, with ART's advantages and what it would train."""

    advantages: list[list[float]] = field(default_factory=list)
    tokens: int = 0
    trainable_trajectories: int = 0
    groups_trainable: int = 0
    groups_no_spread: int = 0
    groups_empty: int = 0
    rewards: list[float] = field(default_factory=list)
    abs_advantages: list[float] = field(default_factory=list)


def _check_groups(
    groups: list[TrajectoryGroup],
    allow_training_without_logprobs: bool,
    inference_name: str,
    *,
    scale_rewards: bool,
) -> _CheckedGroups:
    """Every trajectory of every group checked (TrajectoryCheckError lists each problem),
    and ART's advantages of each group."""
    problems: list[str] = []
    checked = _CheckedGroups()
    for g, group in enumerate(groups):
        trajectories = list(group.trajectories)
        rewards = [t.reward for t in trajectories]
        for t, reward in enumerate(rewards):
            if not math.isfinite(reward):
                problems.append(f"group {g}, trajectory {t}: reward is {reward!r}")
        checks = [
            _check_trajectory(trajectory, allow_training_without_logprobs, inference_name)
            for trajectory in trajectories
        ]
        problems.extend(
            f"group {g}, trajectory {t}: {problem}"
            for t, (problem, _) in enumerate(checks)
            if problem
        )
        if problems:
            checked.advantages.append([])
            continue  # keep checking the rest, to report every problem at once
        group_adv = group_advantages(rewards, scale_rewards=scale_rewards)
        checked.advantages.append(group_adv)
        checked.rewards.extend(rewards)
        if not trajectories:
            checked.groups_empty += 1
        elif not any(group_adv):
            checked.groups_no_spread += 1
        else:
            checked.groups_trainable += 1
        for advantage, (_, tokens) in zip(group_adv, checks, strict=True):
            # ART drops zero-advantage trajectories before tokenizing (tokenize.py:257).
            if advantage != 0:
                checked.trainable_trajectories += 1
                checked.tokens += tokens
                checked.abs_advantages.append(abs(advantage))
    if problems:
        raise TrajectoryCheckError(problems)
    return checked


def _step_metrics(
    groups: list[TrajectoryGroup],
    checked: _CheckedGroups,
    started: float,
    train_kwargs: dict[str, Any],
) -> dict[str, float]:
    """ART's own step metrics (what LocalBackend.train returns, so dashboards match), and
    this backend's accounting (logged as train/<name> by model.log)."""
    taxonomy = art_module("metrics_taxonomy")

    rewards = checked.rewards
    reward_mean = sum(rewards) / len(rewards) if rewards else 0.0
    reward_std = (
        math.sqrt(sum((r - reward_mean) ** 2 for r in rewards) / len(rewards)) if rewards else 0.0
    )
    return {
        **taxonomy.build_training_summary_metrics(
            taxonomy.summarize_trajectory_groups(groups), include_trainable_groups=True
        ),
        "data/step_trainer_tokens": float(checked.tokens),
        # Honest: no gradient step is taken, and there is no loss to report.
        taxonomy.TRAIN_GRADIENT_STEPS_KEY: 0.0,
        "time/step_trainer_s": time.monotonic() - started,
        "num_groups": float(len(groups)),
        "num_groups_trainable": float(checked.groups_trainable),
        "num_groups_skipped_no_reward_spread": float(checked.groups_no_spread),
        "num_groups_empty": float(checked.groups_empty),
        "num_trajectories": float(sum(len(group.trajectories) for group in groups)),
        "num_trajectories_trainable": float(checked.trainable_trajectories),
        "num_trainable_tokens": float(checked.tokens),
        "mean_abs_advantage": (
            sum(checked.abs_advantages) / len(checked.abs_advantages)
            if checked.abs_advantages
            else 0.0
        ),
        "reward_mean": reward_mean,
        "reward_std": reward_std,
        "learning_rate": float(train_kwargs["learning_rate"]),
        "scale_rewards": float(train_kwargs["scale_rewards"]),
    }


class CheckOnlyBackend:
    """An `art.Backend` that checks trajectory groups like ART's trainer and updates no weights.

    Use it where no GPU is available (tests, the offline demo). Its on-disk layout is
    LocalBackend's, so `model.get_step()` and `model.log()` behave as they would there.

    Pushing: `_experimental_push_to_s3` copies the model directory into `push_dir`, a local
    stand-in for an S3 bucket. It is always defined (as on LocalBackend) but raises
    `NotImplementedError` when no `push_dir` was given; check `can_push` before calling.

    SFT (`_train_sft`) is out of scope and raises `NotImplementedError`.
    """

    def __init__(
        self,
        *,
        path: str | Path = ".art",
        inference_base_url: str | None = None,
        inference_api_key: str | None = None,
        push_dir: str | Path | None = None,
    ) -> None:
        # Absolute, so that every process (and a test that changes directory) agrees.
        self._path = os.path.abspath(os.fspath(path))
        os.makedirs(self._path, exist_ok=True)
        self.inference_base_url = inference_base_url
        self.inference_api_key = inference_api_key
        self.push_dir: Path | None = Path(push_dir).absolute() if push_dir is not None else None
        #: Advantages of the last `train` call, one list per group in input order
        #: (zeros for groups without reward spread, [] for groups without trajectories).
        self.last_advantages: list[list[float]] = []
        #: Metrics of the last `train` call (also in the returned result).
        self.last_metrics: dict[str, float] = {}

    # -- context manager and lifecycle --------------------------------------------------

    @property
    def path(self) -> str:
        """The art directory (LocalBackend's `path`); models live under it."""
        return self._path

    @property
    def can_push(self) -> bool:
        """True when `_experimental_push_to_s3` has somewhere to copy to."""
        return self.push_dir is not None

    async def __aenter__(self) -> CheckOnlyBackend:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Nothing to release: no server, no child process, no GPU memory."""

    def supports_automatic_train_step_metrics(self) -> bool:
        # Like LocalBackend: lets model.log add `time/step_wall_s` for train steps.
        return True

    # -- registration and inference ------------------------------------------------------

    def model_dir(self, model: Model) -> Path:
        """`<path>/<project>/models/<lineage>`, as art.utils.output_dirs.get_model_dir.

        The lineage is `run_name` on ART >= 0.5.20 and `name` on 0.5.18.
        """
        return Path(self._path) / model.project / "models" / lineage_name(model)

    def checkpoint_dir(self, model: Model, step: int) -> Path:
        """`<model dir>/checkpoints/<step:04d>`, as get_step_checkpoint_dir."""
        return self.model_dir(model) / "checkpoints" / f"{step:04d}"

    async def register(self, model: Model) -> None:
        """Point the model's logging at this backend's directory and write model.json.

        As LocalBackend.register, without W&B initialisation or Tinker pricing (neither
        means anything here; `model.log` still reports to W&B if WANDB_API_KEY is set).
        """
        model.base_path = self._path
        output_dir = self.model_dir(model)
        output_dir.mkdir(parents=True, exist_ok=True)
        (output_dir / "model.json").write_text(json.dumps(model.model_dump(mode="json")))

    def _model_inference_name(self, model: Model, step: int | None = None) -> str:
        """`name@step`, as LocalBackend (vLLM serves LoRA adapters as `name@step`).

        With no step, the current step on disk is used, so a fresh model is `name@0`.
        """
        return f"{model.name}@{self._current_step(model) if step is None else step}"

    async def _prepare_backend_for_training(
        self,
        model: TrainableModel,
        config: dev.OpenAIServerConfig | None = None,
    ) -> tuple[str, str]:
        """Create checkpoint 0 if missing (as LocalBackend's service does when it starts the
        inference server) and return the configured inference URL and key."""
        initial = self.checkpoint_dir(model, 0)
        if self._current_step(model) == 0 and not initial.exists():
            self._write_checkpoint(model, 0, {"step": 0, "initial": True})
        server_args: dict[str, Any] = dict((config or {}).get("server_args", {}))
        api_key = self.inference_api_key or server_args.get("api_key") or "default"
        return self.inference_base_url or NO_SERVER_BASE_URL, api_key

    # -- steps and checkpoints ----------------------------------------------------------

    def _current_step(self, model: Model) -> int:
        # art.utils.get_model_step.get_step_from_dir: the highest all-digit checkpoint dir.
        if not getattr(model, "trainable", False):
            return 0
        checkpoints = self.model_dir(model) / "checkpoints"
        if not checkpoints.is_dir():
            return 0
        return max(
            (int(d.name) for d in checkpoints.iterdir() if d.is_dir() and d.name.isdigit()),
            default=0,
        )

    async def _get_step(self, model: TrainableModel) -> int:
        return self._current_step(model)

    def read_checkpoint(self, model: Model, step: int) -> dict[str, Any]:
        """The record written for `step` (metrics, advantages, train arguments)."""
        return json.loads((self.checkpoint_dir(model, step) / CHECKPOINT_FILE).read_text())

    def _write_checkpoint(self, model: Model, step: int, record: dict[str, Any]) -> Path:
        """Write `<step:04d>/check_only.json` atomically: build it in a hidden temporary
        directory, then rename. A SIGKILL leaves either the whole step or none of it (the
        temporary name is not all digits, so `_get_step` ignores leftovers)."""
        target = self.checkpoint_dir(model, step)
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".tmp-{step:04d}-", dir=target.parent))
        try:
            with open(staging / CHECKPOINT_FILE, "w") as f:
                json.dump(record, f, indent=2, sort_keys=True)
                f.flush()
                os.fsync(f.fileno())
            try:
                os.rename(staging, target)
            except OSError as e:
                raise RuntimeError(
                    f"checkpoint {target} already exists: was the same model trained "
                    "concurrently by another process?"
                ) from e
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        return target

    async def _delete_checkpoint_files(
        self, model: TrainableModel, steps_to_keep: list[int]
    ) -> None:
        """Delete every checkpoint not in `steps_to_keep`, as art.local.checkpoints.

        Like LocalBackend, this deletes the latest step too if it is not kept, which lowers
        `_get_step` (TrainableModel.delete_checkpoints always keeps the latest).
        """
        checkpoints = self.model_dir(model) / "checkpoints"
        if not checkpoints.is_dir():
            return
        keep = set(steps_to_keep)
        for d in checkpoints.iterdir():
            if d.is_dir() and d.name.isdigit() and int(d.name) not in keep:
                shutil.rmtree(d)

    # -- training -------------------------------------------------------------------------

    async def train(
        self,
        model: TrainableModel,
        trajectory_groups: Iterable[TrajectoryGroup],
        *,
        # The keyword arguments and defaults of LocalBackend.train; anything else is a
        # TypeError, as it would be there. Those of `NEW_TRAIN_KEYWORDS` exist on ART >=
        # 0.5.20 only: given another value on 0.5.18, they are refused as 0.5.18 would.
        learning_rate: float = 5e-6,
        loss_fn: Literal["cispo", "ppo"] = "cispo",
        loss_fn_config: dict | None = None,
        normalize_advantages: bool = True,
        adam_params: object | None = None,
        kl_penalty_coef: float = 0.0,
        kl_penalty_reference_step: int | None = None,
        kl_ref_adapter_path: str | None = None,
        kl_penalty_source: Literal["current_learner", "sample"] = "current_learner",
        epsilon: float | None = None,
        epsilon_high: float | None = None,
        advantage_balance: float = 0.0,
        scale_rewards: bool = True,
        importance_sampling_level: Literal[
            "token", "sequence", "average", "geometric_average"
        ] = "token",
        max_negative_advantage_importance_sampling_weight: float | None = None,
        mask_prob_ratio: bool = False,
        kimi_k2_tau: float | None = None,
        precalculate_logprobs: bool = False,
        allow_training_without_logprobs: bool = False,
        plot_tensors: bool = False,
        truncated_importance_sampling: float | None = None,
        scale_learning_rate_by_reward_std_dev: bool = False,
        logprob_calculation_chunk_size: int = 1024,
        packed_sequence_length: int | None = None,
        num_trajectories_learning_rate_multiplier_power: float = 0.0,
        save_checkpoint: bool = True,
        optimizer_save_interval: int = 5,
        final_training_step: int | None = None,
        grad_accumulation_sequences: int | None = None,
        verbose: bool = False,
    ) -> LocalTrainResult:
        """Check the groups, compute ART's advantages, and advance the step by one.

        Raises `TrajectoryCheckError` (a ValueError) naming each group/trajectory that has
        no trainable Choice with logprobs (unless `allow_training_without_logprobs`), or
        that holds a Choice serialised as a dict. Unlike ART, which silently drops such
        trajectories (and never looks at zero-advantage ones), every trajectory of every
        group is checked: an untrainable trajectory here is a bug upstream.

        The step advances even when no group is trainable, as LocalBackend's does (it copies
        the current checkpoint to the next step, art/local/backend.py lines 868-923). As
        there, `save_checkpoint=False` still writes the step directory (the step is the
        directory) and only makes `checkpoint_path` None.
        """
        arguments = dict(locals())  # first: the keyword arguments, as given
        started = time.monotonic()
        groups = list(trajectory_groups)
        train_kwargs = self._checked_train_kwargs(model, arguments)
        checked = _check_groups(
            groups,
            allow_training_without_logprobs,
            self._model_inference_name(model),
            scale_rewards=train_kwargs["scale_rewards"],
        )
        metrics = _step_metrics(groups, checked, started, train_kwargs)
        step, checkpoint = self._record_step(model, groups, checked, metrics, train_kwargs)
        if verbose:
            print(
                f"[CheckOnlyBackend] step {step}: {checked.groups_trainable}/{len(groups)} "
                f"groups trainable, {checked.trainable_trajectories} trajectories, "
                f"{checked.tokens} tokens"
            )
        return art_module("types").LocalTrainResult(
            step=step,
            metrics=metrics,
            checkpoint_path=str(checkpoint) if save_checkpoint else None,
        )

    def _record_step(
        self,
        model: TrainableModel,
        groups: list[TrajectoryGroup],
        checked: _CheckedGroups,
        metrics: dict[str, float],
        train_kwargs: dict[str, Any],
    ) -> tuple[int, Path]:
        """The next step, written as its checkpoint directory: (the step, the directory)."""
        # No await between reading the step and writing the next one, so concurrent train
        # calls in one event loop cannot race; another process loses at the rename.
        step = self._current_step(model) + 1
        checkpoint = self._write_checkpoint(
            model,
            step,
            {
                "step": step,
                "parent_step": step - 1,
                "backend": type(self).__name__,
                "created_at": datetime.now(UTC).isoformat(),
                "metrics": metrics,
                "advantages": checked.advantages,
                # Group metadata lets a reconciler see which groups made this step.
                "group_metadata": [dict(group.metadata) for group in groups],
                # What each trajectory says, hashed: a copy trained again under other ids
                # is still seen as trained twice (tests/matrix/invariants.py).
                "trajectory_digests": [
                    [trajectory_digest(t) for t in group.trajectories] for group in groups
                ],
                "train_kwargs": train_kwargs,
            },
        )
        self.last_advantages = checked.advantages
        self.last_metrics = metrics
        return step, checkpoint

    def _checked_train_kwargs(self, model: Model, arguments: dict[str, Any]) -> dict[str, Any]:
        """The keyword arguments of `train` as the step records them, refused where
        LocalBackend.train refuses them (a keyword this ART's trainer does not take is a
        TypeError, as it would be there)."""
        for keyword, default in NEW_TRAIN_KEYWORDS.items():
            if keyword not in train_keywords_of_this_art() and arguments[keyword] != default:
                raise TypeError(f"train() got an unexpected keyword argument {keyword!r}")
        # Argument checks of LocalBackend.train.
        if arguments["loss_fn"] not in {"cispo", "ppo"}:
            raise ValueError(
                "CheckOnlyBackend, like LocalBackend, only supports loss_fn='cispo' or 'ppo'."
            )
        if arguments["loss_fn_config"] is not None:
            raise ValueError("CheckOnlyBackend, like LocalBackend, requires loss_fn_config=None.")
        if arguments["adam_params"] is not None:
            raise ValueError("CheckOnlyBackend, like LocalBackend, requires adam_params=None.")
        if arguments["kl_penalty_source"] not in {"current_learner", "sample"}:
            raise ValueError("kl_penalty_source must be 'current_learner' or 'sample'")
        reference_step = arguments["kl_penalty_reference_step"]
        if arguments["kl_ref_adapter_path"] is None and reference_step is not None:
            reference = self.checkpoint_dir(model, reference_step)
            if not reference.is_dir():
                raise FileNotFoundError(f"KL reference checkpoint {reference} does not exist")
        recorded = {
            keyword: value
            for keyword, value in arguments.items()
            if keyword not in _NOT_RECORDED and keyword not in NEW_TRAIN_KEYWORDS
        }
        if not arguments["normalize_advantages"]:
            recorded["scale_rewards"] = False
        new = train_keywords_of_this_art()
        return recorded | {k: arguments[k] for k in NEW_TRAIN_KEYWORDS if k in new}

    def _train_sft(
        self,
        model: TrainableModel,
        trajectories: Iterable[Trajectory],
        config: TrainSFTConfig,
        dev_config: dev.TrainSFTConfig,
        verbose: bool = False,
    ) -> AsyncIterator[dict[str, float]]:
        """SFT is out of scope for artstore; raises at call time, before any iteration."""
        raise NotImplementedError(
            "CheckOnlyBackend does not support supervised fine-tuning (_train_sft): "
            "artstore trains with RL only (backend.train)."
        )

    # -- "S3" -----------------------------------------------------------------------------

    def push_destination(
        self, model: Model, *, s3_bucket: str | None = None, prefix: str | None = None
    ) -> Path | None:
        """Where `_experimental_push_to_s3` copies the model (None without `push_dir`)."""
        if self.push_dir is None:
            return None
        destination = self.push_dir
        if s3_bucket:
            destination /= s3_bucket
        if prefix and prefix.strip("/"):
            destination /= prefix.strip("/")
        return destination / model.project / "models" / lineage_name(model)

    async def _experimental_push_to_s3(
        self,
        model: Model,
        *,
        s3_bucket: str | None = None,
        prefix: str | None = None,
        verbose: bool = False,
        delete: bool = False,
    ) -> None:
        """Copy the model directory (checkpoints, trajectories, history) into `push_dir`.

        A local stand-in for LocalBackend's `aws s3 sync` to
        `s3://<bucket>/<prefix>/<project>/models/<name>`: the destination is
        `<push_dir>/[<s3_bucket>/][<prefix>/]<project>/models/<name>`. `delete=True` removes
        destination files that are not in the source, as `aws s3 sync --delete` does (that
        is what ART passes `delete` to, whatever its docstring says).
        """
        if self.push_dir is None:
            raise NotImplementedError(
                "CheckOnlyBackend was created without push_dir, so it has nowhere to push "
                "to; pass push_dir=... (a local directory standing in for S3) or check "
                "backend.can_push before calling _experimental_push_to_s3."
            )
        source = self.model_dir(model)
        if not source.exists():
            raise FileNotFoundError(f"Local model directory {source} does not exist.")
        destination = self.push_destination(model, s3_bucket=s3_bucket, prefix=prefix)
        await asyncio.to_thread(_sync_dirs, source, destination, delete)
        if verbose:
            print(f"[CheckOnlyBackend] pushed {source} to {destination}")


def _sync_dirs(source: Path, destination: Path, delete: bool) -> None:
    """Copy `source` over `destination`; with `delete`, drop what `source` lacks."""
    destination.mkdir(parents=True, exist_ok=True)
    shutil.copytree(source, destination, dirs_exist_ok=True)
    if not delete:
        return
    for root, dirs, files in os.walk(destination, topdown=False):
        relative = Path(root).relative_to(destination)
        for name in files:
            if not (source / relative / name).is_file():
                (Path(root) / name).unlink()
        for name in dirs:
            if not (source / relative / name).is_dir():
                shutil.rmtree(Path(root) / name, ignore_errors=True)
