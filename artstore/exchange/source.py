"""A run as the exports read it: its groups in training order, their rollouts and rewards.

`load_run` reads the outline (groups, rollout ids, consumption) in a few queries;
`load_rollouts` reads the details of some rollouts at once (events, rewards,
trajectories), so that an export holds one chunk of a large run in memory at a time.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sqlalchemy import select

from artstore.errors import NotFoundError
from artstore.events import (
    GroupSealed,
    LLMCall,
    RolloutFailed,
    RolloutFinished,
    RolloutStarted,
)
from artstore.groups import sealed_groups
from artstore.schema import tables as t

if TYPE_CHECKING:
    import art

    from artstore.store import Store


@dataclass
class GroupOutline:
    group_id: str | None  # None: the run's rollouts that belong to no group
    sealed: GroupSealed | None
    rollout_ids: list[str]  # sealed order: policy, validation, failed, then any others
    roles: dict[str, str]  # rollout id -> policy | validation
    statuses: dict[str, str]  # rollout id -> finished | failed
    consumed: dict[str, int] = field(default_factory=dict)  # trained model -> step after

    @property
    def batch(self) -> int | None:
        return self.sealed.batch if self.sealed else None


@dataclass
class RunOutline:
    info: Any  # the `runs` row
    groups: list[GroupOutline]
    skipped_running: int  # rollouts still running (not exported)

    @property
    def own_models(self) -> set[str]:
        """How the run's own trained model is named in `group_consumptions`."""
        return {self.info.model, f"{self.info.project}/{self.info.model}"}

    def own_step(self, group: GroupOutline, model: str | None = None) -> int | None:
        """The step after the train step that consumed `group` (for `model`, or the run's)."""
        for name in [model] if model else sorted(self.own_models):
            if name in group.consumed:
                return group.consumed[name]
        return None


@dataclass
class ExportSummary:
    run: str
    path: str
    files: list[str] = field(default_factory=list)
    groups: int = 0
    trajectories: int = 0
    unscored_groups: int = 0  # left out: no reward by the scorer
    failed_rollouts: int = 0  # left out (parquet) / included (JSONL)
    unsealed_groups: int = 0  # left out of the parquet
    running_rollouts: int = 0  # left out: not finished yet


@dataclass
class RolloutDetails:
    started: RolloutStarted
    finished: RolloutFinished | None
    failed: RolloutFailed | None
    rewards: list[Any]  # `rewards` rows, oldest first
    trajectory: art.Trajectory
    # Its LLM calls in order, the ones a later record superseded left out
    calls: list[LLMCall] = field(default_factory=list)


async def load_run(store: Store, run: str) -> RunOutline:
    """The outline of `run`, or NotFoundError."""
    async with store.database.read() as connection:
        info = (await connection.execute(select(t.runs).where(t.runs.c.run == run))).first()
        if info is None:
            raise NotFoundError(f"no run {run!r} in this store (see `artstore runs`)")
        rollouts = (
            await connection.execute(
                select(
                    t.rollouts.c.rollout_id,
                    t.rollouts.c.group_id,
                    t.rollouts.c.role,
                    t.rollouts.c.status,
                )
                .where(t.rollouts.c.run == run)
                .order_by(t.rollouts.c.started_at, t.rollouts.c.rollout_id)
            )
        ).all()
        groups = (
            await connection.execute(
                select(
                    t.groups.c.group_id,
                    t.groups.c.batch,
                    t.groups.c.scenario_index,
                    t.groups.c.position,
                ).where(t.groups.c.run == run)
            )
        ).all()
        named = [g.group_id for g in groups] + [r.group_id for r in rollouts if r.group_id]
        group_ids = list(dict.fromkeys(named))
        consumed: dict[str, dict[str, int]] = {}
        for start in range(0, len(group_ids), 500):
            query = select(
                t.group_consumptions.c.group_id,
                t.group_consumptions.c.model,
                t.group_consumptions.c.step,
            ).where(t.group_consumptions.c.group_id.in_(group_ids[start : start + 500]))
            for row in await connection.execute(query):
                consumed.setdefault(row.group_id, {})[row.model] = row.step

    sealed = await sealed_groups(store, [g.group_id for g in groups])
    done = [r for r in rollouts if r.status in ("finished", "failed")]
    roles = {r.rollout_id: r.role for r in done}
    statuses = {r.rollout_id: r.status for r in done}
    by_group: dict[str | None, list[str]] = {}
    for r in done:
        by_group.setdefault(r.group_id, []).append(r.rollout_id)

    def order(g: Any) -> tuple:
        return (g.batch is None, g.batch or 0, g.scenario_index is None, g.scenario_index or 0)

    outlines = []
    for g in sorted(groups, key=lambda g: (*order(g), g.position)):
        event = sealed.get(g.group_id)
        if event is None:
            continue
        named = list(
            dict.fromkeys(
                [*event.rollout_ids, *event.validation_rollout_ids, *event.failed_rollout_ids]
            )
        )
        others = [rid for rid in by_group.pop(g.group_id, []) if rid not in named]
        ids = [rid for rid in named if rid in roles] + others
        outlines.append(
            GroupOutline(g.group_id, event, ids, roles, statuses, consumed.get(g.group_id, {}))
        )
    for group_id, ids in by_group.items():  # unsealed groups, and rollouts of no group
        outlines.append(
            GroupOutline(group_id, None, ids, roles, statuses, consumed.get(group_id or "", {}))
        )
    running = sum(1 for r in rollouts if r.status not in ("finished", "failed"))
    return RunOutline(info=info, groups=outlines, skipped_running=running)


async def run_scorer(store: Store, run: str) -> str:
    """The scorer of `run` (whose reward a trajectory carries), or NotFoundError."""
    async with store.database.read() as connection:
        query = select(t.runs.c.scorer).where(t.runs.c.run == run)
        scorer = (await connection.execute(query)).scalar()
    if scorer is None:
        raise NotFoundError(f"no run {run!r} in this store (see `artstore runs`)")
    return scorer


async def load_rollouts(
    store: Store, rollout_ids: list[str], scorer: str | None
) -> dict[str, RolloutDetails]:
    """Events, every reward and the trajectory (rewarded by `scorer`) of each rollout."""
    streams = await store.read_streams(f"rollout-{rid}" for rid in rollout_ids)
    trajectories = await store.trajectories(rollout_ids, scorer=scorer)
    rewards: dict[str, list[Any]] = {rid: [] for rid in rollout_ids}
    async with store.database.read() as connection:
        for start in range(0, len(rollout_ids), 500):
            query = (
                select(t.rewards)
                .where(t.rewards.c.rollout_id.in_(rollout_ids[start : start + 500]))
                .order_by(t.rewards.c.position, t.rewards.c.id)
            )
            for row in await connection.execute(query):
                rewards[row.rollout_id].append(row)
    details = {}
    for rid in rollout_ids:
        events = [e.decode() for e in streams[f"rollout-{rid}"]]
        details[rid] = RolloutDetails(
            started=next(e for e in events if isinstance(e, RolloutStarted)),
            finished=next((e for e in events if isinstance(e, RolloutFinished)), None),
            failed=next((e for e in events if isinstance(e, RolloutFailed)), None),
            rewards=rewards[rid],
            trajectory=trajectories[rid],
            calls=_calls(events),
        )
    return details


CHUNK_ROLLOUTS = 500  # rollouts an export holds in memory at a time (about)


def _calls(events: list[Any]) -> list[LLMCall]:
    calls = [e for e in events if isinstance(e, LLMCall)]
    superseded = {call.supersedes for call in calls if call.supersedes}
    return sorted((c for c in calls if c.call_id not in superseded), key=lambda c: c.index)


def chunks(groups: list[GroupOutline], size: int | None = None) -> list[list[GroupOutline]]:
    """Consecutive groups holding about `size` rollouts together (a group is never split);
    CHUNK_ROLLOUTS, read when called, by default (a test of memory shrinks it)."""
    size = size or CHUNK_ROLLOUTS
    found: list[list[GroupOutline]] = [[]]
    count = 0
    for group in groups:
        if found[-1] and count + len(group.rollout_ids) > size:
            found.append([])
            count = 0
        found[-1].append(group)
        count += len(group.rollout_ids)
    return [chunk for chunk in found if chunk]
