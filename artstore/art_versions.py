"""Which ART needs what: the one module that looks at the installed ART's version.

artstore supports two lines of `openpipe-art` 0.5, and every other module has one code path:

- ART 0.5.18 (Python 3.11): `TrainableModel` has no `run_name` (checkpoints live under
  `name`); `History` is the class of `additional_histories`; no `Trajectory.exchanges`;
  parquet logs are format 1 (no logprobs); zero reward variance means equal rewards.
- ART 0.5.20 and later (Python >= 3.12; 0.5.23 tested): `TrainableModel(run_name=...)` is
  required and names the checkpoint lineage (`name` is the serving alias); `LegacyHistory`
  replaced `History` for `additional_histories`; `Trajectory.exchanges` holds ART's own
  capture of raw requests and responses; parquet format 2 is lossless; `PipelineTrainer`
  (whose LocalBackend check imports torch); `LocalBackend.train` takes more keywords;
  `LocalTrainResult.checkpoint_ready` (the checkpoint path is recorded as returned);
  rewards within 1e-12 count as equal.
- Both: `backend.train(model, groups, **kwargs) -> TrainResult(step, metrics)`, then
  `model.log(groups, metrics=..., step=..., split="train")`; `model.get_step()` is the
  backend's step; RULER refuses trajectories with `additional_histories`; the exceptions
  of a `TrajectoryGroup` are set after construction (0.5.18's constructor takes raised
  exceptions only).

Nothing here imports `art` at module import: the version comes from the package metadata,
and ART's classes are imported when a function asks for them.
"""

from __future__ import annotations

import os
from functools import cache
from importlib import metadata
from typing import TYPE_CHECKING, Any

# LiteLLM (imported by ART) fetches a price map from the network at import unless told not to.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

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
    import art

    if has_exchanges():
        fields.setdefault("run_name", name)
    else:
        fields.pop("run_name", None)
    return art.TrainableModel(name=name, project=project, base_model=base_model, **fields)


# --- trajectories -------------------------------------------------------------------------


def history_class() -> type:
    """The class of `Trajectory.additional_histories` items (`LegacyHistory` on new ART)."""
    import art.trajectories as trajectories

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
        from art.trajectories import TrajectoryExchanges
        from pydantic import ValidationError

        try:
            TrajectoryExchanges.model_validate(data)
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
        from artstore.errors import ArtVersionError

        raise ArtVersionError(
            f"{where} holds ART's captured exchanges (raw LLM requests and responses), which "
            f"ART {'.'.join(map(str, art_version()))} cannot represent: they are stored whole; "
            "read this trajectory with openpipe-art >= 0.5.20 (Python >= 3.12)"
        )
    from art.trajectories import TrajectoryExchanges

    return TrajectoryExchanges.model_validate(data)


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
