"""Re-scoring: new rewards for stored groups, without running any agent again.

The reward function gets what it got during the run — the stored scenario (as JSON), the
agents' stored results and the projected trajectories (with the rewards of the run's
scorer) — and its rewards are appended under a scorer name; earlier scores stay. A
training or a replay names the scorer it trains on.

A reward function may return `Rewards(values, metrics=[...])` instead of a plain list to
record metrics per trajectory beside the rewards (RULER's scores, for instance); they are
merged into the trajectories' metrics when the group is trained on that scorer.

A re-scoring resumes: by default it scores only the groups that have no rewards by the
scorer yet, so that running it again after it stopped (a crash, a failing judge, Ctrl-C)
pays the reward function once per group, not twice; `again=True` scores every group
anew. The unit is the group, scored whole: a group counts as scored when each of its
rollouts the reward function scores (policy and validation) has a reward by the scorer,
and a group missing any of them is scored again whole, because a group-relative scorer
(RULER) judges the rollouts of a group together. A group's rewards are one event, so a
group stopped in the middle has none.

While the reward function runs, the group holds no database connection: the rollouts,
results and trajectories are read before, and the rewards appended after, each read on a
pooled connection given back at once. A slow judge (an LLM over the network) holds up
nothing else, and as many groups as `concurrency` may wait for it at once whatever the
size of the connection pool.
"""

from __future__ import annotations

import asyncio
import inspect
import math
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

from sqlalchemy import select

from artstore.arguments import check_name, check_names, check_store, check_whole_number
from artstore.errors import (
    ConfigurationError,
    InvalidArgumentError,
    NotFoundError,
    RewardFunctionError,
)
from artstore.events import RewardsRecorded
from artstore.groups import (
    call_reward_function,
    group_rollouts,
    group_stream,
    rewards_event,
    sealed_groups,
)
from artstore.schema import tables as t
from artstore.training.runs import run_info

if TYPE_CHECKING:
    from artstore.store import Store

RewardFunction = Callable[[Any, list[Any], list[Any]], Any]
Metrics = dict[str, float | int | bool]


class Rewards(list):
    """A reward function's rewards, with metrics per trajectory to record beside them.

    `Rewards([1.0, 0.5], metrics=[{"judge_score": 1.0}, {"judge_score": 0.5}])`: a list
    of floats (so it is a valid plain result too) plus `metrics`, one dict per reward.
    """

    def __init__(self, values: Sequence[float], metrics: Sequence[Metrics] | None = None):
        super().__init__(values)
        self.metrics: list[Metrics] = [dict(m) for m in metrics] if metrics is not None else []


async def rescore(
    store: Store,
    run: str,
    reward_function: RewardFunction,
    scorer: str,
    *,
    group_ids: Sequence[str] | None = None,
    concurrency: int = 8,
    again: bool = False,
    on_start: Callable[[int], None] | None = None,
    on_group: Callable[[str], None] | None = None,
    on_skipped: Callable[[list[str]], None] | None = None,
) -> list[str]:
    """Score every sealed group of `run` (or `group_ids`) with `reward_function` as `scorer`.

    The function is called as during the run, `reward_function(scenario, results,
    trajectories)`, with the group's policy then validation rollouts, and may be async.
    Each group's rewards are one atomic `rewards.recorded` event (`rescored=True`), with
    the win metrics against the validation rollouts recomputed for the new rewards.

    Groups that `scorer` has scored already are left as they are, so that running a
    re-scoring again finishes it (see the module's docstring); `again=True` scores them
    anew, appending (their earlier rewards stay). Up to `concurrency` groups are scored at
    once. If the function fails for a group, no further group is started, the groups
    scored before keep their new rewards, and a RewardFunctionError names the failed
    group. Returns the ids of the groups scored, in the run's order. `on_skipped(ids)` is
    called once with the groups left as they were, `on_start(total)` once with the number
    of groups to score, `on_group(group_id)` after each group is recorded.
    """
    _check_arguments(store, run, reward_function, scorer, group_ids, concurrency)
    info = await run_info(store, run)
    group_ids = await _groups_of_run(store, run, group_ids)
    sealed = await sealed_groups(store, group_ids)
    todo = [g for g in group_ids if g in sealed and sealed[g].rollout_ids]
    if not again:
        done_before = await _scored_groups(store, {g: sealed[g] for g in todo}, scorer)
        todo = [g for g in todo if g not in done_before]
        if on_skipped is not None:
            on_skipped([g for g in group_ids if g in done_before])
    if on_start is not None:
        on_start(len(todo))

    async def score(group_id: str) -> None:
        await _score_group(
            store, run, info.scorer, group_id, sealed[group_id], scorer, reward_function
        )

    scored, failures = await _score_all(todo, score, concurrency, on_group)
    done = [g for g in todo if g in scored]
    if failures:
        first = failures[0]
        summary = (
            f"{len(done)} of {len(todo)} groups of run {run!r} were re-scored as {scorer!r} "
            "before it stopped (running it again scores the groups left)"
        )
        if isinstance(first, RewardFunctionError):
            raise RewardFunctionError(f"{first}; {summary}") from first
        first.add_note(summary)
        raise first
    return done


def _check_arguments(
    store: Any,
    run: Any,
    reward_function: Any,
    scorer: Any,
    group_ids: Any,
    concurrency: Any,
) -> None:
    check_store(store)
    check_names(run=run, scorer=scorer)
    if group_ids is not None:
        if isinstance(group_ids, str):
            raise InvalidArgumentError("group_ids", "must be group ids (a list), not a str")
        for group_id in group_ids:
            check_name("group_id", group_id)
    check_whole_number("concurrency", concurrency)
    if concurrency < 1:
        raise ConfigurationError(f"concurrency must be positive, got {concurrency}")
    if not callable(reward_function):
        raise ConfigurationError(f"the reward function {reward_function!r} is not callable")


async def _score_all(
    group_ids: list[str],
    score: Callable[[str], Awaitable[None]],
    concurrency: int,
    on_group: Callable[[str], None] | None,
) -> tuple[set[str], list[BaseException]]:
    """`score` each group, `concurrency` at a time; after a failure no group is started.

    Returns the groups scored and the failures.
    """
    limit = asyncio.Semaphore(concurrency)
    scored: set[str] = set()
    failures: list[BaseException] = []

    async def score_one(group_id: str) -> None:
        async with limit:
            if failures:
                return  # stop starting groups after the first failure
            try:
                await score(group_id)
            except Exception as exc:
                failures.append(exc)
                return
        scored.add(group_id)
        if on_group is not None:
            on_group(group_id)

    await asyncio.gather(*(score_one(g) for g in group_ids))
    return scored, failures


async def _groups_of_run(store: Store, run: str, group_ids: Sequence[str] | None) -> list[str]:
    """`group_ids`, each checked to be a sealed group of `run`; when None, all of them in
    the run's order."""
    async with store.database.read() as connection:
        in_run = [
            row.group_id
            for row in await connection.execute(
                select(t.groups.c.group_id)
                .where(t.groups.c.run == run)
                .order_by(t.groups.c.batch, t.groups.c.scenario_index, t.groups.c.position)
            )
        ]
    if group_ids is None:
        return in_run
    unknown = [g for g in group_ids if g not in set(in_run)]
    if unknown:
        raise NotFoundError(f"group {unknown[0]} is not a sealed group of run {run!r}")
    return list(group_ids)


async def _score_group(
    store: Store,
    run: str,
    run_scorer: str,
    group_id: str,
    event: Any,
    scorer: str,
    reward_function: RewardFunction,
) -> None:
    policy, validation = list(event.rollout_ids), list(event.validation_rollout_ids)
    ids = [*policy, *validation]
    done = await group_rollouts(store, group_id)
    scenario = await _stored_scenario(store, ids[0])
    trajectories = await store.trajectories(ids, scorer=run_scorer)
    returned: list[Any] = []

    async def capturing(*args: Any) -> Any:
        value = reward_function(*args)
        if inspect.isawaitable(value):
            value = await value
        returned.append(value)
        return value

    rewards = await call_reward_function(
        capturing,
        scenario,
        [done.results.get(rid) for rid in ids],
        [trajectories[rid] for rid in ids],
        f"run {run!r}, group {group_id} (scenario {event.scenario_index})",
    )
    recorded = rewards_event(group_id, scorer, policy, validation, rewards, rescored=True)
    extra = getattr(returned[0], "metrics", None) if returned else None
    if extra:
        recorded = _with_metrics(recorded, ids, extra, group_id)
    await store.append(group_stream(group_id), [recorded])


def _with_metrics(
    recorded: RewardsRecorded, ids: list[str], extra: Sequence[Metrics], group_id: str
) -> RewardsRecorded:
    """The event with the reward function's metrics merged under the win metrics."""
    if len(extra) != len(ids):
        raise RewardFunctionError(
            f"group {group_id}: the reward function returned {len(extra)} metrics dicts "
            f"for {len(ids)} trajectories"
        )
    metrics: dict[str, Metrics] = {}
    for rollout_id, values in zip(ids, extra, strict=True):
        merged = dict(values)
        for name, value in merged.items():
            if not isinstance(value, (bool, int, float)) or not math.isfinite(value):
                raise RewardFunctionError(
                    f"group {group_id}: metric {name!r} of rollout {rollout_id} is {value!r}; "
                    "metrics are finite numbers or booleans"
                )
        merged.update(recorded.metrics.get(rollout_id, {}))
        if merged:
            metrics[rollout_id] = merged
    return RewardsRecorded(
        group_id=recorded.group_id,
        scorer=recorded.scorer,
        rewards=recorded.rewards,
        metrics=metrics,
        rescored=recorded.rescored,
    )


async def _scored_groups(store: Store, sealed: dict[str, Any], scorer: str) -> set[str]:
    """The groups (of these seals) that have a `scorer` reward for every rollout scored."""
    group_ids = list(sealed)
    scored: dict[str, set[str]] = {}
    async with store.database.read() as connection:
        for start in range(0, len(group_ids), 500):
            for row in await connection.execute(
                select(t.rewards.c.group_id, t.rewards.c.rollout_id).where(
                    t.rewards.c.group_id.in_(group_ids[start : start + 500]),
                    t.rewards.c.scorer == scorer,
                )
            ):
                scored.setdefault(row.group_id, set()).add(row.rollout_id)
    return {
        g
        for g, event in sealed.items()
        if {*event.rollout_ids, *event.validation_rollout_ids} <= scored.get(g, set())
    }


async def _stored_scenario(store: Store, rollout_id: str) -> Any:
    async with store.database.read() as connection:
        return (
            await connection.execute(
                select(t.rollouts.c.scenario).where(t.rollouts.c.rollout_id == rollout_id)
            )
        ).scalar()
