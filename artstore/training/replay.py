"""Replay: feed a run's sealed groups that a model has not consumed into that model.

Consumption is per trained model, so groups that trained model A can train model B too,
and a run whose trainer died can be finished from its stored groups alone.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sqlalchemy import func, select

from artstore.errors import NotFoundError
from artstore.schema import tables as t
from artstore.training.lease import trainer_lease
from artstore.training.steps import consumed_groups, model_key, reconcile, train_groups

if TYPE_CHECKING:
    import art

    from artstore.store import Store


@dataclass
class PlannedGroup:
    group_id: str
    batch: int | None
    scenario_index: int | None
    policy_step: int | None
    staleness: int | None  # the model's step minus the step that generated the group
    rewards: list[float]
    advantages: list[float]


@dataclass
class ReplayPlan:
    run: str
    model: str
    scorer: str
    model_step: int
    steps: list[list[PlannedGroup]] = field(default_factory=list)  # one list per train step
    skipped_stale: list[PlannedGroup] = field(default_factory=list)
    unscored: list[str] = field(default_factory=list)  # groups without the scorer's rewards
    trained_steps: list[int] = field(default_factory=list)

    @property
    def groups(self) -> list[PlannedGroup]:
        return [group for step in self.steps for group in step]


async def run_info(store: Store, run: str) -> Any:
    async with store.database.read() as connection:
        row = (await connection.execute(select(t.runs).where(t.runs.c.run == run))).first()
    if row is None:
        raise NotFoundError(f"no run {run!r} in this store (see `artstore runs`)")
    return row


async def plan_replay(
    store: Store,
    run: str,
    model: art.TrainableModel,
    *,
    scorer: str | None = None,
    max_staleness: int | None = None,
    groups_per_step: int | None = None,
) -> ReplayPlan:
    """What a replay would train: unconsumed sealed groups of `run`, in their batches."""
    from artstore.backends.check_only import group_advantages

    info = await run_info(store, run)
    scorer = scorer or info.scorer
    model_step = await model.get_step()
    plan = ReplayPlan(run=run, model=model_key(model), scorer=scorer, model_step=model_step)
    async with store.database.read() as connection:
        groups = (
            await connection.execute(
                select(t.groups.c.group_id, t.groups.c.batch, t.groups.c.scenario_index)
                .where(t.groups.c.run == run)
                .order_by(t.groups.c.batch, t.groups.c.scenario_index, t.groups.c.position)
            )
        ).all()
        ids = [g.group_id for g in groups]
        steps = (
            dict(
                (
                    await connection.execute(
                        select(t.rollouts.c.group_id, func.min(t.rollouts.c.policy_step))
                        .where(t.rollouts.c.group_id.in_(ids), t.rollouts.c.role == "policy")
                        .group_by(t.rollouts.c.group_id)
                    )
                ).all()
            )
            if ids
            else {}
        )
    consumed = await consumed_groups(store, model, ids)
    rewards = await _policy_rewards(store, [g for g in ids if g not in consumed], scorer)
    size = groups_per_step or info.config.get("batch_size") or 1
    current_batch: Any = object()
    for group in groups:
        if group.group_id in consumed:
            continue
        if group.group_id not in rewards:
            plan.unscored.append(group.group_id)
            continue
        policy_step = steps.get(group.group_id)
        staleness = None if policy_step is None else model_step - policy_step
        planned = PlannedGroup(
            group.group_id,
            group.batch,
            group.scenario_index,
            policy_step,
            staleness,
            rewards[group.group_id],
            group_advantages(rewards[group.group_id]),
        )
        if max_staleness is not None and staleness is not None and staleness > max_staleness:
            plan.skipped_stale.append(planned)
            continue
        new_step = groups_per_step is None and group.batch != current_batch
        if not plan.steps or new_step or len(plan.steps[-1]) >= size:
            plan.steps.append([])
        plan.steps[-1].append(planned)
        current_batch = group.batch
    return plan


async def _policy_rewards(
    store: Store, group_ids: list[str], scorer: str
) -> dict[str, list[float]]:
    """Latest rewards by `scorer` of each group's policy rollouts, in the group's order."""
    from artstore.training.groups import sealed_groups

    sealed = await sealed_groups(store, group_ids)
    found: dict[str, list[float]] = {}
    async with store.database.read() as connection:
        for group_id, event in sealed.items():
            latest: dict[str, float] = {}
            query = (
                select(t.rewards.c.rollout_id, t.rewards.c.reward)
                .where(t.rewards.c.group_id == group_id, t.rewards.c.scorer == scorer)
                .order_by(t.rewards.c.position)
            )
            for row in await connection.execute(query):
                latest[row.rollout_id] = row.reward
            if all(rid in latest for rid in event.rollout_ids):
                found[group_id] = [latest[rid] for rid in event.rollout_ids]
    return found


async def replay(
    store: Store,
    run: str,
    model: art.TrainableModel,
    *,
    scorer: str | None = None,
    max_staleness: int | None = None,
    groups_per_step: int | None = None,
    dry_run: bool = False,
    train_kwargs: dict[str, Any] | None = None,
    on_step: Callable[[int, int], None] | None = None,
) -> ReplayPlan:
    """Train `model` on the groups of `run` it has not consumed; `dry_run` only plans.

    `model` must be registered with its backend. Each planned step is one
    `backend.train` call, recorded like a step of the run itself.
    """
    async with trainer_lease(store.database, run, model_key(model)):
        if not dry_run:
            await reconcile(store, run, model)
        plan = await plan_replay(
            store,
            run,
            model,
            scorer=scorer,
            max_staleness=max_staleness,
            groups_per_step=groups_per_step,
        )
        if dry_run:
            return plan
        for number, step in enumerate(plan.steps):
            result = await train_groups(
                store,
                run=run,
                model=model,
                group_ids=[g.group_id for g in step],
                scorer=plan.scorer,
                train_kwargs=train_kwargs,
            )
            plan.trained_steps.append(result.step)
            if on_step is not None:
                on_step(number + 1, len(plan.steps))
        return plan
