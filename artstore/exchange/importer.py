"""Writing an import: a plan of groups and rollouts becomes events, one group at a time.

Readers (`parquet.read_parquet`, `jsonl.read_jsonl`) turn a file into an `ImportPlan` and
build every event of it before anything is written, so a file that does not validate
imports nothing. `write_plan` then:

1. refuses a run of the same name that was recorded here rather than imported;
2. checks every stream it would write: a stream that already holds this import's first
   event is skipped (imported before), one that holds anything else is a conflict, and a
   conflict anywhere imports nothing (ImportConflictError);
3. appends `run.imported`, then the groups: each group's rollout streams and group stream
   are queued together (`append_together_nowait`: never split between two transactions),
   and groups are queued a window of about `WINDOW_EVENTS` events at a time, which the
   store's group commit writes in one transaction or a few. One transaction per group
   cost a projection pass and a commit per group: a 10,000-rollout run imported with
   1,250 transactions instead of a dozen.

Every event id is derived from the import (uuid5 of its stream and index), and so is every
rollout and group id of a parquet import: importing the same file again writes nothing, and
an import stopped halfway (a crash, a lost connection) is completed by running it again.
"""

from __future__ import annotations

import asyncio
import hashlib
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import ValidationError
from sqlalchemy import select

from artstore.collector import collector_paused
from artstore.errors import ArtstoreError, EventError, ExchangeFormatError, ImportConflictError
from artstore.events import (
    Event,
    GroupSealed,
    ImportedHistory,
    RewardsRecorded,
    RolloutFailed,
    RolloutFinished,
    RolloutStarted,
    RunImported,
    TrajectoryImported,
    encode_event,
)
from artstore.eventstore.blobs import encode_blob, payload_json
from artstore.eventstore.records import NO_STREAM, PendingAppend
from artstore.eventstore.store import MAX_EVENTS_PER_TRANSACTION
from artstore.names import unstorable_character
from artstore.schema import tables as t

if TYPE_CHECKING:
    from artstore.store import Store

# Groups are queued until this many events wait, then written before the next are queued.
WINDOW_EVENTS = MAX_EVENTS_PER_TRANSACTION

_NAMESPACE = uuid.UUID("6d1f7f52-3b0e-4c51-8f57-1c9e3f0a2b64")


def derived_id(*parts: Any) -> str:
    """A stable id for what an import writes, from what identifies it in the source."""
    return str(uuid.uuid5(_NAMESPACE, "\x00".join(str(part) for part in parts)))


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


@dataclass
class History:
    """One history of a trajectory as imported: its items (JSON) and which are Choices."""

    items: list[Any]  # message dicts, and Choice objects as their JSON dump
    choices: list[int] = field(default_factory=list)
    trainable: list[int] = field(default_factory=list)
    tools: list[Any] | None = None

    @property
    def num_logprobs(self) -> int:
        return sum(
            len((self.items[i].get("logprobs") or {}).get("content") or []) for i in self.choices
        )


@dataclass
class ImportedRollout:
    rollout_id: str
    role: Literal["policy", "validation"]
    model: str
    histories: list[History]
    started_at: datetime
    status: Literal["finished", "failed"] = "finished"
    scenario: Any = None
    scenario_index: int | None = None
    policy_step: int | None = None
    initial_policy_version: int | None = None
    final_policy_version: int | None = None
    result: Any = None
    duration_s: float = 0.0
    metrics: dict[str, Any] = field(default_factory=dict)
    metadata: dict[str, Any] = field(default_factory=dict)
    logs: list[str] = field(default_factory=list)
    error: dict[str, str] | None = None  # {"type", "message", "traceback"} of a failed one
    exchanges: dict[str, Any] | None = None  # ART's `Trajectory.exchanges` as JSON
    split: str | None = None
    step: int | None = None
    group_index: int | None = None

    @property
    def trainable(self) -> bool:
        """Has a Choice with logprobs: ART can train on it."""
        return any(h.num_logprobs for h in self.histories)


@dataclass
class ImportedGroup:
    group_id: str
    rollouts: list[ImportedRollout]
    rewards: list[RewardsRecorded] = field(default_factory=list)  # in the order recorded
    sealed: GroupSealed | None = None  # None: grouped and rewarded, but never to be trained


@dataclass
class ImportPlan:
    run: RunImported
    groups: list[ImportedGroup]
    key: str  # identifies the source's content (sha256): its run.imported event's id
    files: int = 1
    formats: list[int] = field(default_factory=list)  # parquet: the format versions read
    # Every event of the plan, per group, once `check_plan` built and checked them.
    streams: list[list[_Stream]] | None = None

    @property
    def source(self) -> str:
        return self.run.source


@dataclass
class ImportSummary:
    run: str
    source: str
    path: str
    files: int
    groups: int
    rollouts: int
    written_rollouts: int  # the others were imported before
    sealed_groups: int
    trainable_rollouts: int  # hold a Choice with logprobs
    untrainable_rollouts: int = 0  # finished, with neither a Choice with logprobs nor exchanges
    exchange_rollouts: int = 0  # hold ART's captured exchanges (ART >= 0.5.20 reads them)
    formats: list[int] = field(default_factory=list)  # parquet: the format versions read


@dataclass
class _Stream:
    stream_id: str
    events: list[Event]
    blobs: dict[str, str]


def _with_ids(stream_id: str, events: list[Event]) -> list[Event]:
    return [
        event.model_copy(update={"event_id": derived_id("import", stream_id, index)})
        for index, event in enumerate(events)
    ]


def rollout_stream(plan: ImportPlan, group: ImportedGroup, rollout: ImportedRollout) -> _Stream:
    """The events of one imported rollout: started, finished or failed, trajectory.imported."""
    blobs: dict[str, str] = {}

    def blob(value: Any) -> str:
        digest, body = encode_blob(value)
        blobs[digest] = body
        return digest

    run = plan.run
    started = RolloutStarted(
        rollout_id=rollout.rollout_id,
        run=run.run,
        group_id=group.group_id,
        scenario=rollout.scenario,
        scenario_index=rollout.scenario_index,
        model=rollout.model,
        role=rollout.role,
        policy_step=rollout.policy_step,
        started_at=rollout.started_at,
    )
    ended: Event
    if rollout.status == "failed":
        error = rollout.error or {}
        ended = RolloutFailed(
            rollout_id=rollout.rollout_id,
            error_type=error.get("type") or "Error",
            error_message=error.get("message") or "",
            traceback=error.get("traceback") or "",
            duration_s=rollout.duration_s,
        )
    else:
        ended = RolloutFinished(
            rollout_id=rollout.rollout_id,
            result=rollout.result,
            duration_s=rollout.duration_s,
            metrics=rollout.metrics,
            metadata=rollout.metadata,
            logs=rollout.logs,
        )
    trajectory = TrajectoryImported(
        rollout_id=rollout.rollout_id,
        source=run.source,
        path=run.path,
        histories=[
            ImportedHistory(
                items=[blob(item) for item in history.items],
                choices=history.choices,
                trainable=history.trainable,
                tools=None if history.tools is None else blob(history.tools),
            )
            for history in rollout.histories
        ],
        exchanges=blob(rollout.exchanges) if rollout.exchanges else None,
        initial_policy_version=rollout.initial_policy_version,
        final_policy_version=rollout.final_policy_version,
        split=rollout.split,
        step=rollout.step,
        group_index=rollout.group_index,
    )
    # After the end: its messages are projected for a finished rollout, as recorded ones are.
    events = [started, ended, trajectory]
    stream_id = f"rollout-{rollout.rollout_id}"
    return _Stream(stream_id, _with_ids(stream_id, events), blobs)


def group_streams(plan: ImportPlan, group: ImportedGroup) -> list[_Stream]:
    """The streams of one group: each rollout's, then the group's (rewards, sealed)."""
    streams = [rollout_stream(plan, group, rollout) for rollout in group.rollouts]
    group_events: list[Event] = [*group.rewards, *([group.sealed] if group.sealed else [])]
    if group_events:
        stream_id = f"group-{group.group_id}"
        streams.append(_Stream(stream_id, _with_ids(stream_id, group_events), {}))
    return streams


def check_plan(plan: ImportPlan) -> ImportPlan:
    """Build and check every event of `plan` (nothing is written): a plan that passes is
    refused by the store only for what the store holds (a clash) or the database itself."""
    if plan.streams is None:
        plan.streams = build_streams(plan, plan.run.path)
    return plan


def build_streams(plan: ImportPlan, where: str) -> list[list[_Stream]]:
    """Every event of the plan, per group, validated before anything is written."""
    try:
        # Tens of thousands of events and blobs that live until they are written: the
        # cyclic collector traversed them again and again (artstore.collector).
        with collector_paused():
            per_group = [group_streams(plan, group) for group in plan.groups]
        for stream in (s for group in per_group for s in group):
            problem = unstorable_character(stream.stream_id)  # an id of the file: refused now
            if problem is not None:
                raise ValueError(f"{stream.stream_id!r}: an id cannot hold {problem}")
            for event in stream.events:
                payload_json(encode_event(event)[1])  # what the store will refuse, now
        return per_group
    except (ValidationError, ValueError, TypeError, EventError) as exc:
        raise ExchangeFormatError(f"{where}: cannot be imported: {_short(exc)}") from None


def _short(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return " ".join(text[:3])


async def _first_event_ids(store: Store, stream_ids: list[str]) -> dict[str, str]:
    found: dict[str, str] = {}
    async with store.database.read() as connection:
        for start in range(0, len(stream_ids), 500):
            query = select(t.events.c.stream_id, t.events.c.event_id).where(
                t.events.c.stream_id.in_(stream_ids[start : start + 500]),
                t.events.c.version == 1,
            )
            found.update({row.stream_id: row.event_id for row in await connection.execute(query)})
    return found


async def _check_run(store: Store, run: str) -> None:
    async with store.database.read() as connection:
        row = (await connection.execute(select(t.runs.c.status).where(t.runs.c.run == run))).first()
    if row is not None and row.status != "imported":
        raise ImportConflictError(
            f"run {run!r} was recorded in this store, not imported; nothing was imported "
            "(import under another name with --run NAME)"
        )


async def write_plan(store: Store, plan: ImportPlan) -> ImportSummary:
    """Write `plan` into `store` (see the module's docstring); returns what it did."""
    run = plan.run.run
    per_group = check_plan(plan).streams
    assert per_group is not None
    await _check_run(store, run)
    streams = [stream for group in per_group for stream in group]
    stored = await _first_event_ids(store, [s.stream_id for s in streams])
    conflicts = [
        s.stream_id
        for s in streams
        if s.stream_id in stored and stored[s.stream_id] != s.events[0].event_id
    ]
    if conflicts:
        kind, _, name = conflicts[0].partition("-")
        raise ImportConflictError(
            f"{len(conflicts)} of the rollouts and groups to import are already in this store, "
            f"not from this import (first: {kind} {name}); nothing was imported (import a copy "
            "under another name with --run NAME)"
        )
    run_stream = f"run-{run}"
    await store.append(run_stream, _with_ids(f"{run_stream}\x00{plan.key}", [plan.run]))
    written = imported_groups = 0
    window: list[tuple[int, list[_Stream], list[asyncio.Future[Any]]]] = []
    waiting = 0  # events queued in the window
    for index, streams_of_group in enumerate(per_group):
        todo = [s for s in streams_of_group if s.stream_id not in stored]
        appends = [PendingAppend(s.stream_id, s.events, NO_STREAM, s.blobs) for s in todo]
        window.append((index, todo, store.append_together_nowait(appends) if todo else []))
        waiting += sum(len(s.events) for s in todo)
        if waiting < WINDOW_EVENTS and index < len(per_group) - 1:
            continue
        failure: tuple[int, BaseException] | None = None
        for group_index, group_todo, futures in window:
            results = await asyncio.gather(*futures, return_exceptions=True)
            failed = [r for r in results if isinstance(r, BaseException)]
            if failed:
                failure = failure or (group_index, failed[0])
                continue
            imported_groups += 1
            written += sum(1 for s in group_todo if s.stream_id.startswith("rollout-"))
        if failure is not None:
            group_index, error = failure
            if not isinstance(error, ArtstoreError):
                raise error
            raise ImportConflictError(
                f"importing group {plan.groups[group_index].group_id} failed: {error} "
                f"({imported_groups} of {len(per_group)} groups were imported; run the same "
                "import again to complete it)"
            ) from error
        window, waiting = [], 0
    rollouts = [r for g in plan.groups for r in g.rollouts]
    return ImportSummary(
        run=run,
        source=plan.source,
        path=plan.run.path,
        files=plan.files,
        groups=len(plan.groups),
        rollouts=len(rollouts),
        written_rollouts=written,
        sealed_groups=sum(1 for g in plan.groups if g.sealed),
        trainable_rollouts=sum(1 for r in rollouts if r.trainable),
        untrainable_rollouts=sum(
            1 for r in rollouts if r.status == "finished" and not r.trainable and not r.exchanges
        ),
        exchange_rollouts=sum(1 for r in rollouts if r.exchanges),
        formats=plan.formats,
    )
