"""`TrainingConfig`: the seed's settings, validated before anything runs."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from artstore.errors import ConfigurationError


def _positive_int(name: str, value: Any, *, allow_zero: bool = False) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigurationError(f"{name} must be a whole number, got {value!r}")
    if value < 0 or (value == 0 and not allow_zero):
        kind = "non-negative" if allow_zero else "positive"
        raise ConfigurationError(f"{name} must be {kind}, got {value}")


@dataclass
class TrainingConfig:
    """How a run is shaped: as the seed's `TrainingConfig`, plus what the store needs.

    - `epochs`: passes over the scenarios;
    - `batch_size`: scenarios per train step;
    - `group_size`: rollouts per scenario (a trajectory group);
    - `validation_samples`: rollouts of the validation model per scenario, when one is
      given, against which each trajectory's `wins` and `win_rate` are computed;
    - `scorer`: the name under which the run's rewards are recorded and trained on;
    - `train_kwargs`: passed to `backend.train` (learning_rate, ...).
    """

    epochs: int
    batch_size: int
    group_size: int
    validation_samples: int = 2
    scorer: str = "reward"
    train_kwargs: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _positive_int("epochs", self.epochs)
        _positive_int("batch_size", self.batch_size)
        _positive_int("group_size", self.group_size)
        _positive_int("validation_samples", self.validation_samples, allow_zero=True)
        if not isinstance(self.scorer, str) or not self.scorer.strip():
            raise ConfigurationError(f"scorer must be a non-empty name, got {self.scorer!r}")
        if not isinstance(self.train_kwargs, dict):
            raise ConfigurationError("train_kwargs must be a dict of backend.train arguments")

    def to_json(self) -> dict[str, Any]:
        return asdict(self)
