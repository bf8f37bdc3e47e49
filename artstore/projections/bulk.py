"""The projection of the events a run records by the thousand, in a few statements per batch.

Most of a run's events are `rollout.started`, `llm.call`, `rollout.finished`,
`rewards.recorded` and `group.sealed`. Projected one statement per event (an INSERT per
call, an UPDATE of its rollout's counters, a query for each rollout's messages), the
round trips, not the data, were where recording spent its time: 90% of a bulk append on
SQLite and nearly all of it on PostgreSQL (tools/bench_queries.py's docstring has the
profile). `BulkProjection` keeps the rows these events make in memory and writes them
with one executemany per table when `flush()` is called: before any other event is
projected (its handler may read what these wrote) and at the end of the transaction.

What ends in the tables is what projecting the events one by one in order wrote:

- a rollout started in the batch is inserted with its calls' counters and totals, its
  end and its group already applied; one started earlier gets them as UPDATEs, one per
  call in position order;
- a call that supersedes another deletes it at once (from the buffer or the table) and
  its rollout's totals are summed again from `llm_calls` after the flush;
- a group that names members started earlier fills their missing group and run at once,
  as `_group_sealed` did;
- trajectory messages of the rollouts that finished are built after the calls are
  written, from the event log as before (which holds the whole batch already);
- an imported trajectory (`artstore import`) marks its rollout imported and, if the
  rollout had finished when the event came, gives its messages, as a handler of its own
  did before, one event at a time (a flush of everything before it, an UPDATE, a blob read
  and an INSERT per rollout).

The tables are the same however the events are cut into batches (live transactions of
any size, pages of a rebuild): a rollout's float total (`llm_latency_s`) is its calls'
latencies added one at a time in position order, each to the total before it, never a
batch's subtotal added to the stored total (floats added in another grouping differ in
their last bits); `rewards` rows are numbered by the projection, not by a sequence, so
that a rebuild gives them the same ids.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import bindparam, delete, func, select, update
from sqlalchemy.engine import Connection

from artstore.events import (
    GroupSealed,
    LLMCall,
    RewardsRecorded,
    RolloutFinished,
    RolloutStarted,
    TrajectoryImported,
    TrajectoryRecorded,
    decode_event,
)
from artstore.eventstore.blobs import load_payload
from artstore.eventstore.database import recorder_of
from artstore.eventstore.recorder import Recorder
from artstore.eventstore.records import (
    RecordedEvent,
    StatementAdds,
    StatementPart,
    StatementRows,
    recorded_from_row,
)
from artstore.eventstore.streams import events_of_streams
from artstore.projections import rollout_rewards, trained
from artstore.projections.imported import blob_hashes, imported_message_rows, load_bodies
from artstore.projections.recorded import recorded_blob_hashes
from artstore.projections.trajectories import StoredCalls, message_rows
from artstore.schema import tables as t

BULK_TYPES = frozenset(
    e.type
    for e in (
        RolloutStarted,
        LLMCall,
        RolloutFinished,
        RewardsRecorded,
        GroupSealed,
        TrajectoryImported,
    )
)

# PostgreSQL's json functions cannot read a text holding NUL (\u0000) or a lone surrogate
# (\udcff): `tool_calls` ->> 'name' would fail for the whole view. The JSON the views take
# apart (tool calls, train metrics) is projected with those as U+FFFD, as text columns are
# (`ProjectedText`); the events keep them, and so do the JSON columns the views only pass
# through.


def storable_json(value: Any) -> Any:
    """`value` (JSON) with NUL and lone surrogates replaced in every string, keys included."""
    if isinstance(value, str):
        return t.storable_text(value)
    if isinstance(value, list):
        return [storable_json(item) for item in value]
    if isinstance(value, dict):
        return {storable_json(key): storable_json(item) for key, item in value.items()}
    return value


def storable_tool_calls(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{**row, "tool_calls": storable_json(row.get("tool_calls"))} for row in rows]


def implicit_run(c: Connection, run: str | None, model: str | None, at: Any) -> None:
    """A run exists as soon as anything is recorded under its name.

    Rollouts, groups and train steps recorded under a run nobody started (a loop of its
    own, `wrap_rollout(..., run=...)`) make a row with what they say: the model
    ("project/name" for a train step, the model's name for a rollout), status `recorded`,
    the default scorer `reward`, and no configuration. `run.started` completes it.
    """
    if run is None or c.execute(select(t.runs.c.run).where(t.runs.c.run == run)).first():
        return
    project, _, name = (model or "").rpartition("/")
    c.execute(
        t.runs.insert().values(
            run=run,
            project=project,
            model=name or run,
            scorer="reward",
            status="recorded",
            config={},
            num_scenarios=0,
            started_at=at,
        )
    )


@dataclass(frozen=True)
class _Compiled:
    """An INSERT compiled once for a dialect and a set of keys: its text, and for each
    positional parameter the key it takes and the column's own bind processor."""

    sql: str
    keys: tuple[str, ...]
    processors: tuple[Any, ...]


_COMPILED: dict[tuple[Any, Any, tuple[str, ...]], _Compiled | None] = {}


def _compiled(statement: Any, dialect: Any, keys: tuple[str, ...]) -> _Compiled | None:
    """`statement` compiled for `dialect` with exactly `keys` as its parameters, or None
    when it needs more (a column default SQLAlchemy would fill in)."""
    cache_key = (statement, dialect, keys)  # the dialect: its JSON serializer
    if cache_key not in _COMPILED:
        compiled = statement.compile(dialect=dialect, column_keys=list(keys))
        # A parameter used twice is sent twice where the driver's placeholders are
        # positional (SQLite's `?`): `order` names each placeholder's key.
        order = tuple(compiled.positiontup or ())
        found: _Compiled | None = None
        if set(order) == set(keys) and len(set(keys)) == len(keys):
            processors = compiled._bind_processors
            found = _Compiled(str(compiled), order, tuple(processors.get(k) for k in order))
        _COMPILED[cache_key] = found
    return _COMPILED[cache_key]


def execute_many(c: Connection, statement: Any, rows: list[dict[str, Any]]) -> None:
    """`c.execute(statement, rows)` as one executemany on the driver.

    SQLAlchemy builds a parameter dictionary per row and runs each value through its
    processors (~35 us a row, most of a bulk projection's own time): here each row
    becomes a tuple, each value through the same bind processor of its column, so that
    what is stored is what SQLAlchemy stores. Rows must all have the first row's keys.
    """
    keys = tuple(rows[0])
    compiled = _compiled(statement, c.dialect, keys)
    if compiled is None or any(len(row) != len(keys) for row in rows):
        c.execute(statement, rows)
        return
    # Column by column, then zipped into rows: one comprehension per column instead of a
    # generator per row (about twice as fast for thousands of rows).
    columns = [
        [row[key] for row in rows] if processor is None else [processor(row[key]) for row in rows]
        for key, processor in zip(compiled.keys, compiled.processors, strict=True)
    ]
    c.exec_driver_sql(compiled.sql, list(zip(*columns, strict=True)))


def _add(total: Any, value: Any) -> Any:
    """SQL's SUM, one value at a time: NULLs are skipped, NULL until a value comes."""
    if value is None:
        return total
    return value if total is None else total + value


@dataclass
class CallTotals:
    """What a rollout's calls add to its row."""

    num_llm_calls: int = 0
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    total_tokens: int | None = None
    num_tool_calls: int = 0
    llm_latency_s: float | None = None

    def add(self, row: dict[str, Any], counted: bool) -> None:
        self.num_llm_calls += counted
        self.prompt_tokens = _add(self.prompt_tokens, row["prompt_tokens"])
        self.completion_tokens = _add(self.completion_tokens, row["completion_tokens"])
        self.total_tokens = _add(self.total_tokens, row["total_tokens"])
        self.num_tool_calls += len(row["tool_calls"] or ())
        self.llm_latency_s = _add(self.llm_latency_s, row["latency_s"])


def call_row(e: LLMCall, rollout_id: str) -> dict[str, Any]:
    """The `llm_calls` row of a call, but its position."""
    prompt, completion = e.prompt_tokens, e.completion_tokens
    return {
        "call_id": e.call_id,
        "rollout_id": rollout_id,
        "call_index": e.index,
        "model": e.model,
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": None if prompt is None or completion is None else prompt + completion,
        "latency_s": e.latency_s,
        "finish_reason": e.finish_reason,
        "num_input_messages": len(e.input),
        "tool_calls": storable_json(
            [{"name": tc["name"], "args": tc.get("args")} for tc in e.tool_calls]
        )
        or None,
        "has_logprobs": e.num_logprobs > 0,
        "error_type": e.error_type,
        "error_message": e.error_message,
        "started_at": e.started_at,
        "source": e.source,
        "endpoint": e.endpoint,
        "streamed": e.stream,
        "art_exchange": e.art_exchange,
    }


def calls_in_statement(rows: list[dict[str, Any]]) -> list[StatementPart] | None:
    """The projection of `llm.call` event rows (before their INSERT) as parts of the
    statement that inserts them (`in_statement`): each call's row, and what it adds to its
    rollout's counters and totals, as `_llm_call` and `flush` write them. None where the
    projector must write them: a call that supersedes another (its rollout's totals are
    summed again), a call outside its rollout's stream, or two calls of one rollout (its
    float total adds them one at a time, in position order).

    A call's projection writes its rollout's rows only (artstore.projections.side_by_side):
    in any order across rollouts, the tables end the same."""
    calls, totals = [], []
    rollouts: set[str] = set()
    for row in rows:
        stream_id = row["stream_id"]
        rollout_id = stream_id.removeprefix("rollout-")
        if row["type"] != LLMCall.type or rollout_id == stream_id or rollout_id in rollouts:
            return None
        rollouts.add(rollout_id)
        e = decode_event(LLMCall.type, load_payload(row["data"]), row["event_id"])
        assert isinstance(e, LLMCall)
        if e.supersedes is not None:
            return None
        call = call_row(e, rollout_id)
        added = CallTotals()
        added.add(call, counted=True)
        calls.append(call | {"event_id": row["event_id"]})
        totals.append({"rollout_id": rollout_id, **vars(added), "event_id": row["event_id"]})
    if not calls:
        return []
    return [
        StatementRows(t.llm_calls, (), False, calls),  # a call id stored refuses it, as before
        StatementAdds(t.rollouts, "rollout_id", _COUNTS, TOTALS, totals),
    ]


_COUNTS = ("num_llm_calls", "num_tool_calls")


def _bound(totals: CallTotals) -> dict[str, Any]:
    """The totals as the parameters of `_ADD_TOTALS`."""
    return {f"b_{name}": value for name, value in vars(totals).items()}


TOTALS = ("prompt_tokens", "completion_tokens", "total_tokens", "llm_latency_s")

# Compiled once per database by `execute_many` (a statement is its cache key).
_INSERT_ROLLOUTS = t.rollouts.insert()
_INSERT_CALLS = t.llm_calls.insert()
_INSERT_GROUPS = t.groups.insert()
_INSERT_REWARDS = t.rewards.insert()
_INSERT_MESSAGES = t.trajectory_messages.insert()


@functools.cache
def _upsert_latest(recorder: Recorder) -> Any:
    """The upsert of `latest_rewards` for this database (one object: it is the cache key
    of its compiled form, `_compiled`)."""
    statement = recorder.insert(t.latest_rewards)
    excluded = statement.excluded
    return statement.on_conflict_do_update(
        index_elements=["rollout_id", "scorer"],
        set_={
            "group_id": excluded.group_id,
            "reward": excluded.reward,
            "position": excluded.position,
        },
    )


ro = t.rollouts
_ADD_TOTALS = (
    update(ro)
    .where(ro.c.rollout_id == bindparam("b_rollout_id"))
    .values(
        num_llm_calls=ro.c.num_llm_calls + bindparam("b_num_llm_calls"),
        num_tool_calls=ro.c.num_tool_calls + bindparam("b_num_tool_calls"),
        **{
            name: func.coalesce(
                ro.c[name] + bindparam(f"b_{name}", type_=ro.c[name].type),
                ro.c[name],
                bindparam(f"b_{name}", type_=ro.c[name].type),
            )
            for name in TOTALS
        },
    )
)
_FINISH = (
    update(ro)
    .where(ro.c.rollout_id == bindparam("b_rollout_id"))
    .values(
        status="finished",
        result=bindparam("b_result", type_=t.Json),
        finished_at=bindparam("b_finished_at", type_=ro.c.finished_at.type),
        duration_s=bindparam("b_duration_s", type_=ro.c.duration_s.type),
    )
)


def _summed_again(connection: Connection, rollout_ids: list[str]) -> None:
    """Totals of these rollouts summed from their rows in `llm_calls` (after a supersede),
    in position order as the calls came (not SQL's sum(), whose order is the plan's)."""
    c = t.llm_calls
    columns = [c.c[name.removeprefix("llm_")] for name in TOTALS]
    for rollout_id in rollout_ids:
        calls = connection.execute(
            select(c.c.tool_calls, *columns)
            .where(c.c.rollout_id == rollout_id)
            .order_by(c.c.position)
        ).mappings()
        totals = CallTotals()
        for call in calls:
            totals.add(call, counted=False)
        summed = {name: getattr(totals, name) for name in TOTALS}
        connection.execute(
            update(ro)
            .where(ro.c.rollout_id == rollout_id)
            .values(**summed, num_tool_calls=totals.num_tool_calls)
        )


def next_id(connection: Connection, table: Any) -> int:
    """The id of the next row of `table` as the projection numbers them: one more than
    the highest (a sequence would go on counting after a rebuild, and skip the numbers of
    transactions that rolled back). The projection runs under the append lock."""
    highest = connection.execute(select(func.max(table.c.id))).scalar()
    return (highest or 0) + 1


@dataclass
class BulkProjection:
    connection: Connection
    # The `llm.call` payloads of the rollouts started in this batch, when the batch is
    # all the event log holds of them (an append's transaction; not a page of a rebuild):
    # their messages are built from these instead of reading the payloads back.
    calls_at_hand: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    # The blob texts the batch's appends carried, by hash (each checked to hash to its
    # key when its append was queued): the messages' blobs are mostly among them.
    blobs_at_hand: Mapping[str, str] = field(default_factory=dict)
    known_runs: set[str] = field(default_factory=set)
    new_rollouts: dict[str, dict[str, Any]] = field(default_factory=dict)
    calls: dict[str, dict[str, Any]] = field(default_factory=dict)  # by call_id
    # What each call adds to its rollout in the table, one entry per call in position
    # order: added one by one, so that a float total is the same in any batching.
    call_totals: list[dict[str, Any]] = field(default_factory=list)
    finishes: list[dict[str, Any]] = field(default_factory=list)  # of rollouts in the table
    finished: list[str] = field(default_factory=list)  # whose messages are projected
    finished_ids: set[str] = field(default_factory=set)  # the same, to look up
    # Imported trajectories whose rollout had finished when they came: their messages.
    imported: list[TrajectoryImported] = field(default_factory=list)
    imported_in_table: list[str] = field(default_factory=list)  # rollouts to mark imported
    summed_again: list[str] = field(default_factory=list)
    groups: list[dict[str, Any]] = field(default_factory=list)
    rewards: list[dict[str, Any]] = field(default_factory=list)
    latest: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    # Rollouts whose latest reward, group, run or row changed: their `reward` is set again
    # and the train steps of their groups sum again what they trained.
    touched: set[str] = field(default_factory=set)

    @classmethod
    def for_batch(
        cls, connection: Connection, batch: list[RecordedEvent], blobs: Mapping[str, str]
    ) -> BulkProjection:
        """For the events of an append's transaction (all the log holds of its rollouts
        started in it) and the blob texts its appends carried."""
        started = {
            f"rollout-{e.data['rollout_id']}": e.data["rollout_id"]
            for e in batch
            if e.type == RolloutStarted.type
        }
        calls: dict[str, list[dict[str, Any]]] = {rollout_id: [] for rollout_id in started.values()}
        for e in batch:
            if e.type == LLMCall.type and e.stream_id in started:
                calls[started[e.stream_id]].append(e.data)
        return cls(connection, calls, blobs)

    def add(self, event: Any, recorded: RecordedEvent) -> None:
        if isinstance(event, RolloutStarted):
            self._rollout_started(event, recorded)
        elif isinstance(event, LLMCall):
            self._llm_call(event, recorded)
        elif isinstance(event, RolloutFinished):
            self._rollout_finished(event, recorded)
        elif isinstance(event, RewardsRecorded):
            self._rewards_recorded(event, recorded)
        elif isinstance(event, GroupSealed):
            self._group_sealed(event, recorded)
        elif isinstance(event, TrajectoryImported):
            self._trajectory_imported(event)
        else:  # pragma: no cover - BULK_TYPES and this dispatch are written together
            raise TypeError(f"not projected in bulk: {event.type}")

    def _ensure_run(self, run: str | None, model: str | None, at: Any) -> None:
        if run is not None and run not in self.known_runs:
            implicit_run(self.connection, run, model, at)
            self.known_runs.add(run)

    def _rollout_started(self, e: RolloutStarted, r: RecordedEvent) -> None:
        if e.role == "policy":
            self._ensure_run(e.run, e.model, r.recorded_at)
        if e.rollout_id in self.new_rollouts:  # the primary key refuses it, as before
            self.flush()
        self.new_rollouts[e.rollout_id] = {
            "rollout_id": e.rollout_id,
            "run": e.run,
            "group_id": e.group_id,
            "scenario_index": e.scenario_index,
            "scenario": e.scenario,
            "model": e.model,
            "role": e.role,
            "policy_step": e.policy_step,
            "status": "running",
            "result": None,
            "error_type": None,
            "error_message": None,
            "started_at": e.started_at,
            "finished_at": None,
            "duration_s": None,
            "imported": False,
            "totals": CallTotals(),
        }
        self.touched.add(e.rollout_id)

    def _llm_call(self, e: LLMCall, r: RecordedEvent) -> None:
        rollout_id = r.stream_id.removeprefix("rollout-")
        if e.call_id in self.calls:  # the primary key refuses it, as before
            self.flush()
        row = call_row(e, rollout_id) | {"position": r.position}
        if e.supersedes is not None:  # the same call, recorded again: one row per real call
            if self.calls.pop(e.supersedes, None) is None:
                self.connection.execute(
                    delete(t.llm_calls).where(t.llm_calls.c.call_id == e.supersedes)
                )
            self.summed_again.append(rollout_id)
        self.calls[e.call_id] = row
        started = self.new_rollouts.get(rollout_id)
        if started is not None:
            started["totals"].add(row, counted=e.supersedes is None)
        else:
            added = CallTotals()
            added.add(row, counted=e.supersedes is None)
            self.call_totals.append({"b_rollout_id": rollout_id} | _bound(added))

    def _rollout_finished(self, e: RolloutFinished, r: RecordedEvent) -> None:
        end = {
            "result": e.result,
            "finished_at": r.recorded_at,
            "duration_s": e.duration_s,
        }
        started = self.new_rollouts.get(e.rollout_id)
        if started is not None:
            started.update(status="finished", **end)
        else:
            self.finishes.append({f"b_{key}": value for key, value in end.items()})
            self.finishes[-1]["b_rollout_id"] = e.rollout_id
        self.finished.append(e.rollout_id)
        self.finished_ids.add(e.rollout_id)

    def _rewards_recorded(self, e: RewardsRecorded, r: RecordedEvent) -> None:
        for rollout_id, reward in e.rewards.items():
            self.rewards.append(
                {
                    "rollout_id": rollout_id,
                    "group_id": e.group_id,
                    "scorer": e.scorer,
                    "reward": reward,
                    "metrics": e.metrics.get(rollout_id),
                    "rescored": e.rescored,
                    "recorded_at": r.recorded_at,
                    "position": r.position,
                }
            )
            self.touched.add(rollout_id)
            self.latest[rollout_id, e.scorer] = {
                "rollout_id": rollout_id,
                "scorer": e.scorer,
                "group_id": e.group_id,
                "reward": reward,
                "position": r.position,
            }

    def _group_sealed(self, e: GroupSealed, r: RecordedEvent) -> None:
        members = [*e.rollout_ids, *e.validation_rollout_ids, *e.failed_rollout_ids]
        if e.run is not None and e.run not in self.known_runs:
            first = self.new_rollouts.get(members[0]) if members else None
            model = (
                first["model"]
                if first is not None
                else self.connection.execute(
                    select(ro.c.model).where(ro.c.rollout_id.in_(members[:1]))
                ).scalar()
            )
            self._ensure_run(e.run, model, r.recorded_at)
        # Rollouts recorded outside any group (`wrap_rollout`) belong to the group that
        # sealed them, and to its run.
        in_table = []
        for rollout_id in members:
            started = self.new_rollouts.get(rollout_id)
            if started is None:
                in_table.append(rollout_id)
                continue
            for column, value in (("group_id", e.group_id), ("run", e.run)):
                if value is not None and started[column] is None:
                    started[column] = value
        self.touched.update(in_table)
        for column, value in (("group_id", e.group_id), ("run", e.run)):
            if value is not None and in_table:
                self.connection.execute(
                    update(ro)
                    .where(ro.c.rollout_id.in_(in_table), ro.c[column].is_(None))
                    .values({column: value})
                )
        self.groups.append(
            {
                "group_id": e.group_id,
                "run": e.run,
                "epoch": e.epoch,
                "batch": e.batch,
                "scenario_index": e.scenario_index,
                "size": len(e.rollout_ids),
                "num_validation": len(e.validation_rollout_ids),
                "num_failed": len(e.failed_rollout_ids),
                "sealed_at": r.recorded_at,
                "position": r.position,
            }
        )

    def _trajectory_imported(self, e: TrajectoryImported) -> None:
        # It follows the rollout's end (the importer writes started, ended, imported):
        # messages come from a rollout that has finished by then, as for a recorded one.
        started = self.new_rollouts.get(e.rollout_id)
        if started is not None:
            started["imported"] = True
            status = started["status"]
        else:  # started before this batch (a rebuild's earlier page), or never
            self.imported_in_table.append(e.rollout_id)
            status = self.connection.execute(
                select(ro.c.status).where(ro.c.rollout_id == e.rollout_id)
            ).scalar()
            if status is not None and e.rollout_id in self.finished_ids:
                status = "finished"  # by a finish earlier in this batch, not written yet
        if status == "finished":
            self.imported.append(e)

    # --- writing ------------------------------------------------------------------------

    def flush(self) -> None:
        """Write what the events added so far made, in the order their handlers wrote it."""
        c = self.connection
        if self.new_rollouts:
            rows = []
            for row in self.new_rollouts.values():
                totals: CallTotals = row["totals"]
                rows.append(
                    {key: value for key, value in row.items() if key != "totals"} | vars(totals)
                )
            execute_many(c, _INSERT_ROLLOUTS, rows)
        if self.calls:
            execute_many(c, _INSERT_CALLS, list(self.calls.values()))
        if self.call_totals:
            execute_many(c, _ADD_TOTALS, self.call_totals)  # in order: one UPDATE after another
        if self.summed_again:
            _summed_again(c, list(dict.fromkeys(self.summed_again)))
        if self.finishes:
            c.execute(_FINISH, self.finishes)
        if self.groups:
            execute_many(c, _INSERT_GROUPS, self.groups)
        if self.rewards:
            first = next_id(c, t.rewards)
            for offset, row in enumerate(self.rewards):
                row["id"] = first + offset
            execute_many(c, _INSERT_REWARDS, self.rewards)
        if self.latest:
            self._upsert_latest(list(self.latest.values()))
        if self.finished:
            self._project_messages(self.finished)
        if self.imported_in_table:
            for start in range(0, len(self.imported_in_table), 500):
                c.execute(
                    update(ro)
                    .where(ro.c.rollout_id.in_(self.imported_in_table[start : start + 500]))
                    .values(imported=True)
                )
        if self.imported:
            self._project_imported(self.imported)
        if self.touched:
            rollout_rewards.refresh_rewards(c, self.touched)
            trained.refresh_for_rollouts(c, self.touched)
        self._clear()

    def _clear(self) -> None:
        self.new_rollouts, self.calls, self.call_totals = {}, {}, []
        self.finishes, self.finished, self.summed_again = [], [], []
        self.finished_ids, self.imported, self.imported_in_table = set(), [], []
        self.groups, self.rewards, self.latest = [], [], {}
        self.touched = set()

    def _upsert_latest(self, rows: list[dict[str, Any]]) -> None:
        c = self.connection
        execute_many(c, _upsert_latest(recorder_of(c)), rows)

    def _project_messages(self, rollout_ids: list[str]) -> None:
        """Rows of `trajectory_messages` for these finished rollouts: the loop's own
        trajectory when it recorded one, else the one rebuilt from the rollout's calls."""
        c = self.connection
        recorded = _recorded_trajectories(c, rollout_ids)
        bodies = (
            load_bodies(c, recorded_blob_hashes(list(recorded.values())), self.blobs_at_hand)
            if recorded
            else {}
        )
        rebuilt = [rollout_id for rollout_id in rollout_ids if rollout_id not in recorded]
        at_hand = {r: self.calls_at_hand[r] for r in rebuilt if r in self.calls_at_hand}
        read = [rollout_id for rollout_id in rebuilt if rollout_id not in at_hand]
        stored = StoredCalls.of_payloads(c, at_hand, self.blobs_at_hand)
        if read:
            from_log = StoredCalls.load(c, dict.fromkeys(read))
            stored.by_rollout |= from_log.by_rollout
            stored.bodies |= from_log.bodies
        rows: list[dict[str, Any]] = []
        for rollout_id in rollout_ids:
            if rollout_id in recorded:
                rows += imported_message_rows(recorded[rollout_id], bodies)
            else:
                conversations = stored.rollout(rollout_id, for_rows=True).conversations()
                rows += message_rows(rollout_id, conversations)
        if rows:
            execute_many(c, _INSERT_MESSAGES, storable_tool_calls(rows))

    def _project_imported(self, events: list[TrajectoryImported]) -> None:
        """Rows of `trajectory_messages` for these imported trajectories, their blobs read
        once for all (mostly from the texts the batch's appends carried)."""
        bodies = load_bodies(self.connection, blob_hashes(events), self.blobs_at_hand)
        rows = [row for event in events for row in imported_message_rows(event, bodies)]
        if rows:
            execute_many(self.connection, _INSERT_MESSAGES, storable_tool_calls(rows))


def _recorded_trajectories(c: Connection, rollout_ids: list[str]) -> dict[str, Any]:
    """The latest `trajectory.recorded` event of each of these rollouts that has one."""
    found: dict[str, Any] = {}
    recorder = recorder_of(c)
    streams = [f"rollout-{rollout_id}" for rollout_id in dict.fromkeys(rollout_ids)]
    for start in range(0, len(streams), 500):
        query = events_of_streams(
            recorder, streams[start : start + 500], list(t.events.c), TrajectoryRecorded.type
        )
        rows = c.execute(query).all()
        for row in rows:
            found[row.stream_id.removeprefix("rollout-")] = recorded_from_row(row).decode()
    return found
