"""Replay: feed a run's sealed groups that a model has not consumed into that model.

Consumption is per trained model, so groups that trained model A can train model B too,
and a run whose trainer died can be finished from its stored groups alone.

`plan_replay` says what would be trained (per step: groups, rewards, ART's advantages,
staleness) without touching anything; `replay` trains that plan, one `backend.train`
call per planned step, recorded like a step of the run itself.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from sqlalchemy import func, select

from artstore.advantages import group_advantages
from artstore.arguments import check_json_object, check_name, check_store, check_whole_numbers
from artstore.errors import ConfigurationError
from artstore.groups import sealed_groups
from artstore.schema import tables as t
from artstore.training.lease import trainer_lease
from artstore.training.runs import own_models, run_info
from artstore.training.steps import consumed_groups, model_key, reconcile, train_groups

if TYPE_CHECKING:
    import art

    from artstore.store import Store


@dataclass
class PlannedGroup:
    group_id: str
    batch: int | None
    scenario_index: int | None
    policy_step: int | None  # the policy step that generated the group's rollouts
    # The step the model will be at when it trains this group, minus `policy_step`.
    # Negative when the group came from a later step of another model (replaying run A's
    # groups into a fresh model B); None when the rollouts carry no policy step.
    staleness: int | None
    rewards: list[float]
    advantages: list[float]  # ART's group-relative advantages for `rewards`
    step: int | None = None  # index of the planned step (0, 1, ...); None when skipped

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class ReplayPlan:
    run: str
    model: str
    scorer: str
    model_step: int  # the model's step when the plan was made
    steps: list[list[PlannedGroup]] = field(default_factory=list)  # one list per train step
    skipped_stale: list[PlannedGroup] = field(default_factory=list)
    unscored: list[str] = field(default_factory=list)  # groups without the scorer's rewards
    consumed: int = 0  # groups of the run this model had consumed already
    trained_steps: list[int] = field(default_factory=list)  # steps reached, after training

    @property
    def groups(self) -> list[PlannedGroup]:
        return [group for step in self.steps for group in step]


async def stored_model_step(store: Store, model: str) -> int:
    """The step `model` ("project/name") reached by the train steps recorded here (0: none).

    What `model.get_step()` would say when the backend's checkpoints are not at hand
    (a dry run without `--backend`).
    """
    async with store.database.read() as connection:
        step = (
            await connection.execute(
                select(func.max(t.train_steps.c.step)).where(
                    t.train_steps.c.model == model, t.train_steps.c.status == "completed"
                )
            )
        ).scalar()
    return int(step or 0)


async def plan_replay(
    store: Store,
    run: str,
    model: art.TrainableModel,
    *,
    scorer: str | None = None,
    max_staleness: int | None = None,
    groups_per_step: int | None = None,
    scale_rewards: bool = True,
    model_step: int | None = None,
) -> ReplayPlan:
    """What a replay would train: the sealed groups of `run` that `model` has not consumed.

    Groups are taken in the run's order (batch, scenario). By default each batch of the
    run is one step (at most `batch_size` groups, as the run trained them); with
    `groups_per_step`, consecutive groups are packed `groups_per_step` to a step.
    Groups without rewards by `scorer` (the run's scorer by default) are left out and
    listed in `unscored`. With `max_staleness`, groups whose staleness at the step that
    would train them is above it are left out and listed in `skipped_stale`; they stay
    unconsumed. `model_step` replaces `await model.get_step()` (for plans made without
    a backend). Nothing is written.
    """
    if groups_per_step is not None and groups_per_step < 1:
        raise ConfigurationError(f"groups_per_step must be positive, got {groups_per_step}")
    if max_staleness is not None and max_staleness < 0:
        raise ConfigurationError(f"max_staleness must be non-negative, got {max_staleness}")
    info = await run_info(store, run)
    scorer = scorer or info.scorer
    if model_step is None:
        model_step = await model.get_step()
    plan = ReplayPlan(run=run, model=model_key(model), scorer=scorer, model_step=model_step)
    groups, policy_steps = await _groups_of_run(store, run)
    ids = [g.group_id for g in groups]
    consumed = await consumed_groups(store, model, ids)
    plan.consumed = len(consumed)
    batches = _Batches(policy_steps, await _own_steps(store, info))
    _plan_steps(
        plan,
        [g for g in batches.in_order(groups) if g.group_id not in consumed],
        await policy_rewards(store, [g for g in ids if g not in consumed], scorer),
        batches,
        # Steps follow the run's batches; `groups_per_step` (or the run's `batch_size`)
        # bounds them. A run whose batches say nothing trains in steps of
        # `groups_per_step`, or all its groups in one step.
        size=groups_per_step or info.config.get("batch_size"),
        by_batch=groups_per_step is None,
        max_staleness=max_staleness,
        scale_rewards=scale_rewards,
    )
    return plan


async def _groups_of_run(store: Store, run: str) -> tuple[list[Any], dict[str, int | None]]:
    """The run's groups (id, batch, scenario) and the policy step of each group's rollouts."""
    async with store.database.read() as connection:
        groups = (
            await connection.execute(
                select(t.groups.c.group_id, t.groups.c.batch, t.groups.c.scenario_index)
                .where(t.groups.c.run == run)
                .order_by(t.groups.c.batch, t.groups.c.scenario_index, t.groups.c.position)
            )
        ).all()
        ids = [g.group_id for g in groups]
        policy_steps: dict[str, int | None] = {}
        for start in range(0, len(ids), 500):
            rows = await connection.execute(
                select(t.rollouts.c.group_id, func.min(t.rollouts.c.policy_step))
                .where(
                    t.rollouts.c.group_id.in_(ids[start : start + 500]),
                    t.rollouts.c.role == "policy",
                )
                .group_by(t.rollouts.c.group_id)
            )
            policy_steps.update(rows.all())
    return list(groups), policy_steps


class _Batches:
    """What makes a batch of the run: its batch index, else the step of the run's own model
    that trained the group (a loop of its own, PipelineTrainer), else the policy step that
    made it; None when the run says nothing."""

    _KINDS: ClassVar[dict[str, int]] = {"batch": 0, "trained": 1, "policy": 2}

    def __init__(self, policy_steps: dict[str, int | None], trained_at: dict[str, int]) -> None:
        self.policy_steps = policy_steps
        self.trained_at = trained_at

    def of(self, group: Any) -> tuple[str, int] | None:
        if group.batch is not None:
            return ("batch", group.batch)
        if group.group_id in self.trained_at:
            return ("trained", self.trained_at[group.group_id])
        policy_step = self.policy_steps.get(group.group_id)
        return None if policy_step is None else ("policy", policy_step)

    def in_order(self, groups: list[Any]) -> list[Any]:
        """Batch by batch (those the run says nothing of last), scenario by scenario."""

        def key(group: Any) -> tuple[Any, ...]:
            batch = self.of(group)
            return (
                (3, 0) if batch is None else (self._KINDS[batch[0]], batch[1]),
                group.scenario_index is None,
                group.scenario_index or 0,
            )

        return sorted(groups, key=key)


def _plan_steps(
    plan: ReplayPlan,
    groups: list[Any],
    rewards: dict[str, list[float]],
    batches: _Batches,
    *,
    size: int | None,
    by_batch: bool,
    max_staleness: int | None,
    scale_rewards: bool,
) -> None:
    """The unconsumed `groups` planned into steps (or listed as unscored, or as stale)."""
    current_batch: Any = object()
    for group in groups:
        if group.group_id not in rewards:
            plan.unscored.append(group.group_id)
            continue
        new_step = not plan.steps or (size is not None and len(plan.steps[-1]) >= size)
        if by_batch and batches.of(group) != current_batch:
            new_step = True
        step_index = len(plan.steps) if new_step else len(plan.steps) - 1
        policy_step = batches.policy_steps.get(group.group_id)
        staleness = None if policy_step is None else plan.model_step + step_index - policy_step
        planned = PlannedGroup(
            group.group_id,
            group.batch,
            group.scenario_index,
            policy_step,
            staleness,
            rewards[group.group_id],
            group_advantages(rewards[group.group_id], scale_rewards=scale_rewards),
        )
        if max_staleness is not None and staleness is not None and staleness > max_staleness:
            plan.skipped_stale.append(planned)
            continue
        if new_step:
            plan.steps.append([])
        planned.step = step_index
        plan.steps[-1].append(planned)
        current_batch = batches.of(group)


async def _own_steps(store: Store, info: Any) -> dict[str, int]:
    """Group id -> the step of the run's own model that trained it."""
    query = select(t.group_consumptions.c.group_id, t.group_consumptions.c.step).where(
        t.group_consumptions.c.run == info.run,
        t.group_consumptions.c.model.in_(sorted(own_models(info))),
    )
    async with store.database.read() as connection:
        return {row.group_id: row.step for row in await connection.execute(query)}


async def policy_rewards(store: Store, group_ids: list[str], scorer: str) -> dict[str, list[float]]:
    """Latest rewards by `scorer` of each group's policy rollouts, in the group's order."""
    sealed = await sealed_groups(store, group_ids)
    latest: dict[str, dict[str, float]] = {}
    async with store.database.read() as connection:
        for start in range(0, len(group_ids), 500):
            query = (
                select(t.rewards.c.group_id, t.rewards.c.rollout_id, t.rewards.c.reward)
                .where(
                    t.rewards.c.group_id.in_(group_ids[start : start + 500]),
                    t.rewards.c.scorer == scorer,
                )
                .order_by(t.rewards.c.position, t.rewards.c.id)
            )
            for row in await connection.execute(query):  # later rows replace earlier ones
                latest.setdefault(row.group_id, {})[row.rollout_id] = row.reward
    found: dict[str, list[float]] = {}
    for group_id, event in sealed.items():
        scored = latest.get(group_id, {})
        if all(rid in scored for rid in event.rollout_ids):
            found[group_id] = [scored[rid] for rid in event.rollout_ids]
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
    on_plan: Callable[[ReplayPlan], None] | None = None,
    on_step: Callable[[int, int], None] | None = None,
    model_step: int | None = None,
) -> ReplayPlan:
    """Train `model` on the groups of `run` it has not consumed; `dry_run` only plans.

    `model` must be registered with its backend. Each planned step is one
    `backend.train` call, recorded like a step of the run itself (`train_step.*` events
    on the run's train stream, the groups consumed by `model`). A dry run writes nothing
    and takes no lease, so it can look at a run while its trainer is at work.
    `on_plan(plan)` is called once planned, `on_step(done, total)` after each step.
    `model_step` stands for `await model.get_step()` in a dry run (a plan made without
    a backend).
    """
    check_store(store)
    check_name("run", run)
    check_name("scorer", scorer, optional=True)
    check_whole_numbers(
        optional=True,
        max_staleness=max_staleness,
        groups_per_step=groups_per_step,
        model_step=model_step,
    )
    train_kwargs = dict(check_json_object("train_kwargs", train_kwargs))
    scale_rewards = bool(
        train_kwargs.get("scale_rewards", True) and train_kwargs.get("normalize_advantages", True)
    )
    options = {
        "scorer": scorer,
        "max_staleness": max_staleness,
        "groups_per_step": groups_per_step,
        "scale_rewards": scale_rewards,
    }
    if dry_run:
        plan = await plan_replay(store, run, model, model_step=model_step, **options)
        if on_plan is not None:
            on_plan(plan)
        return plan
    await run_info(store, run)  # an unknown run is an error before the lease file is made
    async with trainer_lease(store.database, run, model_key(model)):
        await reconcile(store, model)
        plan = await plan_replay(store, run, model, **options)
        if on_plan is not None:
            on_plan(plan)
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
