"""`TrainingConfig`: how a run is shaped, validated before anything runs."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from artstore.errors import ConfigurationError
from artstore.eventstore.blobs import canonical_json


def check_count(name: str, value: Any, *, allow_zero: bool = False) -> None:
    """Refuse anything but a whole number > 0 (>= 0 with `allow_zero`); bools included."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigurationError(f"{name} must be a whole number, got {value!r}")
    if value < 0 or (value == 0 and not allow_zero):
        kind = "non-negative" if allow_zero else "positive"
        raise ConfigurationError(f"{name} must be {kind}, got {value}")


@dataclass
class TrainingConfig:
    """How a run is shaped: epochs, batches, groups, validation, plus what the store needs.

    - `epochs`: passes over the scenarios (may grow when a finished run is resumed);
    - `batch_size`: scenarios per train step;
    - `group_size`: rollouts per scenario (a trajectory group);
    - `validation_samples`: rollouts of the validation model per scenario, when one is
      given, against which each trajectory's `wins` and `win_rate` are computed;
    - `scorer`: the name under which the run's rewards are recorded and trained on;
    - `train_kwargs`: passed to `backend.train` (learning_rate, ...); JSON, as it is recorded;
    - `rollouts`: who rolls out, `"in_process"` (this process, batch by batch: the default)
      or `"workers"` (rollout workers on any hosts, `artstore worker`; PostgreSQL only);
    - `max_steps_off_policy`: with workers, how many batches past the one being trained
      they may roll out, so that no rollout is trained more than this many steps after
      the policy step it ran at (0: every batch rolled out by the policy that trains it).
    """

    epochs: int
    batch_size: int
    group_size: int
    validation_samples: int = 2
    scorer: str = "reward"
    train_kwargs: dict[str, Any] = field(default_factory=dict)
    rollouts: Literal["in_process", "workers"] = "in_process"
    max_steps_off_policy: int = 1

    def __post_init__(self) -> None:
        check_count("epochs", self.epochs)
        check_count("batch_size", self.batch_size)
        check_count("group_size", self.group_size)
        check_count("validation_samples", self.validation_samples, allow_zero=True)
        check_count("max_steps_off_policy", self.max_steps_off_policy, allow_zero=True)
        if self.rollouts not in ("in_process", "workers"):
            raise ConfigurationError(
                f"rollouts must be 'in_process' or 'workers', got {self.rollouts!r}"
            )
        if not isinstance(self.scorer, str) or not self.scorer.strip():
            raise ConfigurationError(f"scorer must be a non-empty name, got {self.scorer!r}")
        if not isinstance(self.train_kwargs, dict):
            raise ConfigurationError("train_kwargs must be a dict of backend.train arguments")
        try:
            canonical_json(self.train_kwargs)
        except (TypeError, ValueError) as exc:
            raise ConfigurationError(
                f"train_kwargs must be JSON-serializable (they are recorded with the run): {exc}"
            ) from None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)
