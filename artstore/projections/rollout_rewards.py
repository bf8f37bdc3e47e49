"""Each rollout's latest reward by its run's scorer, kept on its row (`rollouts.reward`).

v_rollouts shows it; found at query time it cost a lookup in `latest_rewards` per rollout,
most of a per-step question's time on a large run (the reward curve of 100,000 rollouts).
It is set again, from `latest_rewards` and the run's scorer, for the rollouts whose latest
reward, run or row changed, and for every rollout of a run whose scorer is set.
"""

from __future__ import annotations

from collections.abc import Iterable

from sqlalchemy import select, update
from sqlalchemy.engine import Connection

from artstore.schema import tables as t

CHUNK = 500  # ids per IN list

_ro, _latest, _runs = t.rollouts, t.latest_rewards, t.runs
_REWARD = (
    select(_latest.c.reward)
    .select_from(_latest.join(_runs, _runs.c.scorer == _latest.c.scorer))
    .where(_runs.c.run == _ro.c.run, _latest.c.rollout_id == _ro.c.rollout_id)
    .scalar_subquery()
)


def refresh_rewards(c: Connection, rollout_ids: Iterable[str]) -> None:
    """Set these rollouts' `reward` again."""
    ids = sorted(set(rollout_ids))
    for start in range(0, len(ids), CHUNK):
        c.execute(
            update(_ro)
            .where(_ro.c.rollout_id.in_(ids[start : start + CHUNK]))
            .values(reward=_REWARD)
        )


def refresh_run_rewards(c: Connection, run: str) -> None:
    """Set `reward` again for every rollout of `run` (its scorer was set or changed)."""
    c.execute(update(_ro).where(_ro.c.run == run).values(reward=_REWARD))
