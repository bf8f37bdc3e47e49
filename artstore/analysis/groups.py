"""One group, its rollouts side by side: what the viewer's group page and `artstore group` show.

Read through the SQL views. Advantages are ART's (`artstore.backends.check_only.
group_advantages`: reward minus the group's mean, divided by the population std), for each
scorer that scored every policy rollout of the group, as a train step on that scorer's
latest rewards would compute them.
"""

from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING, Any

from sqlalchemy import select

from artstore.advantages import group_advantages
from artstore.errors import NotFoundError
from artstore.schema.views import view_table

if TYPE_CHECKING:
    from artstore.store import Store

Row = dict[str, Any]

_GROUP_FIELDS = (
    "group_id",
    "run",
    "epoch",
    "batch",
    "scenario_index",
    "size",
    "num_validation",
    "num_failed",
    "sealed_at",
)


async def group_detail(store: Store, group_id: str) -> Row:
    """The group: where it belongs, its rollouts (rewards per scorer, advantages, tokens,
    messages), and the train steps that consumed it (model, step, scorer)."""
    groups, rollouts = view_table("v_groups"), view_table("v_rollouts")
    rewards, messages = view_table("v_latest_rewards"), view_table("v_trajectory_messages")
    async with store.database.read() as c:
        stats = [
            dict(row._mapping)
            for row in await c.execute(
                select(groups).where(groups.c.group_id == group_id).order_by(groups.c.scorer)
            )
        ]
        if not stats:
            raise NotFoundError(f"no sealed group {group_id!r} in this store")
        members = [
            dict(row._mapping)
            for row in await c.execute(
                select(rollouts)
                .where(rollouts.c.group_id == group_id)
                .order_by(rollouts.c.started_at, rollouts.c.rollout_id)
            )
        ]
        scored = await c.execute(
            select(rewards.c.rollout_id, rewards.c.scorer, rewards.c.reward, rewards.c.metrics)
            .where(rewards.c.group_id == group_id)
            .order_by(rewards.c.scorer)
        )
        by_rollout: dict[str, dict[str, Row]] = defaultdict(dict)
        for row in scored:
            by_rollout[row.rollout_id][row.scorer] = {
                "reward": row.reward,
                "metrics": row.metrics or {},
            }
        chat: dict[str, list[Row]] = defaultdict(list)
        ids = [m["rollout_id"] for m in members]
        for row in await c.execute(
            select(
                messages.c.rollout_id,
                messages.c.role,
                messages.c.content,
                messages.c.trainable,
                messages.c.tool_names,
                messages.c.tool_calls,
            )
            .where(messages.c.rollout_id.in_(ids), messages.c.history_index == 0)
            .order_by(messages.c.rollout_id, messages.c.message_index)
        ):
            chat[row.rollout_id].append(dict(row._mapping))
    group = {key: stats[0][key] for key in _GROUP_FIELDS}
    group["scorers"] = {
        row["scorer"]: {
            key: row[key]
            for key in ("num_rewards", "reward_mean", "reward_std", "reward_min", "reward_max")
        }
        for row in stats
        if row["scorer"] is not None
    }
    policy = [m for m in members if m["role"] == "policy" and m["status"] == "finished"]
    advantages: dict[str, dict[str, float]] = {}
    for scorer in group["scorers"]:
        values = [by_rollout[m["rollout_id"]].get(scorer) for m in policy]
        if policy and all(v is not None for v in values):
            computed = group_advantages([v["reward"] for v in values if v is not None])
            advantages[scorer] = {m["rollout_id"]: a for m, a in zip(policy, computed, strict=True)}
    for member in members:
        rid = member["rollout_id"]
        member["rewards"] = by_rollout.get(rid, {})
        member["advantages"] = {s: found[rid] for s, found in advantages.items() if rid in found}
        member["messages"] = chat.get(rid, [])
    group["rollouts"] = members
    group["consumed"] = await consumptions(store, group_id, group["run"])
    return group


async def consumptions(store: Store, group_id: str, run: str | None) -> list[Row]:
    """The completed train steps that trained on the group: model, step reached, scorer."""
    steps = view_table("v_train_steps")
    query = select(
        steps.c.model, steps.c.step, steps.c.scorer, steps.c.finished_at, steps.c.group_ids
    ).where(steps.c.status == "completed")
    if run is not None:
        query = query.where(steps.c.run == run)
    async with store.database.read() as c:
        return [
            {
                "model": row.model,
                "step": row.step,
                "scorer": row.scorer,
                "finished_at": row.finished_at,
            }
            for row in await c.execute(query.order_by(steps.c.id))
            if group_id in (row.group_ids or [])
        ]
