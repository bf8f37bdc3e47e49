"""What a training run is made of: how each of its groups is made (`Recipe`), and what a
call of `run_training` did (`RunSummary`). Shared by the in-process loop
(`artstore.training.framework`) and training from workers (`artstore.training.from_workers`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from artstore.errors import ConfigurationError
from artstore.training.config import check_count

AgentFunction = Callable[[Any, str], Any]  # (scenario, rollout id) -> result, maybe awaitable
RewardFunction = Callable[[Any, list[Any], list[Any]], Any]  # -> one reward per trajectory


@dataclass
class RunSummary:
    """What one call of `run_training` did. A resumed run reports only this call's work."""

    run: str
    resumed: bool = False  # the run had been started before this call
    start_step: int = 0  # the model's step when this call began (after reconciling)
    final_step: int = 0  # the model's step when it returned
    steps_trained: list[int] = field(default_factory=list)  # `TrainResult.step` of each step
    groups_sealed: int = 0  # groups this call finished and sealed (the rest were sealed before)
    rollouts: int = 0  # rollouts this call ran to the end, policy and validation
    rollouts_failed: int = 0  # rollouts whose agent raised: recorded, left out of their group
    reconciled: list[str] = field(default_factory=list)  # repairs after a crash, each an event


@dataclass(frozen=True)
class Recipe:
    """How each group is made: by whom, how many, scored how. One per run."""

    model: Any
    agent_function: AgentFunction
    reward_function: RewardFunction
    group_size: int
    validation_model: Any = None
    validation_samples: int = 0  # 0 without a validation model
    scorer: str = "reward"


def make_recipe(
    model: Any,
    agent_function: AgentFunction,
    reward_function: RewardFunction,
    group_size: int,
    validation_model: Any,
    validation_samples: int,
    scorer: str,
) -> Recipe:
    check_count("group_size", group_size)
    check_count("validation_samples", validation_samples, allow_zero=True)
    for name, function in [
        ("agent_function", agent_function),
        ("reward_function", reward_function),
    ]:
        if not callable(function):
            raise ConfigurationError(f"{name} must be callable, got {function!r}")
    return Recipe(
        model=model,
        agent_function=agent_function,
        reward_function=reward_function,
        group_size=group_size,
        validation_model=validation_model,
        validation_samples=validation_samples if validation_model is not None else 0,
        scorer=scorer,
    )
