"""ART's group-relative advantages, computed as ART's trainer computes them.

The CPU backend trains on them; `artstore replay --dry-run` and the analysis of a group
show them. `art` is not imported here: it is slow to import and not needed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from artstore.art_versions import rewards_have_zero_variance

__all__ = ["group_advantages"]

# ART's epsilon in the advantage denominator (art/preprocessing/tokenize.py, line 256).
_STD_EPSILON = 1e-6


def group_advantages(rewards: Sequence[float], scale_rewards: bool = True) -> list[float]:
    """ART's GRPO advantages for one group, in the order of `rewards`.

    Mirrors `tokenize_trajectory_groups` in art/preprocessing/tokenize.py (lines 246-257):
    advantage = reward - mean(rewards), divided by (population std + 1e-6) when
    `scale_rewards`. A group whose rewards are all equal (or that has one trajectory) gets
    exact zeros: it has no reward spread and ART trains nothing on it (ART drops
    zero-advantage trajectories, and its metrics call such a group untrainable). ART's own
    float arithmetic can leave ~1e-11 residues there (mean of [0.1, 0.1, 0.1] is not 0.1);
    we return 0.0, which is what ART means.
    """
    values = [float(r) for r in rewards]
    for index, value in enumerate(values):
        if not math.isfinite(value):
            raise ValueError(f"reward {index} is {value!r}; rewards must be finite numbers")
    n = len(values)
    if n == 0:
        return []
    if rewards_have_zero_variance(values):
        return [0.0] * n
    mean = sum(values) / n
    std = math.sqrt(sum((value - mean) ** 2 for value in values) / n)
    advantages = []
    for value in values:
        advantage = value - mean
        if scale_rewards:
            advantage /= std + _STD_EPSILON
        advantages.append(advantage)
    return advantages
