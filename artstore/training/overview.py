"""What a run did, read from the projection tables: for `artstore runs` and `artstore show`.

Plain SQLAlchemy Core queries; every function returns JSON-ready dicts, so the command
line only formats them. Times are UTC text in the views' format, `YYYY-MM-DD
HH:MM:SS.ffffff`, the one timestamp format of artstore's output.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import and_, func, select

from artstore.schema import tables as t
from artstore.training.lease import trainers_gone
from artstore.training.runs import model_name, own_models, run_info

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection

    from artstore.store import Store

Row = dict[str, Any]

# Train-step metrics shown first when a table has room for only a few.
PREFERRED_METRICS = (
    "loss",
    "reward",
    "reward_mean",
    "reward_std",
    "num_groups_trainable",
    "mean_abs_advantage",
    "grad_norm",
    "entropy",
    "learning_rate",
)


TIMESTAMP_FORMAT = "%Y-%m-%d %H:%M:%S.%f"  # as the views show times (docs/views.md)


def timestamp_text(value: datetime | None) -> str | None:
    """A time as UTC text, `YYYY-MM-DD HH:MM:SS.ffffff` (sorts in time order)."""
    if value is None:
        return None
    if value.tzinfo is None:  # SQLite keeps no zone; the store writes UTC
        value = value.replace(tzinfo=UTC)
    return value.astimezone(UTC).strftime(TIMESTAMP_FORMAT)


def _latest_rewards():
    """Subquery: the latest reward row of each (rollout, scorer)."""
    r = t.rewards
    latest_id = select(func.max(r.c.id).label("id")).group_by(r.c.rollout_id, r.c.scorer)
    return (
        select(r.c.rollout_id, r.c.group_id, r.c.scorer, r.c.reward, r.c.rescored)
        .where(r.c.id.in_(latest_id))
        .subquery("latest")
    )


async def list_runs(store: Store) -> list[Row]:
    """One row per run: its model, status, steps, groups, rollouts and latest reward.

    A run recorded as running whose trainer is gone has the status `stale`
    (`artstore.training.lease.trainers_gone`).
    """
    ru, ro, g, gc, ts = t.runs, t.rollouts, t.groups, t.group_consumptions, t.train_steps
    async with store.database.read() as c:
        runs = (await c.execute(select(ru).order_by(ru.c.started_at, ru.c.run))).all()
        rollouts: dict[str, dict[str, int]] = defaultdict(dict)
        for row in await c.execute(
            select(ro.c.run, ro.c.status, func.count().label("n"))
            .where(ro.c.run.is_not(None))
            .group_by(ro.c.run, ro.c.status)
        ):
            rollouts[row.run][row.status] = row.n
        groups = dict((await c.execute(select(g.c.run, func.count()).group_by(g.c.run))).all())
        consumed: dict[tuple[str, str], int] = {
            (row.run, row.model): row.n
            for row in await c.execute(
                select(gc.c.run, gc.c.model, func.count().label("n")).group_by(gc.c.run, gc.c.model)
            )
        }
        steps: dict[tuple[str, str], tuple[int, int | None]] = {
            (row.run, row.model): (row.n, row.last)
            for row in await c.execute(
                select(
                    ts.c.run, ts.c.model, func.count().label("n"), func.max(ts.c.step).label("last")
                )
                .where(ts.c.status == "completed")
                .group_by(ts.c.run, ts.c.model)
            )
        }
        batch_rewards = await _batch_reward_means(c)
    stale = await trainers_gone(
        store.database,
        ((r.run, f"{r.project}/{r.model}", r.trainer) for r in runs if r.status == "running"),
    )
    result = []
    for run in runs:
        models = own_models(run)
        own_steps = [steps[(run.run, m)] for m in models if (run.run, m) in steps]
        by_batch = batch_rewards.get(run.run, {})
        last_batch = max(by_batch, default=None, key=lambda b: -1 if b is None else b)
        result.append(
            {
                "run": run.run,
                "model": model_name(run),
                "status": "stale" if run.run in stale else run.status,
                "steps": sum(n for n, _ in own_steps),
                "step": max((last for _, last in own_steps if last is not None), default=None),
                "groups_sealed": groups.get(run.run, 0),
                "groups_consumed": sum(consumed.get((run.run, m), 0) for m in models),
                "rollouts_finished": rollouts[run.run].get("finished", 0),
                "rollouts_failed": rollouts[run.run].get("failed", 0),
                "rollouts_running": rollouts[run.run].get("running", 0),
                "scorer": run.scorer,
                "last_batch": last_batch,
                "last_batch_reward_mean": by_batch.get(last_batch) if by_batch else None,
                "started_at": timestamp_text(run.started_at),
                "finished_at": timestamp_text(run.finished_at),
            }
        )
    return result


async def _batch_reward_means(
    c: AsyncConnection, run: str | None = None
) -> dict[str, dict[int | None, float]]:
    """Mean latest reward (by the run's scorer) of the policy rollouts of each batch."""
    ru, ro, g = t.runs, t.rollouts, t.groups
    latest = _latest_rewards()
    query = (
        select(g.c.run, g.c.batch, func.avg(latest.c.reward).label("mean"))
        .select_from(
            latest.join(g, g.c.group_id == latest.c.group_id)
            .join(ru, and_(ru.c.run == g.c.run, ru.c.scorer == latest.c.scorer))
            .join(ro, and_(ro.c.rollout_id == latest.c.rollout_id, ro.c.role == "policy"))
        )
        .group_by(g.c.run, g.c.batch)
    )
    if run is not None:
        query = query.where(g.c.run == run)
    found: dict[str, dict[int | None, float]] = defaultdict(dict)
    for row in await c.execute(query):
        found[row.run][row.batch] = float(row.mean)
    return found


async def describe_run(store: Store, run: str) -> dict[str, Any]:
    """Everything `artstore show` prints about `run`, section by section.

    Sections: "run" (one dict), then lists of rows: "steps", "groups", "rewards",
    "consumption", "failures".
    """
    info = await run_info(store, run)
    stale = info.status == "running" and bool(
        await trainers_gone(
            store.database, [(info.run, f"{info.project}/{info.model}", info.trainer)]
        )
    )
    async with store.database.read() as c:
        return {
            "run": {**await _run_section(c, info), **({"status": "stale"} if stale else {})},
            "steps": await _steps_section(c, run),
            "groups": await _groups_section(c, run),
            "rewards": await _rewards_section(c, run),
            "consumption": await _consumption_section(c, run),
            "failures": await _failures_section(c, info),
        }


async def _run_section(c: AsyncConnection, info: Any) -> Row:
    ro = t.rollouts
    counts = dict(
        (
            await c.execute(
                select(ro.c.status, func.count()).where(ro.c.run == info.run).group_by(ro.c.status)
            )
        ).all()
    )
    by_batch = (await _batch_reward_means(c, info.run)).get(info.run, {})
    return {
        "run": info.run,
        "model": model_name(info),
        "base_model": info.base_model,
        "validation_model": info.validation_model,
        "scorer": info.scorer,
        "status": info.status,
        "error": info.error,
        "trainer": info.trainer,
        "scenarios": info.num_scenarios,
        "config": dict(info.config or {}),
        "rollouts_finished": counts.get("finished", 0),
        "rollouts_failed": counts.get("failed", 0),
        "rollouts_running": counts.get("running", 0),
        "started_at": timestamp_text(info.started_at),
        "finished_at": timestamp_text(info.finished_at),
        # The mean latest reward (by the run's scorer) of each batch's policy rollouts.
        "reward_per_batch": [
            {"batch": batch, "reward_mean": mean}
            for batch, mean in sorted(
                by_batch.items(), key=lambda item: -1 if item[0] is None else item[0]
            )
        ],
    }


async def _group_reward_means(c: AsyncConnection, run: str) -> dict[tuple[str, str], float]:
    """Mean latest reward of each group's policy rollouts, per scorer."""
    ro, g = t.rollouts, t.groups
    latest = _latest_rewards()
    rows = await c.execute(
        select(latest.c.group_id, latest.c.scorer, func.avg(latest.c.reward).label("mean"))
        .select_from(
            latest.join(g, g.c.group_id == latest.c.group_id).join(
                ro, and_(ro.c.rollout_id == latest.c.rollout_id, ro.c.role == "policy")
            )
        )
        .where(g.c.run == run)
        .group_by(latest.c.group_id, latest.c.scorer)
    )
    return {(row.group_id, row.scorer): float(row.mean) for row in rows}


async def _steps_section(c: AsyncConnection, run: str) -> list[Row]:
    """Each train step of the run (every model), with the mean reward it trained on."""
    ts, g = t.train_steps, t.groups
    steps = (await c.execute(select(ts).where(ts.c.run == run).order_by(ts.c.id))).all()
    batches = dict((await c.execute(select(g.c.group_id, g.c.batch).where(g.c.run == run))).all())
    trained_on = await _rewards_as_trained(c, run)
    rows = []
    for step in steps:
        group_ids = list(step.group_ids or [])
        rewards = [
            reward
            for gid in group_ids
            for reward in trained_on(step.model, gid, step.scorer, step.status == "completed")
        ]
        rows.append(
            {
                "model": step.model,
                "step_before": step.step_before,
                "step": step.step,
                "status": step.status,
                "scorer": step.scorer,
                "groups": len(group_ids),
                "batches": sorted(
                    {batches[gid] for gid in group_ids if batches.get(gid) is not None}
                ),
                "reward_mean": sum(rewards) / len(rewards) if rewards else None,
                "metrics": dict(step.metrics or {}),
                "duration_s": step.duration_s,
                "checkpoint": step.checkpoint,
                "pushed_to": step.pushed_to,
                "reconciled": bool(step.reconciled),
                "error": f"{step.error_type}: {step.error_message}" if step.error_type else None,
                "started_at": timestamp_text(step.started_at),
                "group_ids": group_ids,
            }
        )
    return rows


async def _rewards_as_trained(c: AsyncConnection, run: str):
    """`rewards(model, group, scorer, completed)`: the group's policy rewards by `scorer`
    as a step trained them (the latest recorded before the step consumed the group; the
    latest of all for a step that did not complete). A later re-scoring under the same
    scorer name does not change what a finished step trained on."""
    r, g, ro, gc = t.rewards, t.groups, t.rollouts, t.group_consumptions
    recorded = (
        await c.execute(
            select(r.c.group_id, r.c.rollout_id, r.c.scorer, r.c.reward, r.c.position)
            .select_from(
                r.join(g, g.c.group_id == r.c.group_id).join(
                    ro, and_(ro.c.rollout_id == r.c.rollout_id, ro.c.role == "policy")
                )
            )
            .where(g.c.run == run)
            .order_by(r.c.position, r.c.id)
        )
    ).all()
    consumed = {
        (row.model, row.group_id): row.position
        for row in await c.execute(
            select(gc.c.model, gc.c.group_id, gc.c.position).where(gc.c.run == run)
        )
    }

    by_group: dict[tuple[str, str], list[Any]] = defaultdict(list)
    for row in recorded:
        by_group[(row.group_id, row.scorer)].append(row)

    def rewards(model: str, group_id: str, scorer: str, completed: bool) -> list[float]:
        before = consumed.get((model, group_id)) if completed else None
        latest: dict[str, float] = {}
        for row in by_group.get((group_id, scorer), ()):
            if before is None or row.position < before:
                latest[row.rollout_id] = row.reward
        return list(latest.values())

    return rewards


async def _groups_section(c: AsyncConnection, run: str) -> list[Row]:
    g, gc = t.groups, t.group_consumptions
    groups = (
        await c.execute(
            select(g).where(g.c.run == run).order_by(g.c.batch, g.c.scenario_index, g.c.position)
        )
    ).all()
    consumed: dict[str, list[str]] = defaultdict(list)
    for row in await c.execute(
        select(gc.c.group_id, gc.c.model, gc.c.step)
        .where(gc.c.run == run)
        .order_by(gc.c.position, gc.c.model)
    ):
        consumed[row.group_id].append(f"{row.model}@{row.step}")
    means = await _group_reward_means(c, run)
    rows = []
    for group in groups:
        rows.append(
            {
                "group_id": group.group_id,
                "epoch": group.epoch,
                "batch": group.batch,
                "scenario_index": group.scenario_index,
                "size": group.size,
                "validation": group.num_validation,
                "failed": group.num_failed,
                "rewards": {
                    scorer: mean
                    for (gid, scorer), mean in sorted(means.items())
                    if gid == group.group_id
                },
                "consumed_by": consumed.get(group.group_id, []),
            }
        )
    return rows


async def _rewards_section(c: AsyncConnection, run: str) -> list[Row]:
    """Per scorer: how many groups and rollouts it scored, and its latest rewards' spread."""
    r, g, ro = t.rewards, t.groups, t.rollouts
    latest = _latest_rewards()
    stats = {
        row.scorer: row
        for row in await c.execute(
            select(
                latest.c.scorer,
                func.count(latest.c.group_id.distinct()).label("groups"),
                func.count().label("rollouts"),
                func.avg(latest.c.reward).label("mean"),
                func.min(latest.c.reward).label("min"),
                func.max(latest.c.reward).label("max"),
            )
            .select_from(
                latest.join(g, g.c.group_id == latest.c.group_id).join(
                    ro, and_(ro.c.rollout_id == latest.c.rollout_id, ro.c.role == "policy")
                )
            )
            .where(g.c.run == run)
            .group_by(latest.c.scorer)
        )
    }
    history = {
        row.scorer: row
        for row in await c.execute(
            select(
                r.c.scorer,
                func.count(r.c.position.distinct()).label("events"),
                func.max(r.c.recorded_at).label("last"),
                func.count(r.c.position.distinct()).filter(r.c.rescored).label("rescores"),
            )
            .select_from(r.join(g, g.c.group_id == r.c.group_id))
            .where(g.c.run == run)
            .group_by(r.c.scorer)
        )
    }
    rows = []
    for scorer in sorted(history):
        s, h = stats.get(scorer), history[scorer]
        rows.append(
            {
                "scorer": scorer,
                "groups": s.groups if s else 0,
                "rollouts": s.rollouts if s else 0,
                "reward_mean": float(s.mean) if s and s.mean is not None else None,
                "reward_min": s.min if s else None,
                "reward_max": s.max if s else None,
                "events": h.events,
                "rescored_events": h.rescores,
                "last_recorded_at": timestamp_text(h.last),
            }
        )
    return rows


async def _consumption_section(c: AsyncConnection, run: str) -> list[Row]:
    """Per trained model: the groups of this run it consumed, and its steps on them."""
    gc, ts = t.group_consumptions, t.train_steps
    steps = {
        row.model: row
        for row in await c.execute(
            select(
                ts.c.model,
                func.count().filter(ts.c.status == "completed").label("completed"),
                func.count().filter(ts.c.status == "failed").label("failed"),
                func.max(ts.c.step).label("last_step"),
            )
            .where(ts.c.run == run)
            .group_by(ts.c.model)
        )
    }
    consumed = {
        row.model: row
        for row in await c.execute(
            select(
                gc.c.model,
                func.count().label("groups"),
                func.max(gc.c.consumed_at).label("last"),
            )
            .where(gc.c.run == run)
            .group_by(gc.c.model)
        )
    }
    scorers: dict[str, set[str]] = defaultdict(set)
    for row in await c.execute(select(gc.c.model, gc.c.scorer).where(gc.c.run == run).distinct()):
        scorers[row.model].add(row.scorer)
    rows = []
    for model in sorted(set(steps) | set(consumed)):
        s, k = steps.get(model), consumed.get(model)
        rows.append(
            {
                "model": model,
                "groups_consumed": k.groups if k else 0,
                "steps_completed": s.completed if s else 0,
                "steps_failed": s.failed if s else 0,
                "last_step": s.last_step if s else None,
                "scorers": sorted(scorers.get(model, ())),
                "last_consumed_at": timestamp_text(k.last) if k else None,
            }
        )
    return rows


async def _failures_section(c: AsyncConnection, info: Any) -> list[Row]:
    """Failed rollouts (error type and message), failed train steps, and the run's error."""
    ro, ts = t.rollouts, t.train_steps
    rows: list[Row] = []
    for row in await c.execute(
        select(ro)
        .where(ro.c.run == info.run, ro.c.status == "failed")
        .order_by(ro.c.started_at, ro.c.rollout_id)
    ):
        rows.append(
            {
                "kind": "rollout",
                "id": row.rollout_id,
                "where": f"group {row.group_id}, scenario {row.scenario_index}",
                "error_type": row.error_type,
                "error_message": row.error_message,
                "at": timestamp_text(row.finished_at or row.started_at),
            }
        )
    for row in await c.execute(
        select(ts).where(ts.c.run == info.run, ts.c.status == "failed").order_by(ts.c.id)
    ):
        rows.append(
            {
                "kind": "train step",
                "id": f"{row.model}@{row.step_before}",
                "where": f"step {row.step_before + 1}, {row.num_groups} groups",
                "error_type": row.error_type,
                "error_message": row.error_message,
                "at": timestamp_text(row.finished_at),
            }
        )
    if info.status == "failed":
        rows.append(
            {
                "kind": "run",
                "id": info.run,
                "where": "run",
                "error_type": None,
                "error_message": info.error,
                "at": timestamp_text(info.finished_at),
            }
        )
    return rows
