"""Which appends may be projected side by side with other appends (PostgreSQL).

An appending transaction normally projects its events under the EXCLUSIVE append lock, so
that projections are applied in the order of the events' positions: one transaction at a
time across every process. Most of what rollout workers record needs no such order: a
rollout's own events (`rollout.started`, `llm.call`, `rollout.finished`,
`rollout.failed`) write rows of that rollout only (its row, its calls, its trajectory
messages), and read nothing that another rollout's events write. Projected in any order
across rollouts, they leave the tables as projecting them in position order does; within
a rollout, its stream's versions order them (one transaction after the other).

Such a transaction shares the append lock with other such appends (`insert_events(...,
side_by_side=True)`), and waits for, and is waited for by, every other append (a group's
rewards and seal, a train step, a run's start), which still takes the lock alone: what
those read and write across rollouts sees either all of a side-by-side append or none.

One thing a rollout's start may write outside its own rows: the row of a run nobody
started (`implicit_run`), which two starts of a new run would both insert. A start of a
policy rollout runs side by side only once its run's row exists. A train step that names
the group of a starting rollout is summed again under an advisory lock of its own
(`trained.refresh_trained`), so that two such starts see each other's rows.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.engine import Connection

from artstore.events import LLMCall, RolloutFailed, RolloutFinished, RolloutStarted
from artstore.eventstore.blobs import load_payload
from artstore.schema import tables as t

# Event types whose projection writes only rows of the rollout whose stream holds them.
ROLLOUT_LOCAL_TYPES = frozenset(
    e.type for e in (RolloutStarted, LLMCall, RolloutFinished, RolloutFailed)
)
# Those that name their rollout in the payload (llm.call's is its stream's).
_NAMING_THEIR_ROLLOUT = frozenset(e.type for e in (RolloutStarted, RolloutFinished, RolloutFailed))


class SideBySide:
    """`store.side_by_side(connection, rows)`: whether these event rows (an append's
    batch, before its INSERT) may be projected side by side with other appends.

    Remembers the runs it found: a run's row is never deleted (a rebuild of the
    projections makes it again before anything else may append).
    """

    def __init__(self, projected_types: frozenset[str]) -> None:
        self.projected_types = projected_types
        self.known_runs: set[str] = set()

    def __call__(self, connection: Connection, rows: list[dict[str, Any]]) -> bool:
        runs: set[str] = set()
        for row in rows:
            kind = row["type"]
            if kind not in self.projected_types:
                continue  # nothing projected: no order needed
            if kind not in ROLLOUT_LOCAL_TYPES:
                return False
            if not row["stream_id"].startswith("rollout-"):
                return False  # its rollout is named by its stream (llm.call)
            if kind not in _NAMING_THEIR_ROLLOUT:
                continue  # an llm.call, the largest payload: nothing in it to look at
            data = load_payload(row["data"])
            own_stream = f"rollout-{data.get('rollout_id')}"
            if kind in _NAMING_THEIR_ROLLOUT and row["stream_id"] != own_stream:
                return False  # written outside the rollout's own stream
            policy = data.get("role", "policy") == "policy"
            if kind == RolloutStarted.type and policy and data.get("run") is not None:
                runs.add(data["run"])
        missing = runs - self.known_runs
        if missing:
            found = connection.execute(select(t.runs.c.run).where(t.runs.c.run.in_(missing)))
            self.known_runs.update(found.scalars())
            if missing - self.known_runs:
                return False  # this start makes its run's row: alone, in order
        return True
