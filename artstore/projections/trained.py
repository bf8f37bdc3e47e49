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

from collections.abc import Iterable

from sqlalchemy import and_, bindparam, func, select, true, update
from sqlalchemy.engine import Connection

from artstore.schema import tables as t
from artstore.schema.views import element_text, elements

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
    """Sum again what these steps trained (the join v_train_steps made at query time)."""
    step = t.train_steps.alias("step")
    group = elements(step.c.group_ids, "step_group")
    trained = t.rollouts.alias("trained")
    latest = t.latest_rewards
    for chunk in _chunks(sorted(set(step_ids))):
        sums = c.execute(
            select(step.c.id, func.count(latest.c.reward), func.avg(latest.c.reward))
            .select_from(
                step.join(group, true())
                .join(
                    trained,
                    and_(
                        trained.c.group_id == element_text(group),
                        func.coalesce(trained.c.role, "policy") != "validation",
                    ),
                )
                .join(
                    latest,
                    and_(
                        latest.c.rollout_id == trained.c.rollout_id,
                        latest.c.scorer == step.c.scorer,
                    ),
                )
            )
            .where(step.c.id.in_(chunk))
            .group_by(step.c.id)
        ).all()
        found = {row[0]: (row[1], row[2]) for row in sums}
        c.execute(
            _SET_TRAINED,
            [
                {
                    "b_id": step_id,
                    "b_num_trajectories": found.get(step_id, (0, None))[0],
                    "b_reward_mean": found.get(step_id, (0, None))[1],
                }
                for step_id in chunk
            ],
        )


def refresh_for_rollouts(c: Connection, rollout_ids: Iterable[str]) -> None:
    """After these rollouts' latest rewards, groups or rows changed."""
    steps = steps_of_rollouts(c, rollout_ids)
    if steps:
        refresh_trained(c, steps)
