"""What a run looks like over time, read through the SQL views: for the viewer's pages.

Every function takes an open store and returns JSON-ready dicts and lists, so that a page
can embed them as they are. Rewards are the *latest* per rollout and scorer (a re-scoring
replaces what it re-scored, as in the views); policy rollouts only, unless said.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from typing import TYPE_CHECKING, Any

from sqlalchemy import and_, func, select

from artstore.analysis.sql import plain
from artstore.errors import NotFoundError
from artstore.schema import tables as t
from artstore.schema.views import view_table
from artstore.training.lease import trainers_gone
from artstore.training.overview import PREFERRED_METRICS, list_runs

if TYPE_CHECKING:
    from artstore.store import Store

Row = dict[str, Any]


def _rows(result: Any) -> list[Row]:
    return [dict(row._mapping) for row in result]


async def runs_table(store: Store) -> list[Row]:
    """Every run, as `artstore runs` lists it (`stale` included), with its tokens, its
    failures (rollouts and train steps) and its reward per policy step (a sparkline)."""
    listed = await list_runs(store)
    runs, steps = view_table("v_runs"), view_table("v_train_steps")
    async with store.database.read() as c:
        tokens = dict((await c.execute(select(runs.c.run, runs.c.total_tokens))).all())
        failed_steps = dict(
            (
                await c.execute(
                    select(steps.c.run, func.count())
                    .where(steps.c.status == "failed")
                    .group_by(steps.c.run)
                )
            ).all()
        )
    curves = await _reward_means_by_step(store)
    for row in listed:
        row["total_tokens"] = tokens.get(row["run"])
        row["train_steps_failed"] = failed_steps.get(row["run"], 0)
        row["failures"] = row["rollouts_failed"] + row["train_steps_failed"]
        row["reward_curve"] = curves.get(row["run"], [])
        row["reward"] = row["reward_curve"][-1]["mean"] if row["reward_curve"] else None
    return listed


async def _reward_means_by_step(store: Store) -> dict[str, list[Row]]:
    """Per run: the mean latest reward (by the run's scorer) of its policy rollouts, per
    policy step. (From `v_latest_rewards`: `v_rollouts` would also total every rollout's
    LLM calls, which the live runs page would pay for at each refresh.)"""
    rewards = view_table("v_latest_rewards")
    query = (
        select(
            rewards.c.run,
            rewards.c.policy_step,
            func.avg(rewards.c.reward).label("mean"),
            func.count().label("n"),
        )
        .select_from(
            rewards.join(
                t.runs, and_(t.runs.c.run == rewards.c.run, t.runs.c.scorer == rewards.c.scorer)
            )
        )
        .where(rewards.c.role == "policy")
        .group_by(rewards.c.run, rewards.c.policy_step)
        .order_by(rewards.c.run, rewards.c.policy_step)
    )
    found: dict[str, list[Row]] = defaultdict(list)
    async with store.database.read() as c:
        for row in await c.execute(query):
            found[row.run].append({"step": row.policy_step, "mean": float(row.mean), "n": row.n})
    for points in found.values():  # the databases sort NULL steps apart
        points.sort(key=lambda point: _step_key(point["step"]))
    return found


async def run_names(store: Store) -> list[str]:
    """The runs' names, in the order they started."""
    async with store.database.read() as c:
        return list(
            (await c.execute(select(t.runs.c.run).order_by(t.runs.c.started_at, t.runs.c.run)))
            .scalars()
            .all()
        )


async def run_row(store: Store, run: str) -> Row:
    """The run's `v_runs` row, with `stale` for a running run whose trainer is gone."""
    runs = view_table("v_runs")
    async with store.database.read() as c:
        found = (await c.execute(select(runs).where(runs.c.run == run))).first()
    if found is None:
        raise NotFoundError(f"no run {run!r} in this store")
    row = dict(found._mapping)
    if row["status"] == "running" and await trainers_gone(
        store.database, [(run, f"{row['project']}/{row['model']}", row["trainer"])]
    ):
        row["status"] = "stale"
    return row


async def scorers(store: Store, run: str) -> list[str]:
    """The scorers that scored the run's rollouts, its own scorer first."""
    rewards, runs = view_table("v_latest_rewards"), view_table("v_runs")
    async with store.database.read() as c:
        own = (await c.execute(select(runs.c.scorer).where(runs.c.run == run))).scalar()
        names = (
            (await c.execute(select(rewards.c.scorer).where(rewards.c.run == run).distinct()))
            .scalars()
            .all()
        )
    return sorted(set(names), key=lambda name: (name != own, name))


def _spread(values: list[float]) -> Row:
    mean = statistics.fmean(values)
    return {
        "n": len(values),
        "mean": mean,
        "std": statistics.pstdev(values, mean) if len(values) > 1 else 0.0,
        "min": min(values),
        "max": max(values),
    }


async def reward_curve(store: Store, run: str) -> dict[str, list[Row]]:
    """Per scorer: per policy step, the count, mean, population std, min and max of the
    latest rewards of the run's policy rollouts."""
    rewards = view_table("v_latest_rewards")
    query = (
        select(rewards.c.scorer, rewards.c.policy_step, rewards.c.reward)
        .where(rewards.c.run == run, rewards.c.role == "policy")
        .order_by(rewards.c.scorer, rewards.c.policy_step)
    )
    values: dict[str, dict[int | None, list[float]]] = defaultdict(lambda: defaultdict(list))
    async with store.database.read() as c:
        for row in await c.execute(query):
            values[row.scorer][row.policy_step].append(float(row.reward))
    order = await scorers(store, run)
    return {
        scorer: [
            {"step": step, **_spread(found)}
            for step, found in sorted(values[scorer].items(), key=lambda item: _step_key(item[0]))
        ]
        for scorer in order
        if scorer in values
    }


def _step_key(step: int | None) -> int:
    return -1 if step is None else step


async def train_steps(store: Store, run: str) -> list[Row]:
    """The run's train steps (`v_train_steps`), every model, in the order they started."""
    steps = view_table("v_train_steps")
    async with store.database.read() as c:
        return _rows(await c.execute(select(steps).where(steps.c.run == run).order_by(steps.c.id)))


async def step_metrics(store: Store, run: str) -> list[Row]:
    """Per trained model and metric the backend reported: the value at each completed step."""
    metrics = view_table("v_train_step_metrics")
    query = (
        select(metrics.c.model, metrics.c.metric, metrics.c.step, metrics.c.value)
        .where(metrics.c.run == run, metrics.c.status == "completed")
        .order_by(metrics.c.model, metrics.c.metric, metrics.c.step)
    )
    series: dict[tuple[str, str], list[Row]] = defaultdict(list)
    async with store.database.read() as c:
        for row in await c.execute(query):
            if row.value is not None and math.isfinite(row.value):
                series[(row.model, row.metric)].append({"step": row.step, "value": row.value})
    return [
        {"model": model, "metric": metric, "points": points}
        for (model, metric), points in sorted(
            series.items(), key=lambda item: _metric_order(item[0])
        )
    ]


def _metric_order(key: tuple[str, str]) -> tuple[str, int, str]:
    model, metric = key
    preferred = PREFERRED_METRICS.index(metric) if metric in PREFERRED_METRICS else 99
    return (model, preferred, metric)


async def usage_per_step(store: Store, run: str) -> list[Row]:
    """Per policy step: the LLM calls of the run's policy rollouts, their tokens and latency,
    and how long the rollouts took."""
    calls, rollouts = view_table("v_llm_calls"), view_table("v_rollouts")
    call_query = (
        select(
            calls.c.policy_step,
            func.count().label("calls"),
            func.sum(calls.c.prompt_tokens).label("prompt_tokens"),
            func.sum(calls.c.completion_tokens).label("completion_tokens"),
            func.avg(calls.c.latency_s).label("mean_latency_s"),
            func.max(calls.c.latency_s).label("max_latency_s"),
        )
        .where(calls.c.run == run, calls.c.role == "policy")
        .group_by(calls.c.policy_step)
    )
    rollout_query = (
        select(
            rollouts.c.policy_step,
            func.count().label("rollouts"),
            func.avg(rollouts.c.duration_s).label("mean_duration_s"),
        )
        .where(rollouts.c.run == run, rollouts.c.role == "policy")
        .group_by(rollouts.c.policy_step)
    )
    by_step: dict[int | None, Row] = defaultdict(dict)
    async with store.database.read() as c:
        for row in await c.execute(call_query):
            by_step[row.policy_step].update(_numbers(row._mapping))
        for row in await c.execute(rollout_query):
            by_step[row.policy_step].update(_numbers(row._mapping))
    return [
        {
            "step": step,
            "rollouts": found.get("rollouts", 0),
            "calls": found.get("calls", 0),
            "prompt_tokens": found.get("prompt_tokens") or 0,
            "completion_tokens": found.get("completion_tokens") or 0,
            "mean_latency_s": found.get("mean_latency_s"),
            "max_latency_s": found.get("max_latency_s"),
            "mean_duration_s": found.get("mean_duration_s"),
        }
        for step, found in sorted(by_step.items(), key=lambda item: _step_key(item[0]))
    ]


def _numbers(mapping: Any) -> Row:
    """PostgreSQL's sums and averages come as Decimal: plain ints and floats for JSON."""
    return {key: plain(value) for key, value in mapping.items() if key != "policy_step"}


async def groups(store: Store, run: str) -> list[Row]:
    """The run's sealed groups, one row each, with every scorer's statistics side by side."""
    view = view_table("v_groups")
    async with store.database.read() as c:
        found = _rows(
            await c.execute(
                select(view)
                .where(view.c.run == run)
                .order_by(view.c.batch, view.c.scenario_index, view.c.position, view.c.scorer)
            )
        )
    merged: dict[str, Row] = {}
    for row in found:
        group = merged.setdefault(
            row["group_id"],
            {
                key: row[key]
                for key in (
                    "group_id",
                    "epoch",
                    "batch",
                    "scenario_index",
                    "size",
                    "num_validation",
                    "num_failed",
                    "consumed_by",
                    "consumed_at_step",
                    "num_consumptions",
                    "sealed_at",
                )
            }
            | {"scorers": {}},
        )
        if row["scorer"] is not None:
            group["scorers"][row["scorer"]] = {
                key: row[key] for key in ("reward_mean", "reward_std", "reward_min", "reward_max")
            }
    return list(merged.values())


async def failures(store: Store, run: str) -> list[Row]:
    """Failed rollouts, failed train steps, and the run's own error, oldest first."""
    rollouts, steps, runs = (
        view_table("v_rollouts"),
        view_table("v_train_steps"),
        view_table("v_runs"),
    )
    rows: list[Row] = []
    async with store.database.read() as c:
        for row in await c.execute(
            select(rollouts)
            .where(rollouts.c.run == run, rollouts.c.status == "failed")
            .order_by(rollouts.c.started_at, rollouts.c.rollout_id)
        ):
            rows.append(
                {
                    "kind": "rollout",
                    "rollout_id": row.rollout_id,
                    "group_id": row.group_id,
                    "step": row.policy_step,
                    "error_type": row.error_type,
                    "error_message": row.error_message,
                    "at": row.finished_at or row.started_at,
                }
            )
        for row in await c.execute(
            select(steps).where(steps.c.run == run, steps.c.status == "failed").order_by(steps.c.id)
        ):
            rows.append(
                {
                    "kind": "train step",
                    "model": row.model,
                    "step": row.step_before,
                    "error_type": row.error_type,
                    "error_message": row.error_message,
                    "at": row.finished_at,
                }
            )
        found = (
            await c.execute(
                select(runs.c.status, runs.c.error, runs.c.finished_at).where(runs.c.run == run)
            )
        ).first()
    if found is not None and found.status == "failed":
        rows.append(
            {
                "kind": "run",
                "error_type": None,
                "error_message": found.error,
                "at": found.finished_at,
            }
        )
    return rows


async def consumption(store: Store, run: str) -> list[Row]:
    """Per model trained on the run's groups: groups consumed, steps, last step, scorers."""
    steps = view_table("v_train_steps")
    per_model: dict[str, Row] = {}
    async with store.database.read() as c:
        for row in await c.execute(select(steps).where(steps.c.run == run).order_by(steps.c.id)):
            model = per_model.setdefault(
                row.model,
                {
                    "model": row.model,
                    "groups_consumed": 0,
                    "steps_completed": 0,
                    "steps_failed": 0,
                    "last_step": None,
                    "scorers": [],
                },
            )
            if row.status == "completed":
                model["groups_consumed"] += row.num_groups
                model["steps_completed"] += 1
                model["last_step"] = max(row.step, model["last_step"] or 0)
                if row.scorer not in model["scorers"]:
                    model["scorers"].append(row.scorer)
            elif row.status == "failed":
                model["steps_failed"] += 1
    return sorted(per_model.values(), key=lambda row: row["model"])


async def scorer_pairs(store: Store, run: str, x: str, y: str) -> list[Row]:
    """Each rollout of the run that both scorers scored: its two latest rewards."""
    rewards = view_table("v_latest_rewards")
    a, b = rewards.alias("a"), rewards.alias("b")
    query = (
        select(
            a.c.rollout_id,
            a.c.group_id,
            a.c.policy_step,
            a.c.role,
            a.c.reward.label("x"),
            b.c.reward.label("y"),
        )
        .select_from(a.join(b, and_(b.c.rollout_id == a.c.rollout_id, b.c.scorer == y)))
        .where(a.c.run == run, a.c.scorer == x)
        .order_by(a.c.policy_step, a.c.group_id, a.c.rollout_id)
    )
    async with store.database.read() as c:
        return _rows(await c.execute(query))


def correlation(pairs: list[Row]) -> float | None:
    """Pearson's correlation of the pairs' x and y (None when either has no spread)."""
    if len(pairs) < 2:
        return None
    xs, ys = [p["x"] for p in pairs], [p["y"] for p in pairs]
    try:
        return statistics.correlation(xs, ys)
    except statistics.StatisticsError:
        return None
