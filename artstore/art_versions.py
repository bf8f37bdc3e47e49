"""Which ART needs what: the one module that looks at the installed ART's version.

artstore supports two lines of `openpipe-art` 0.5, and every other module has one code path:

- ART 0.5.18 (Python 3.11): `TrainableModel` has no `run_name` (checkpoints live under
  `name`); `History` is the class of `additional_histories`; no `Trajectory.exchanges`;
  parquet logs are format 1 (no logprobs); zero reward variance means equal rewards.
- ART 0.5.20 and later (Python >= 3.12; 0.5.23 tested): `TrainableModel(run_name=...)` is
  required and names the checkpoint lineage (`name` is the serving alias); `LegacyHistory`
  replaced `History` for `additional_histories`; `Trajectory.exchanges` holds ART's own
  capture of raw requests and responses (hooks on httpx inside `art.trajectory(...)`), and
  its trainer trains exchange trajectories on inference-provided token ids only;
  `model.openai_client()` asks vLLM for token ids and attaches them (and exact completion
  token counts) to each returned `Choice`; parquet format 2 is lossless; `PipelineTrainer`
  (whose LocalBackend check imports torch); `LocalBackend.train` takes more keywords;
  `LocalTrainResult.checkpoint_ready` (the checkpoint path is recorded as returned);
  rewards within 1e-12 count as equal.
- Both: `backend.train(model, groups, **kwargs) -> TrainResult(step, metrics)`, then
  `model.log(groups, metrics=..., step=..., split="train")`; `model.get_step()` is the
  backend's step; RULER refuses trajectories with `additional_histories`; the exceptions
  of a `TrajectoryGroup` are set after construction (0.5.18's constructor takes raised
  exceptions only).

Nothing here imports `art` at module import: the version comes from the package metadata,
and ART's classes and modules come from `artstore.art_api` when a function asks for them.
"""

from __future__ import annotations

import contextvars
import math
from datetime import datetime
from functools import cache
from importlib import metadata
from typing import TYPE_CHECKING, Any

from artstore.art_api import (
    art_module,
    trainable_model_class,
    trajectory_class,
    trajectory_exchanges_class,
)
from artstore.errors import ArtVersionError

if TYPE_CHECKING:
    import art

#: The oldest and the newest `openpipe-art` releases artstore is tested with.
OLDEST_TESTED = (0, 5, 18)
NEWEST_TESTED = (0, 5, 23)
#: The first ART with `run_name`, `Trajectory.exchanges`, `PipelineTrainer` and parquet format 2.
EXCHANGES_ART = (0, 5, 20)


def _parse(version: str) -> tuple[int, ...]:
    parts = []
    for piece in version.split(".")[:3]:
        digits = "".join(c for c in piece if c.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts)


@cache
def art_version() -> tuple[int, ...]:
    """The installed `openpipe-art` version as a tuple, e.g. (0, 5, 23)."""
    return _parse(metadata.version("openpipe-art"))


def has_exchanges() -> bool:
    """ART >= 0.5.20: `Trajectory.exchanges`, `art.trajectory(...)` capture, `run_name`."""
    return art_version() >= EXCHANGES_ART


def has_pipeline_trainer() -> bool:
    """ART >= 0.5.20: `art.pipeline_trainer.PipelineTrainer` (async rollouts and training)."""
    return art_version() >= EXCHANGES_ART


# --- models -------------------------------------------------------------------------------


def lineage_name(model: Any) -> str:
    """The name a trainable model's checkpoints (and steps) live under.

    ART >= 0.5.20 keeps them under `run_name` (`name` is only the serving alias); 0.5.18
    under `name`.
    """
    run_name = getattr(model, "run_name", None)
    return run_name if isinstance(run_name, str) and run_name else model.name


def model_key(model: Any) -> str:
    """`project/<lineage name>`: the trained model a train step and a consumption name."""
    return f"{model.project}/{lineage_name(model)}"


def trainable_model(*, name: str, project: str, base_model: str, **fields: Any):
    """An `art.TrainableModel`, with `run_name` (default: `name`) where ART has it."""
    if has_exchanges():
        fields.setdefault("run_name", name)
    else:
        fields.pop("run_name", None)
    return trainable_model_class()(name=name, project=project, base_model=base_model, **fields)


# --- trajectories -------------------------------------------------------------------------


def history_class() -> type:
    """The class of `Trajectory.additional_histories` items (`LegacyHistory` on new ART)."""
    trajectories = art_module("trajectories")
    return getattr(trajectories, "LegacyHistory", None) or trajectories.History


def has_exchange_data(trajectory: art.Trajectory) -> bool:
    """True when the trajectory holds ART's captured exchanges (never on 0.5.18)."""
    return bool(getattr(trajectory, "exchanges", None))


#: The lists of `Trajectory.exchanges` (ART >= 0.5.20), one per API that ART captures.
EXCHANGE_KINDS = ("chat_completions", "completions", "responses", "messages")


def exchanges_problem(data: Any) -> str | None:
    """What is wrong with the JSON of a `Trajectory.exchanges`, or None.

    Names other than ART's four lists are refused on either ART. ART >= 0.5.20 validates
    the rest with its own `TrajectoryExchanges`; ART 0.5.18 has no such class, so there only
    the shape is checked (lists of objects), and an import keeps them for a newer ART.
    """
    if not isinstance(data, dict):
        return "not a JSON object"
    unknown = [key for key in data if key not in EXCHANGE_KINDS]
    if unknown:  # ART's model would drop them without a word
        kinds = ", ".join(EXCHANGE_KINDS)
        return f"holds {', '.join(map(repr, unknown))}; ART's exchanges are {kinds}"
    if has_exchanges():
        from pydantic import ValidationError

        try:
            trajectory_exchanges_class().model_validate(data)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(part) for part in first["loc"])
            return f"not ART's exchanges ({where}: {first['msg']})"
        return None
    for key, items in data.items():
        if not isinstance(items, list) or not all(isinstance(item, dict) for item in items):
            return f"{key} is not a list of objects"
    return None


def trajectory_exchanges(data: Any, where: str) -> Any:
    """ART's `TrajectoryExchanges` rebuilt from its JSON (ART >= 0.5.20).

    ART 0.5.18 has no `Trajectory.exchanges`: ArtVersionError, naming `where` (the rollout).
    """
    if not has_exchanges():
        raise ArtVersionError(
            f"{where} holds ART's captured exchanges (raw LLM requests and responses), which "
            f"ART {'.'.join(map(str, art_version()))} cannot represent: they are stored whole; "
            "read this trajectory with openpipe-art >= 0.5.20 (Python >= 3.12)"
        )
    return trajectory_exchanges_class().model_validate(data)


def rewards_have_zero_variance(rewards: list[float]) -> bool:
    """ART's test for a group with no reward spread (it trains nothing on such a group).

    0.5.18 computes advantages and drops the exact zeros: a group is flat when all rewards
    are equal. 0.5.20 and later call rewards within 1e-12 of the first one equal.
    """
    if len(rewards) <= 1:
        return True
    if has_exchanges():
        first = rewards[0]
        return all(abs(reward - first) <= 1e-12 for reward in rewards[1:])
    return len(set(rewards)) == 1


# --- backends -----------------------------------------------------------------------------

#: Keywords that `LocalBackend.train` of ART >= 0.5.20 takes besides 0.5.18's, with defaults.
NEW_TRAIN_KEYWORDS: dict[str, Any] = {
    "kl_penalty_source": "current_learner",
    "optimizer_save_interval": 5,
    "final_training_step": None,
    "grad_accumulation_sequences": None,
}


def train_keywords_of_this_art() -> set[str]:
    """The keywords of `NEW_TRAIN_KEYWORDS` that the installed ART's trainer accepts."""
    return set(NEW_TRAIN_KEYWORDS) if has_exchanges() else set()


# --- parquet trajectory logs ----------------------------------------------------------------


def parquet_format_version() -> int:
    """The parquet layout that ART's writer (`model.log`, `artstore export`) produces here.

    2 on ART >= 0.5.20 (each group and trajectory as JSON, lossless: Choice objects with
    their logprobs, additional histories, policy versions, exchanges), 1 on 0.5.18 (flat
    messages: no logprobs, no additional histories, no policy versions). artstore's
    importer reads both on either ART (`artstore.exchange.parquet`).
    """
    return 2 if has_exchanges() else 1


# --- ART's own capture: `Trajectory.exchanges` (ART >= 0.5.20) -------------------------------

#: The endpoints ART's capture knows, by the attribute of `TrajectoryExchanges` holding them.
EXCHANGE_ENDPOINTS = ("chat_completions", "completions", "responses", "messages")


def install_art_capture() -> None:
    """Install ART's own httpx hooks now (ART >= 0.5.20; nothing on 0.5.18).

    artstore's hooks are then installed around ART's, so that when artstore's see a
    response complete, ART's have already put it in the trajectory it captures into.
    """
    if has_exchanges():
        art_module("trajectories._capture").install()


def art_capture_target() -> Any:
    """The `art.Trajectory` ART's own capture would put a call made now into, or None.

    None on ART 0.5.18, outside `art.trajectory(...)` / `with art.Trajectory():`, and inside
    `art.trajectories.no_capture()`.
    """
    if not has_exchanges():
        return None
    return art_module("trajectories").current_trajectory()


def captured_exchanges(trajectory: Any, endpoint: str) -> list[Any]:
    """The exchanges of one endpoint ART captured into `trajectory` so far."""
    return list(getattr(trajectory.exchanges, endpoint, []))


def build_exchange(
    endpoint: str, request: dict[str, Any], body: bytes, *, start_time: datetime, end_time: datetime
) -> Any:
    """ART's own exchange for a request and the response body it got (ART >= 0.5.20)."""
    return art_module("trajectories._protocols").build_exchange(
        endpoint,
        request,
        body,
        start_time=start_time,
        end_time=end_time,
    )


def exchange_trajectory(exchanges: list[Any], **fields: Any) -> art.Trajectory:
    """An `art.Trajectory` holding `exchanges` (and no legacy histories)."""
    grouped: dict[str, list[Any]] = {endpoint: [] for endpoint in EXCHANGE_ENDPOINTS}
    for endpoint, exchange in exchanges:
        grouped[endpoint].append(exchange)
    return trajectory_class()(exchanges=trajectory_exchanges_class()(**grouped), **fields)


# --- ART's `model.openai_client()` ------------------------------------------------------------


def mark_art_client_calls(marker: contextvars.ContextVar[str | None]) -> None:
    """Set `marker` while a call of ART's `model.openai_client()` runs (ART >= 0.5.20).

    That client post-processes each chat completion before returning it (it attaches the
    prompt and completion token ids and an exact completion token count to every
    `Choice`), so what the agent holds is not what the HTTP response alone gives. The
    marker holds the client's policy-span mode, which `art_client_postprocess` needs.
    Installed once; 0.5.18's client returns responses as received.
    """
    if not has_exchanges():
        return
    proxy = art_module("model")._OpenAIChatCompletionsProxy
    if getattr(proxy.create, "_artstore_marks", False):
        return
    original = proxy.create

    async def create(self: Any, *args: Any, **kwargs: Any) -> Any:
        token = marker.set(getattr(self, "_policy_span_mode", "none"))
        try:
            return await original(self, *args, **kwargs)
        finally:
            marker.reset(token)

    create._artstore_marks = True  # type: ignore[attr-defined]
    proxy.create = create


def art_client_postprocess(completion: Any, mode: str, request_model: Any) -> None:
    """What ART's `model.openai_client()` does to a chat completion before returning it."""
    attach_metadata = art_module("model")._attach_response_art_metadata
    attach_metadata(completion, None, mode, request_model)


# --- training exchange trajectories (CheckOnlyBackend) -----------------------------------------


class _TokenizerNeeded(Exception):
    pass


class _NoTokenizer:
    """A tokenizer that refuses to tokenize or render: exchange training must not need it.

    It has no vocabulary either (no `convert_tokens_to_ids`, `decode`): what ART looks up
    there (the model's stop tokens, to add one the server did not return) depends on the
    real tokenizer, which a CPU check does not have.
    """

    name_or_path = "artstore-check-only"

    def _refuse(self, *args: Any, **kwargs: Any) -> Any:
        raise _TokenizerNeeded

    __call__ = apply_chat_template = encode = _refuse


def check_exchange_trajectory(
    trajectory: art.Trajectory, inference_name: str, *, allow_training_without_logprobs: bool
) -> tuple[str, int]:
    """(problem or "", trainable tokens) of an exchange trajectory, as ART's trainer sees it.

    The steps of `tokenize_trajectory_groups` (art/preprocessing/tokenize.py) for a
    trajectory with exchanges: the captured model the trained model serves is selected,
    the exchanges are tokenized from the inference-provided token ids (no tokenizer is
    given: a history that needs local tokenization or a rendered chat template is a
    problem, as ART refuses it), and the first occurrence of each sampled token is
    trainable and must carry a logprob.
    """
    trajectories = art_module("trajectories")
    selection = art_module("trajectories._selection")
    tokenize = art_module("trajectories._tokenize")
    TokenFlag = trajectories.TokenFlag

    try:
        selected = selection.resolve_training_model(
            trajectory, selection.automatic_training_model_selector(inference_name)
        )
        tokenized, _ = tokenize._tokenize_trajectory_with_trace(
            trajectory, model=selected, tokenizer=_NoTokenizer()
        )
    except _TokenizerNeeded:
        return (
            "its exchanges need local tokenization; exchange training requires exact "
            "inference-provided token ids (ask vLLM with return_token_ids)",
            0,
        )
    except (ValueError, TypeError, RuntimeError, LookupError) as exc:
        return f"its exchanges cannot be tokenized: {exc!r}", 0
    if any(not flag & TokenFlag.EXACT for h in tokenized.histories for flag in h.flags):
        return "exchange training requires exact inference-provided token ids", 0
    occurrences = trajectories._FirstOccurrenceTrie()
    tokens = 0
    for history in tokenized.histories:
        trainable = occurrences.mask(
            history.model, history.tokens, history.flags, where=TokenFlag.SAMPLED
        )
        try:
            tokenize._require_causal_predecessor(trainable)
        except ValueError as exc:
            return str(exc), 0
        if not allow_training_without_logprobs and any(
            selected_token and math.isnan(logprob)
            for selected_token, logprob in zip(trainable, history.logprobs, strict=True)
        ):
            return "its exchanges are missing logprobs for trainable tokens", 0
        tokens += sum(trainable)
    if not tokens:
        return "its exchanges hold no sampled token to train on", 0
    return "", tokens
