"""What each train step trained: `train_steps.num_trajectories` and `reward_mean`.

A step trains the policy rollouts of its groups (`train_steps.group_ids`); v_train_steps
shows how many of them have a latest reward by the step's scorer and their mean. Joined
at query time that read every rollout and every latest reward for every query; here the
two numbers are kept on the step's row and summed again, with the same join, for the
steps that something changed:

- the step itself (started, completed: its groups and scorer are known);
- a rollout's latest reward (a new group's rewards, a re-scoring after training);
- a rollout's group or the rollout itself (a rollout sealed into a group after it ran, a
  rollout recorded after its group's step).

`train_step_groups` (one row per step and distinct group) finds the steps of a rollout's
group. A run's usual order (rollouts, rewards, seal, then the step) finds none while the
rollouts and rewards are written, and sums each step once.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from sqlalchemy import bindparam, func, select, update
from sqlalchemy.engine import Connection

from artstore.eventstore.database import recorder_of
from artstore.schema import tables as t

CHUNK = 500  # ids per IN list

_ts = t.train_steps
_SET_TRAINED = (
    update(_ts)
    .where(_ts.c.id == bindparam("b_id"))
    .values(
        num_trajectories=bindparam("b_num_trajectories"),
        reward_mean=bindparam("b_reward_mean", type_=_ts.c.reward_mean.type),
    )
)


# Lock keys of the steps being summed again: this offset plus the id.
STEP_KEY_OFFSET = 0x5472_6169_6E00_0000


def _chunks(values: list, size: int = CHUNK) -> Iterable[list]:
    for start in range(0, len(values), size):
        yield values[start : start + size]


def add_step_groups(c: Connection, step_id: int, group_ids: list[str]) -> None:
    """Record which groups a new train step names (each once)."""
    rows = [{"group_id": g, "train_step_id": step_id} for g in dict.fromkeys(group_ids)]
    if rows:
        c.execute(t.train_step_groups.insert(), rows)


def steps_of_rollouts(c: Connection, rollout_ids: Iterable[str]) -> set[int]:
    """The train steps that name the group of any of these rollouts."""
    tsg, ro = t.train_step_groups, t.rollouts
    found: set[int] = set()
    for chunk in _chunks(sorted(set(rollout_ids))):
        found.update(
            c.execute(
                select(tsg.c.train_step_id)
                .distinct()
                .select_from(tsg.join(ro, ro.c.group_id == tsg.c.group_id))
                .where(ro.c.rollout_id.in_(chunk))
            ).scalars()
        )
    return found


def refresh_trained(c: Connection, step_ids: Iterable[int]) -> None:
    """Sum again what these steps trained (what v_train_steps joined at query time).

    One query per step, shaped so that every lookup goes through an index whatever the
    planner's statistics say: the step's groups as a list of constants (the index on
    `rollouts.group_id`), each rollout's latest reward as a scalar subquery (the key of
    `latest_rewards`). Joined in one statement, PostgreSQL with statistics older than a
    bulk import hashed all of `latest_rewards` for each step, and recording grew with
    the square of the run (0.65 s a step at 60,000 rollouts). A group named twice
    counts twice, as in the join.
    """
    trained = t.rollouts
    latest = t.latest_rewards
    ids = sorted(set(step_ids))
    # Appends projected side by side (artstore.projections.side_by_side) may both start
    # rollouts of a step's group: each sums the step after the other commits. The ids are
    # sorted, so two transactions never wait for each other in a circle.
    recorder_of(c).lock_keys(c, STEP_KEY_OFFSET, ids)
    steps = c.execute(
        select(_ts.c.id, _ts.c.scorer, _ts.c.group_ids).where(_ts.c.id.in_(ids))
    ).all()
    updates = []
    for step_id, scorer, group_ids in steps:
        groups = list(group_ids or [])
        rewards_by_group: dict[str, list[float]] = {group: [] for group in groups}
        for chunk in _chunks(list(rewards_by_group)):
            reward = (
                select(latest.c.reward)
                .where(latest.c.rollout_id == trained.c.rollout_id, latest.c.scorer == scorer)
                .scalar_subquery()
            )
            rows = c.execute(
                select(trained.c.group_id, reward).where(
                    trained.c.group_id.in_(chunk),
                    func.coalesce(trained.c.role, "policy") != "validation",
                )
            )
            for group_id, value in rows:
                if value is not None:
                    rewards_by_group[group_id].append(value)
        rewards = [value for group in groups for value in rewards_by_group[group]]
        updates.append(
            {
                "b_id": step_id,
                "b_num_trajectories": len(rewards),
                # fsum: exact, so the mean does not depend on the order the rows came in
                # (the query has none), and a rebuild writes the same bits.
                "b_reward_mean": math.fsum(rewards) / len(rewards) if rewards else None,
            }
        )
    if updates:
        c.execute(_SET_TRAINED, updates)


def refresh_for_rollouts(c: Connection, rollout_ids: Iterable[str]) -> None:
    """After these rollouts' latest rewards, groups or rows changed."""
    steps = steps_of_rollouts(c, rollout_ids)
    if steps:
        refresh_trained(c, steps)
