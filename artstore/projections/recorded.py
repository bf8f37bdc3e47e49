"""Trajectories a loop built itself: projected from their `trajectory.recorded` event.

`artstore.record_group`, the recording backend (`artstore.recording_backend`) and the
durable rollouts store an `art.Trajectory` the way `artstore import` stores one: each
history item (a message dict, or an openai `Choice` dumped to JSON) a content-addressed
blob, plus the trajectory's metrics, metadata and logs, its exchanges (ART >= 0.5.20) and
its start time. The blobs keep key order, so the trajectory comes back equal to the one
recorded, `Choice` objects and their logprobs included.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import TYPE_CHECKING, Any

from artstore.art_api import trajectory_class, trajectory_exchanges_class
from artstore.art_versions import has_exchanges, history_class
from artstore.events import TrajectoryRecorded
from artstore.projections.imported import history_items

if TYPE_CHECKING:
    import art


def recorded_blob_hashes(events: Iterable[TrajectoryRecorded]) -> set[str]:
    """Every blob a recorded trajectory refers to."""
    found: set[str] = set()
    for event in events:
        found.add(event.details)
        if event.exchanges:
            found.add(event.exchanges)
        for history in event.histories:
            found.update(history.items)
            if history.tools:
                found.add(history.tools)
    return found


def recorded_trajectory(
    event: TrajectoryRecorded,
    bodies: dict[str, Any],
    *,
    reward: float | None = None,
    reward_metrics: dict[str, Any] | None = None,
) -> art.Trajectory:
    """The `art.Trajectory` as recorded; `reward` (a scorer's) replaces the recorded one.

    A scorer's metrics for the rollout (RULER's scores, win rates) are merged over the
    trajectory's own metrics, as for every projected trajectory.
    """
    history = history_class()
    details = bodies[event.details]
    (main, tools), *additional = history_items(event, bodies) or [([], None)]  # type: ignore[arg-type]
    fields: dict[str, Any] = {
        "messages_and_choices": main,
        "tools": tools,
        "additional_histories": [
            history(messages_and_choices=items, tools=history_tools)
            for items, history_tools in additional
        ],
        "reward": event.reward if reward is None else reward,
        "metrics": {**details["metrics"], **(reward_metrics or {})},
        "metadata": details["metadata"],
        "logs": details["logs"],
        "initial_policy_version": event.initial_policy_version,
        "final_policy_version": event.final_policy_version,
    }
    if event.exchanges and has_exchanges():
        fields = {
            **{k: v for k, v in fields.items() if k not in ("messages_and_choices", "tools")},
            "additional_histories": [],
            "exchanges": trajectory_exchanges_class().model_validate(bodies[event.exchanges]),
        }
    if event.start_time is not None:
        fields["start_time"] = datetime.fromisoformat(event.start_time)
    return trajectory_class()(**fields)
