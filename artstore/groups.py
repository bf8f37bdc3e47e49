"""Trajectory groups from the store: sealing them with rewards, and loading them for ART."""

from __future__ import annotations

import inspect
import json
import math
import numbers
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sqlalchemy import select

from artstore.art_api import pydantic_exception_class, trajectory_group_class
from artstore.capture.rollout import rollout_stream, to_json_value
from artstore.errors import NotFoundError, RewardFunctionError
from artstore.events import GroupSealed, RewardsRecorded, RolloutFailed
from artstore.eventstore.blobs import canonical_json
from artstore.eventstore.records import NO_STREAM, Condition
from artstore.projections.imported import load_bodies
from artstore.schema import tables as t

if TYPE_CHECKING:
    import art

    from artstore.store import Store

# Group ids of a run are derived from (run, epoch, scenario), so a resumed run finds them.
_GROUP_NAMESPACE = uuid.UUID("3f9a4f0e-6c1b-4b8e-9a59-0d4b1c2e7a10")


@dataclass(frozen=True)
class GroupPlace:
    """Where a group belongs. A run's group ids derive from (run, epoch, scenario)."""

    group_id: str
    run: str | None = None
    epoch: int | None = None
    batch: int | None = None
    scenario_index: int | None = None

    def __str__(self) -> str:
        if self.run is None:
            return f"group {self.group_id}"
        return (
            f"run {self.run!r}, epoch {self.epoch}, scenario {self.scenario_index} "
            f"(group {self.group_id})"
        )


def group_id_for(run: str, epoch: int, scenario_index: int) -> str:
    return str(uuid.uuid5(_GROUP_NAMESPACE, f"{run}\x00{epoch}\x00{scenario_index}"))


def group_stream(group_id: str) -> str:
    return f"group-{group_id}"


@dataclass
class GroupRollouts:
    """What a group's rollouts are, from the rollouts projection."""

    policy: list[str] = field(default_factory=list)  # finished, in start order
    validation: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    running: list[str] = field(default_factory=list)  # started, never ended (a crash)
    running_policy: list[str] = field(default_factory=list)  # those of them of the policy
    results: dict[str, Any] = field(default_factory=dict)


async def group_rollouts(store: Store, group_id: str) -> GroupRollouts:
    query = (
        select(t.rollouts.c.rollout_id, t.rollouts.c.role, t.rollouts.c.status, t.rollouts.c.result)
        .where(t.rollouts.c.group_id == group_id)
        .order_by(t.rollouts.c.started_at, t.rollouts.c.rollout_id)
    )
    found = GroupRollouts()
    async with store.database.read() as connection:
        for row in await connection.execute(query):
            if row.status == "finished":
                (found.policy if row.role == "policy" else found.validation).append(row.rollout_id)
                found.results[row.rollout_id] = row.result
            elif row.status == "failed":
                found.failed.append(row.rollout_id)
            else:
                found.running.append(row.rollout_id)
                if row.role == "policy":
                    found.running_policy.append(row.rollout_id)
    return found


async def abandon_rollouts(
    store: Store,
    rollout_ids: Sequence[str],
    why: str = "the trainer stopped (crash or kill) before this rollout ended; the resumed "
    "run rolled out another in its place",
) -> None:
    """Record rollouts left running by a process that died as failed (`RolloutAbandoned`).

    Only the holder of the run's lease may call this: no other process runs its rollouts.
    """
    if not rollout_ids:
        return
    streams = await store.read_streams(rollout_stream(r) for r in rollout_ids)
    for rollout_id in rollout_ids:
        recorded = streams[rollout_stream(rollout_id)]
        await store.append(
            rollout_stream(rollout_id),
            [
                RolloutFailed(
                    rollout_id=rollout_id,
                    error_type="RolloutAbandoned",
                    error_message=why,
                    traceback="",
                    # Until its last recorded event: the moment of the crash is unknown.
                    duration_s=(recorded[-1].recorded_at - recorded[0].recorded_at).total_seconds(),
                )
            ],
            expected_version=recorded[-1].version,
        )


async def sealed_groups(store: Store, group_ids: Sequence[str]) -> dict[str, GroupSealed]:
    """The `group.sealed` event of each group that has one."""
    streams = await store.read_streams(group_stream(g) for g in group_ids)
    sealed = {}
    for group_id in group_ids:
        for recorded in streams[group_stream(group_id)]:
            if recorded.type == GroupSealed.type:
                sealed[group_id] = recorded.decode()
    return sealed


def check_rewards(rewards: Any, expected: int, where: str) -> list[float]:
    """The rewards as floats, or a RewardFunctionError that says what is wrong."""
    if inspect.isawaitable(rewards):
        raise RewardFunctionError(f"{where}: the reward function returned an unawaited coroutine")
    if isinstance(rewards, (str, bytes, dict)):
        raise RewardFunctionError(
            f"{where}: the reward function must return a list of numbers, got "
            f"{type(rewards).__name__}"
        )
    try:
        values = list(rewards)
    except TypeError:
        raise RewardFunctionError(
            f"{where}: the reward function must return a list of numbers, got "
            f"{type(rewards).__name__}"
        ) from None
    if len(values) != expected:
        raise RewardFunctionError(
            f"{where}: the reward function returned {len(values)} rewards for {expected} "
            "trajectories (one reward per trajectory, in order)"
        )
    checked = []
    for index, value in enumerate(values):
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise RewardFunctionError(f"{where}: reward {index} is {value!r}, not a number")
        if not math.isfinite(value):
            raise RewardFunctionError(f"{where}: reward {index} is {value}, not a finite number")
        checked.append(float(value))
    return checked


async def call_reward_function(
    reward_function: Callable[..., Any],
    scenario: Any,
    results: list[Any],
    trajectories: list[art.Trajectory],
    where: str,
) -> list[float]:
    """Call the `reward_function(scenario, results, trajectories)` safely."""
    try:
        rewards = reward_function(scenario, results, trajectories)
        if inspect.isawaitable(rewards):
            rewards = await rewards
    except Exception as exc:
        raise RewardFunctionError(
            f"{where}: the reward function raised {type(exc).__name__}: {exc}"
        ) from exc
    return check_rewards(rewards, len(trajectories), where)


def win_metrics(
    policy_rewards: list[float], validation_rewards: list[float]
) -> list[dict[str, float | int]]:
    """Each policy trajectory's wins against the validation trajectories (ties count)."""
    if not validation_rewards:
        return [{} for _ in policy_rewards]
    metrics = []
    for reward in policy_rewards:
        wins = sum(1 for other in validation_rewards if reward >= other)
        metrics.append({"wins": wins, "win_rate": wins / len(validation_rewards)})
    return metrics


def rewards_event(
    group_id: str,
    scorer: str,
    policy: list[str],
    validation: list[str],
    rewards: list[float],
    *,
    rescored: bool,
) -> RewardsRecorded:
    policy_rewards, validation_rewards = rewards[: len(policy)], rewards[len(policy) :]
    metrics = win_metrics(policy_rewards, validation_rewards)
    return RewardsRecorded(
        group_id=group_id,
        scorer=scorer,
        rewards=dict(zip([*policy, *validation], rewards, strict=True)),
        metrics={rid: m for rid, m in zip(policy, metrics, strict=True) if m},
        rescored=rescored,
    )


async def load_groups(
    store: Store, group_ids: Sequence[str], scorer: str
) -> list[art.TrajectoryGroup]:
    """ART trajectory groups (policy rollouts only) with the rewards of `scorer`.

    A group recorded from an `art.TrajectoryGroup` comes back with its own metadata,
    metrics, logs and exceptions; a group of the training loop with its id, run and
    scenario index as metadata. Every trajectory says which rollout and group it is
    (`artstore_rollout_id`, `artstore_group_id` in its metadata), and so does the group.
    """
    sealed = await sealed_groups(store, group_ids)
    missing = [g for g in group_ids if g not in sealed]
    if missing:
        raise NotFoundError(f"group {missing[0]} is not sealed; it cannot be trained")
    all_ids = [rid for g in group_ids for rid in sealed[g].rollout_ids]
    trajectories = await store.trajectories(all_ids, scorer=scorer)
    scored = await scored_rollouts(store, all_ids, scorer)
    art_groups = [e.art_group for e in sealed.values() if e.art_group]
    async with store.database.read() as connection:
        bodies = await connection.run_sync(load_bodies, art_groups)
    groups = []
    for group_id in group_ids:
        event = sealed[group_id]
        unscored = [rid for rid in event.rollout_ids if rid not in scored]
        if unscored:
            raise NotFoundError(
                f"group {group_id} has no reward by scorer {scorer!r} "
                f"(score it with `artstore rescore --scorer {scorer}`)"
            )
        members = [trajectories[rid] for rid in event.rollout_ids]
        for rollout_id, trajectory in zip(event.rollout_ids, members, strict=True):
            trajectory.metadata.update(artstore_rollout_id=rollout_id, artstore_group_id=group_id)
        if event.art_group:
            details = bodies[event.art_group]
            group = trajectory_group_class()(
                members,
                metadata={**details["metadata"], "artstore_group_id": group_id},
                metrics=details["metrics"],
                logs=details["logs"],
            )
            # Set, not given: ART 0.5.18's constructor takes exceptions as raised ones.
            group.exceptions = [pydantic_exception_class()(**e) for e in details["exceptions"]]
            groups.append(group)
            continue
        metadata = {"group_id": group_id, "run": event.run, "scenario_index": event.scenario_index}
        metadata = {k: v for k, v in metadata.items() if v is not None}
        groups.append(
            trajectory_group_class()(members, metadata={**metadata, "artstore_group_id": group_id})
        )
    return groups


async def scored_rollouts(store: Store, rollout_ids: list[str], scorer: str) -> set[str]:
    found: set[str] = set()
    async with store.database.read() as connection:
        for start in range(0, len(rollout_ids), 500):
            query = select(t.rewards.c.rollout_id).where(
                t.rewards.c.rollout_id.in_(rollout_ids[start : start + 500]),
                t.rewards.c.scorer == scorer,
            )
            found.update(row.rollout_id for row in await connection.execute(query))
    return found


def sealed_event(
    group_id: str,
    *,
    run: str | None,
    epoch: int | None,
    batch: int | None,
    scenario_index: int | None,
    rollouts: GroupRollouts,
) -> GroupSealed:
    return GroupSealed(
        group_id=group_id,
        run=run,
        epoch=epoch,
        batch=batch,
        scenario_index=scenario_index,
        rollout_ids=rollouts.policy,
        validation_rollout_ids=rollouts.validation,
        failed_rollout_ids=rollouts.failed,
    )


def stored_json(value: Any) -> Any:
    """`value` as the store gives it back (a JSON round trip of `to_json_value`)."""
    return json.loads(canonical_json(to_json_value(value)))


async def seal_group(
    store: Store,
    place: GroupPlace,
    done: GroupRollouts,
    *,
    scenario: Any,
    reward_function: Callable[..., Any],
    scorer: str,
    condition: Condition | None = None,
) -> list[float]:
    """Score the group's finished rollouts and seal it; returns the rewards, policy first.

    The reward function gets the scenario as `artstore rescore` will give it (the same
    inputs), the agents' results and the stored trajectories. Its rewards and the seal are
    one append: a group stream holds both or nothing (`condition`: what else the append
    checks, e.g. that a worker still holds its claim). A RewardFunctionError writes
    nothing. Both ways of sealing use this (the in-process loop and rollout workers).
    """
    ids = [*done.policy, *done.validation]
    trajectories = await store.trajectories(ids)
    rewards = await call_reward_function(
        reward_function,
        stored_json(scenario),
        [done.results[i] for i in ids],
        [trajectories[i] for i in ids],
        str(place),
    )
    await store.append(
        group_stream(place.group_id),
        [
            rewards_event(
                place.group_id, scorer, done.policy, done.validation, rewards, rescored=False
            ),
            sealed_event(
                place.group_id,
                run=place.run,
                epoch=place.epoch,
                batch=place.batch,
                scenario_index=place.scenario_index,
                rollouts=done,
            ),
        ],
        expected_version=NO_STREAM,
        condition=condition,
    )
    return rewards
