"""Re-scoring: new rewards for stored groups, without running any agent again.

The reward function gets what it got during the run — the stored scenario, the agents'
stored results and the projected trajectories — and its rewards are appended under a
scorer name; earlier scores stay. A training or a replay names the scorer it trains on.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from sqlalchemy import select

from artstore.schema import tables as t
from artstore.training.groups import (
    call_reward_function,
    group_rollouts,
    group_stream,
    rewards_event,
    sealed_groups,
)
from artstore.training.replay import run_info

if TYPE_CHECKING:
    from artstore.store import Store

RewardFunction = Callable[[Any, list[Any], list[Any]], Any]


async def rescore(
    store: Store,
    run: str,
    reward_function: RewardFunction,
    scorer: str,
    *,
    group_ids: Sequence[str] | None = None,
    concurrency: int = 8,
    on_group: Callable[[str], None] | None = None,
) -> list[str]:
    """Score every sealed group of `run` (or `group_ids`) with `reward_function` as `scorer`.

    Each group's rewards are one atomic event. If the function fails for a group, the
    groups scored before it keep their new rewards and the error says which group failed.
    Returns the ids of the groups scored.
    """
    if not scorer or not scorer.strip():
        raise ValueError("a scorer name is needed (the rewards are recorded under it)")
    await run_info(store, run)
    if group_ids is None:
        async with store.database.read() as connection:
            group_ids = [
                row.group_id
                for row in await connection.execute(
                    select(t.groups.c.group_id)
                    .where(t.groups.c.run == run)
                    .order_by(t.groups.c.batch, t.groups.c.scenario_index)
                )
            ]
    sealed = await sealed_groups(store, list(group_ids))
    limit = asyncio.Semaphore(concurrency)
    scored: list[str] = []

    async def score(group_id: str) -> None:
        event = sealed[group_id]
        policy, validation = event.rollout_ids, event.validation_rollout_ids
        ids = [*policy, *validation]
        async with limit:
            done = await group_rollouts(store, group_id)
            scenario = await _stored_scenario(store, ids[0])
            trajectories = await store.trajectories(ids)
            rewards = await call_reward_function(
                reward_function,
                scenario,
                [done.results.get(rid) for rid in ids],
                [trajectories[rid] for rid in ids],
                f"run {run!r}, group {group_id} (scenario {event.scenario_index})",
            )
            await store.append(
                group_stream(group_id),
                [rewards_event(group_id, scorer, policy, validation, rewards, rescored=True)],
            )
        scored.append(group_id)
        if on_group is not None:
            on_group(group_id)

    outcomes = await asyncio.gather(
        *(score(g) for g in group_ids if g in sealed), return_exceptions=True
    )
    failures = [o for o in outcomes if isinstance(o, BaseException)]
    if failures:
        failures[0].add_note(
            f"{len(scored)} groups of run {run!r} were re-scored as {scorer!r}, "
            f"{len(failures)} failed; re-scoring appends, so running it again is safe"
        )
        raise failures[0]
    return scored


async def _stored_scenario(store: Store, rollout_id: str) -> Any:
    async with store.database.read() as connection:
        return (
            await connection.execute(
                select(t.rollouts.c.scenario).where(t.rollouts.c.rollout_id == rollout_id)
            )
        ).scalar()
