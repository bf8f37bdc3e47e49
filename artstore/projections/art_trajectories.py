"""`art.Trajectory` objects rebuilt from a store's events, whichever way they were recorded.

A rollout's trajectory comes from one of three places: the `trajectory.recorded` event of
a loop that built its trajectory itself (`recorded.py`), the `trajectory.imported` event
of `artstore import` (`imported.py`), or the rollout's `llm.call` events
(`trajectories.py`). `read_trajectories` reads what all of them need in a few queries and
hands each rollout to its builder.
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, Any

from sqlalchemy import select

from artstore.collector import collector_paused
from artstore.errors import NotFoundError
from artstore.projections.imported import blob_hashes, imported_trajectory, load_bodies
from artstore.projections.recorded import recorded_blob_hashes, recorded_trajectory
from artstore.projections.trajectories import StoredCalls, build_trajectory
from artstore.schema import tables as t

if TYPE_CHECKING:
    import art

    from artstore.eventstore.store import EventStore


async def read_trajectories(
    events: EventStore, rollout_ids: list[str], scorer: str | None
) -> dict[str, art.Trajectory]:
    """The trajectory of each rollout (ids checked by the caller), with the latest reward
    of `scorer` (any scorer when None); NotFoundError for a rollout the store lacks."""
    ids = list(dict.fromkeys(rollout_ids))
    streams = await events.read_streams(f"rollout-{rollout_id}" for rollout_id in ids)
    # Imported rollouts (`artstore import`) hold their histories in `trajectory.imported`,
    # trajectories a loop built itself in `trajectory.recorded`.
    stored: dict[str, dict[str, Any]] = {"trajectory.imported": {}, "trajectory.recorded": {}}
    for stream in streams.values():
        for e in stream:
            if e.type in stored:
                stored[e.type][e.stream_id.removeprefix("rollout-")] = e.decode()
    imported, recorded = stored["trajectory.imported"], stored["trajectory.recorded"]
    hashes = blob_hashes(imported.values()) | recorded_blob_hashes(recorded.values())
    async with events.database.read() as connection:
        calls = await connection.run_sync(StoredCalls.load, ids)  # parsed one rollout at a time
        rewards = await latest_rewards(connection, ids, scorer)
        bodies = await connection.run_sync(load_bodies, hashes)
    result = {}
    # Hundreds of thousands of acyclic objects (a Choice per output, a model per
    # token): built with the collector paused (artstore.collector says why).
    with collector_paused():
        for rollout_id in ids:
            recorded_stream = streams[f"rollout-{rollout_id}"]
            if not recorded_stream:
                raise NotFoundError(f"no rollout {rollout_id!r} in this store")
            if rollout_id in recorded:
                # Without a scorer's reward: the reward the trajectory was recorded with
                # (a scorer was named: 0.0, as for any rollout it has not scored).
                found = rewards.get(rollout_id)
                result[rollout_id] = recorded_trajectory(
                    recorded[rollout_id],
                    bodies,
                    reward=found[0] if found else (None if scorer is None else 0.0),
                    reward_metrics=found[1] if found else None,
                )
                continue
            started = recorded_stream[0].decode()
            finished = next(
                (e.decode() for e in recorded_stream if e.type == "rollout.finished"), None
            )
            reward, reward_metrics = rewards.get(rollout_id, (0.0, {}))
            build = (
                partial(imported_trajectory, imported[rollout_id], bodies)
                if rollout_id in imported
                else partial(build_trajectory, calls.rollout(rollout_id))
            )
            result[rollout_id] = build(
                reward=reward,
                metrics={**(getattr(finished, "metrics", None) or {}), **reward_metrics},
                metadata=getattr(finished, "metadata", None) or {},
                logs=getattr(finished, "logs", None) or [],
                policy_step=getattr(started, "policy_step", None),
            )
    return result


async def latest_rewards(
    connection: Any, rollout_ids: list[str], scorer: str | None
) -> dict[str, tuple[float, dict[str, Any]]]:
    """The latest (reward, metrics) of each rollout by `scorer` (any scorer when None)."""
    found: dict[str, tuple[float, dict[str, Any]]] = {}
    for start in range(0, len(rollout_ids), 500):
        query = (
            select(t.rewards.c.rollout_id, t.rewards.c.reward, t.rewards.c.metrics)
            .where(t.rewards.c.rollout_id.in_(rollout_ids[start : start + 500]))
            .order_by(t.rewards.c.position)
        )
        if scorer is not None:
            query = query.where(t.rewards.c.scorer == scorer)
        for row in await connection.execute(query):  # later rows replace earlier ones
            found[row.rollout_id] = (row.reward, dict(row.metrics or {}))
    return found
