"""Datasets: a selection of rollouts frozen as an event, in versions.

A dataset `NAME` is the stream `dataset-NAME`; its version N is the stream's event N (a
`dataset.created`, appended with the expected version, so two creators never both get
version N). The event holds the exact rollout ids, the reward by the scorer that chose
each one, the selection as given and a digest of what the rollouts held (their events
and their rewards): nothing is ever changed, a new selection is a new version.

The selection reads the projection tables: the finished policy rollouts of a run, with
their latest reward by the scorer (the run's by default), optionally only those at or
above `min_reward`, the `top_k` best of each group, the policy steps `A:B` (both
included), and the rollouts a read-only `artstore sql` query returns (its `rollout_id`
column, through the same confined reader).
"""

from __future__ import annotations

import asyncio
import hashlib
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from sqlalchemy import func, select

from artstore.analysis.sql import stream_query
from artstore.arguments import check_name, check_whole_number
from artstore.errors import InvalidArgumentError, NotFoundError, WrongExpectedVersionError
from artstore.events import DatasetCreated, DatasetNamed
from artstore.eventstore.records import ANY, PendingAppend, recorded_from_row
from artstore.schema import tables as t
from artstore.training.runs import run_info

if TYPE_CHECKING:
    from artstore.store import Store

CHUNK = 500  # ids per IN list
STREAM_PREFIX = "dataset-"
INDEX_STREAM = "datasets"


@dataclass(frozen=True)
class Selection:
    """What chooses a dataset's rollouts (see the module's docstring)."""

    run: str | None = None
    scorer: str | None = None
    min_reward: float | None = None
    top_k: int | None = None
    steps: tuple[int | None, int | None] | None = None
    sql: str | None = None

    def as_json(self) -> dict[str, Any]:
        given = {k: v for k, v in asdict(self).items() if v is not None}
        if self.steps is not None:
            given["steps"] = list(self.steps)
        return given


@dataclass
class Dataset:
    """One version of a dataset, as its `dataset.created` event holds it."""

    name: str
    version: int
    rollout_ids: list[str]
    digest: str
    run: str | None
    scorer: str | None
    rewards: dict[str, float]
    selection: dict[str, Any]
    created_at: str
    position: int = field(repr=False, default=0)

    def summary(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "version": self.version,
            "rollouts": len(self.rollout_ids),
            "run": self.run,
            "scorer": self.scorer,
            "digest": self.digest,
            "created_at": self.created_at,
            "selection": self.selection,
        }


def parse_steps(text: str) -> tuple[int | None, int | None]:
    """`A:B`, `A:` or `:B` (both ends included) as a pair of whole numbers or None."""
    first, colon, last = text.partition(":")
    try:
        bounds = (int(first) if first.strip() else None, int(last) if last.strip() else None)
    except ValueError:
        bounds = None
    if not colon or bounds is None or bounds == (None, None):
        raise InvalidArgumentError("steps", f"must be A:B, A: or :B (whole numbers), not {text!r}")
    return bounds


def parse_reference(text: str) -> tuple[str, int | None]:
    """`NAME` or `NAME@V`."""
    name, at, version = text.rpartition("@")
    if not at:
        return text, None
    if not version.isdigit() or int(version) < 1:
        raise InvalidArgumentError("dataset", f"{text!r}: the version after @ is a number from 1")
    return name, int(version)


# --- choosing -------------------------------------------------------------------------------


async def _candidates(store: Store, selection: Selection, scorer: str | None) -> list[Any]:
    """The finished policy rollouts of the run (every run when none), with their reward."""
    ro, latest = t.rollouts, t.latest_rewards
    joined = ro.outerjoin(
        latest, (latest.c.rollout_id == ro.c.rollout_id) & (latest.c.scorer == scorer)
    )
    query = (
        select(ro.c.rollout_id, ro.c.group_id, ro.c.policy_step, latest.c.reward)
        .select_from(joined)
        .where(ro.c.status == "finished", ro.c.role == "policy")
        .order_by(ro.c.started_at, ro.c.rollout_id)
    )
    if selection.run is not None:
        query = query.where(ro.c.run == selection.run)
    if selection.steps is not None:
        first, last = selection.steps
        if first is not None:
            query = query.where(ro.c.policy_step >= first)
        if last is not None:
            query = query.where(ro.c.policy_step <= last)
    if selection.min_reward is not None:
        query = query.where(latest.c.reward >= selection.min_reward)
    async with store.database.read() as connection:
        return list((await connection.execute(query)).all())


async def _queried_ids(store: Store, sql: str) -> set[str]:
    """The `rollout_id` column of a read-only query, run as `artstore sql` runs it."""
    async with stream_query(store, sql) as rows:
        if "rollout_id" not in rows.columns:
            raise InvalidArgumentError(
                "sql", f"the query returns no rollout_id column (it returns {rows.columns})"
            )
        column = rows.columns.index("rollout_id")
        return {str(row[column]) async for row in rows if row[column] is not None}


def _top_k(rows: list[Any], k: int) -> list[Any]:
    """The `k` best rewarded rollouts of each group (ties: the first recorded)."""
    ranked: dict[Any, list[Any]] = {}
    for row in rows:
        if row.reward is not None:
            ranked.setdefault(row.group_id, []).append(row)
    kept = {
        row.rollout_id
        for members in ranked.values()
        for row in sorted(members, key=lambda r: -r.reward)[:k]
    }
    return [row for row in rows if row.rollout_id in kept]


async def choose(store: Store, selection: Selection) -> tuple[str | None, dict[str, Any]]:
    """The scorer, and the chosen rollouts with their reward by it (None: no reward)."""
    scorer = selection.scorer
    if selection.run is not None:
        info = await run_info(store, selection.run)
        scorer = scorer or info.scorer
    elif selection.sql is None:
        raise InvalidArgumentError("run", "give a run or a query (sql) to choose rollouts from")
    needs_scorer = selection.min_reward is not None or selection.top_k is not None
    if needs_scorer and scorer is None:
        raise InvalidArgumentError(
            "scorer", "min_reward and top_k need a scorer (the run has none)"
        )
    rows = await _candidates(store, selection, scorer)
    if selection.sql is not None:
        wanted = await _queried_ids(store, selection.sql)
        rows = [row for row in rows if row.rollout_id in wanted]
    if selection.top_k is not None:
        rows = _top_k(rows, selection.top_k)
    return scorer, {row.rollout_id: row.reward for row in rows}


# --- the digest -----------------------------------------------------------------------------


async def content_digest(store: Store, rewards: dict[str, float | None], scorer: str | None) -> str:
    """SHA-256 over each rollout's id, its stream's version and event id at its head, and
    its reward: events are immutable, so the same rollouts with the same events and
    rewards give the same digest, and an event or a re-scoring since changes it."""
    ids = sorted(rewards)
    heads: dict[str, tuple[int, str]] = {}
    ev = t.events
    async with store.database.read() as connection:
        for start in range(0, len(ids), CHUNK):
            streams = [f"rollout-{rid}" for rid in ids[start : start + CHUNK]]
            newest = (
                select(ev.c.stream_id, func.max(ev.c.version).label("version"))
                .where(ev.c.stream_id.in_(streams))
                .group_by(ev.c.stream_id)
                .subquery()
            )
            found = await connection.execute(
                select(ev.c.stream_id, ev.c.version, ev.c.event_id).join(
                    newest,
                    (newest.c.stream_id == ev.c.stream_id) & (newest.c.version == ev.c.version),
                )
            )
            for row in found:
                heads[row.stream_id.removeprefix("rollout-")] = (row.version, row.event_id)
    digest = hashlib.sha256(f"artstore-dataset-1\n{scorer}\n".encode())
    for rid in ids:
        version, event_id = heads.get(rid, (0, ""))
        digest.update(f"{rid}\t{version}\t{event_id}\t{rewards[rid]!r}\n".encode())
    return digest.hexdigest()


async def holds_the_same(store: Store, dataset: Dataset) -> bool:
    """Whether the dataset's rollouts hold now what they held when it was made (no event
    appended to them, no reward by its scorer recorded since): its digest, made again."""
    ids, latest = dataset.rollout_ids, t.latest_rewards
    now: dict[str, float | None] = dict.fromkeys(ids)
    if dataset.scorer is not None:
        async with store.database.read() as connection:
            for start in range(0, len(ids), CHUNK):
                rows = await connection.execute(
                    select(latest.c.rollout_id, latest.c.reward).where(
                        latest.c.rollout_id.in_(ids[start : start + CHUNK]),
                        latest.c.scorer == dataset.scorer,
                    )
                )
                now.update({row.rollout_id: row.reward for row in rows})
    return await content_digest(store, now, dataset.scorer) == dataset.digest


# --- creating and reading -----------------------------------------------------------------


async def create_dataset(store: Store, name: str, selection: Selection) -> Dataset:
    """Choose rollouts by `selection` and freeze them as the next version of `name`."""
    check_name("name", name)
    if "@" in name:
        raise InvalidArgumentError("name", f"{name!r}: a dataset's name cannot hold @")
    check_name("run", selection.run, optional=True)
    check_name("scorer", selection.scorer, optional=True)
    if selection.sql is not None and not isinstance(selection.sql, str):
        raise InvalidArgumentError("sql", f"must be a query (a str), not {type(selection.sql)}")
    if selection.top_k is not None:
        check_whole_number("top_k", selection.top_k)
        if selection.top_k < 1:
            raise InvalidArgumentError("top_k", "must be at least 1")
    scorer, chosen = await choose(store, selection)
    if not chosen:
        raise NotFoundError(f"the selection chooses no rollout: dataset {name!r} not created")
    digest = await content_digest(store, chosen, scorer)
    stream = f"{STREAM_PREFIX}{name}"
    while True:
        version = await store.stream_version(stream)
        event = DatasetCreated(
            name=name,
            version=version + 1,
            rollout_ids=list(chosen),
            digest=digest,
            run=selection.run,
            scorer=scorer,
            rewards={rid: reward for rid, reward in chosen.items() if reward is not None},
            selection=selection.as_json(),
        )
        listed = DatasetNamed(name=name, version=version + 1)
        appends = [
            PendingAppend(stream, [event], version),
            PendingAppend(INDEX_STREAM, [listed], ANY),
        ]
        # Together, so that a version is never left out of the index by a crash.
        outcomes = await asyncio.gather(
            *store.append_together_nowait(appends), return_exceptions=True
        )
        if isinstance(outcomes[0], WrongExpectedVersionError):
            continue  # another creator took this version: the next one
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                raise outcome
        return await read_dataset(store, name, version + 1)


def _dataset(row: Any) -> Dataset:
    recorded = recorded_from_row(row)
    e = recorded.decode()
    assert isinstance(e, DatasetCreated)
    return Dataset(
        name=e.name,
        version=e.version,
        rollout_ids=e.rollout_ids,
        digest=e.digest,
        run=e.run,
        scorer=e.scorer,
        rewards=e.rewards,
        selection=e.selection,
        created_at=recorded.recorded_at.isoformat(timespec="seconds"),
        position=recorded.position,
    )


async def read_dataset(store: Store, name: str, version: int | None = None) -> Dataset:
    """Version `version` of the dataset `name` (its newest when None)."""
    check_name("name", name)
    stream = f"{STREAM_PREFIX}{name}"
    ev = t.events
    query = select(ev).where(ev.c.stream_id == stream, ev.c.type == DatasetCreated.type)
    if version is None:
        query = query.order_by(ev.c.version.desc()).limit(1)
    else:
        query = query.where(ev.c.version == version)
    async with store.database.read() as connection:
        row = (await connection.execute(query)).first()
    if row is None:
        which = f"{name}@{version}" if version is not None else name
        raise NotFoundError(f"no dataset {which} in this store (see `artstore dataset list`)")
    return _dataset(row)


async def list_datasets(store: Store) -> list[Dataset]:
    """Every version of every dataset, by name and version."""
    names = sorted({e.data["name"] for e in await store.read_stream(INDEX_STREAM)})
    ev = t.events
    found: list[Dataset] = []
    async with store.database.read() as connection:
        for start in range(0, len(names), CHUNK):
            streams = [f"{STREAM_PREFIX}{name}" for name in names[start : start + CHUNK]]
            rows = await connection.execute(
                select(ev)
                .where(ev.c.stream_id.in_(streams), ev.c.type == DatasetCreated.type)
                .order_by(ev.c.stream_id, ev.c.version)
            )
            found.extend(_dataset(row) for row in rows)
    return sorted(found, key=lambda d: (d.name, d.version))


# --- diff -----------------------------------------------------------------------------------


async def _rewards_at(
    store: Store, rollout_ids: list[str], scorer: str | None, position: int
) -> dict[str, float]:
    """Each rollout's latest reward by `scorer` as of the event at `position`."""
    if scorer is None or not rollout_ids:
        return {}
    r = t.rewards
    found: dict[str, tuple[int, float]] = {}
    async with store.database.read() as connection:
        for start in range(0, len(rollout_ids), CHUNK):
            rows = await connection.execute(
                select(r.c.rollout_id, r.c.position, r.c.reward).where(
                    r.c.rollout_id.in_(rollout_ids[start : start + CHUNK]),
                    r.c.scorer == scorer,
                    r.c.position <= position,
                )
            )
            for row in rows:
                if row.rollout_id not in found or found[row.rollout_id][0] < row.position:
                    found[row.rollout_id] = (row.position, row.reward)
    return {rid: reward for rid, (_, reward) in found.items()}


async def _first_positions(store: Store, rollout_ids: list[str]) -> dict[str, int]:
    ev = t.events
    found: dict[str, int] = {}
    async with store.database.read() as connection:
        for start in range(0, len(rollout_ids), CHUNK):
            streams = [f"rollout-{rid}" for rid in rollout_ids[start : start + CHUNK]]
            rows = await connection.execute(
                select(ev.c.stream_id, ev.c.position).where(
                    ev.c.stream_id.in_(streams), ev.c.version == 1
                )
            )
            found.update({row.stream_id.removeprefix("rollout-"): row.position for row in rows})
    return found


def _why(
    rid: str, before: dict[str, float], after: dict[str, float], born: dict[str, int], old: Dataset
) -> str:
    was, now = before.get(rid), after.get(rid)
    if was != now:
        return (
            f"reward moved from {was} to {now} (scored again)"
            if was is not None
            else (f"rewarded {now} since")
        )
    if born.get(rid, 0) > old.position:
        return "recorded since"
    return "the selection changed"


async def dataset_diff(store: Store, old: Dataset, new: Dataset) -> dict[str, Any]:
    """Which rollouts entered and left from `old` to `new`, each with why."""
    before_ids, after_ids = set(old.rollout_ids), set(new.rollout_ids)
    entered = [rid for rid in new.rollout_ids if rid not in before_ids]
    left = [rid for rid in old.rollout_ids if rid not in after_ids]
    moved = entered + left
    scorer = new.scorer if new.scorer == old.scorer else None
    before = await _rewards_at(store, moved, scorer, old.position)
    after = await _rewards_at(store, moved, scorer, new.position)
    born = await _first_positions(store, entered)
    selection_changed = old.selection != new.selection
    rows = [
        {"change": change, "rollout_id": rid, "why": _why(rid, before, after, born, old)}
        for change, ids in (("entered", entered), ("left", left))
        for rid in ids
    ]
    return {
        "old": f"{old.name}@{old.version}",
        "new": f"{new.name}@{new.version}",
        "entered": len(entered),
        "left": len(left),
        "kept": len(before_ids & after_ids),
        "selection_changed": selection_changed,
        "old_selection": old.selection,
        "new_selection": new.selection,
        "rollouts": rows,
    }
