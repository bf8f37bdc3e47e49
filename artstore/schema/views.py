"""The SQL views for analysis, declared once; migration 0002 created them, 0003 recreated
them over PostgreSQL's `json` columns, 0006 over the projections shaped for them (call
totals on `rollouts`, `latest_rewards`), 0009 over what each train step trained, kept on
`train_steps`, and each rollout's reward, kept on `rollouts`; 0012 added `v_runs.model_key`.

Each view is a SQLAlchemy Core `select()` over the projection tables, compiled for the
database at hand. Everything a view shows is the same on SQLite and on PostgreSQL: the
same columns, the same values. The few functions the two spell differently (timestamps,
JSON) are the small constructs at the top of this module, compiled once per database.

Conventions of every view:

- names start with `v_`; the tables they read keep their own names (`runs`, `rollouts`...);
- timestamps (`*_at`) are UTC text, `YYYY-MM-DD HH:MM:SS.ffffff`, which sorts in time order;
- durations and latencies (`*_s`) are seconds as floating-point numbers;
- flags are the integers 0 and 1 (so that `sum(flag)` counts);
- JSON columns hold JSON text exactly as stored (text on SQLite, `json` on PostgreSQL: key
  order and every character kept); JSON `null` reads as NULL;
- a reward "latest" for a rollout and a scorer is the one recorded last: re-scoring appends
  a new reward event and never overwrites the old one (docs/architecture.md, invariant 6).

SQLite needs its JSON functions and window functions (3.25+, in every Python 3.11), and
`sqrt` (registered by artstore.eventstore.database when SQLite lacks its math functions).

Changing a view: change it here and add a migration that runs `drop_statements()` then
`create_statements()`. A migration that rebuilds a table a view reads (SQLite's batch mode
copies the table) drops the views first and creates them again at its end.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import (
    Float,
    Integer,
    String,
    and_,
    case,
    column,
    exists,
    func,
    literal,
    select,
    table,
    true,
)
from sqlalchemy.engine import Dialect
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql import ColumnElement, Select
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.functions import FunctionElement
from sqlalchemy.sql.selectable import Subquery, TableClause, TableValuedAlias

from artstore.schema import tables as t

# --- portable functions: one construct, one spelling per database -----------------------


def _args(element: FunctionElement, compiler: SQLCompiler, **kw) -> list[str]:
    return [compiler.process(arg, **kw) for arg in element.clauses]


class utc_text(FunctionElement):
    """A timestamp as UTC text `YYYY-MM-DD HH:MM:SS.ffffff`."""

    type = String()
    name = "utc_text"
    inherit_cache = True


@compiles(utc_text, "sqlite")
def _utc_text_sqlite(element, compiler, **kw):
    # SQLAlchemy writes SQLite timestamps in exactly this form, in UTC (tables.Timestamp).
    return _args(element, compiler, **kw)[0]


@compiles(utc_text, "postgresql")
def _utc_text_postgresql(element, compiler, **kw):
    (ts,) = _args(element, compiler, **kw)
    return f"to_char(({ts}) AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS.US')"


class seconds_between(FunctionElement):
    """`end - start` in seconds (a float, exact to the microsecond on both databases)."""

    type = Float()
    name = "seconds_between"
    inherit_cache = True


@compiles(seconds_between, "sqlite")
def _seconds_between_sqlite(element, compiler, **kw):
    start, end = _args(element, compiler, **kw)
    # Whole seconds by strftime, microseconds from the text (`...:SS.ffffff`): integer
    # microseconds first, one division last, so that the result is the correctly rounded
    # float, as PostgreSQL's numeric EXTRACT gives.
    return (
        f"((CAST(strftime('%s', {end}) AS INTEGER) - CAST(strftime('%s', {start}) AS INTEGER))"
        f" * 1000000 + (CAST(substr({end}, 21, 6) AS INTEGER)"
        f" - CAST(substr({start}, 21, 6) AS INTEGER))) / 1000000.0"
    )


@compiles(seconds_between, "postgresql")
def _seconds_between_postgresql(element, compiler, **kw):
    start, end = _args(element, compiler, **kw)
    return f"CAST(EXTRACT(EPOCH FROM ({end}) - ({start})) AS DOUBLE PRECISION)"


class json_field(FunctionElement):
    """The text of a JSON object's field: `json_field(doc, "function", "name")`."""

    type = String()
    name = "json_field"
    inherit_cache = True


@compiles(json_field, "sqlite")
def _json_field_sqlite(element, compiler, **kw):
    doc, *path = element.clauses
    keys = ".".join(_literal_key(key) for key in path)
    return f"json_extract({compiler.process(doc, **kw)}, '$.{keys}')"


@compiles(json_field, "postgresql")
def _json_field_postgresql(element, compiler, **kw):
    doc, *path = element.clauses
    keys = ",".join(_literal_key(key) for key in path)
    return f"({compiler.process(doc, **kw)} #>> '{{{keys}}}')"


class json_member(FunctionElement):
    """A JSON object's field as JSON: `json_member(tool_call, "args")`."""

    name = "json_member"
    inherit_cache = True


@compiles(json_member, "sqlite")
def _json_member_sqlite(element, compiler, **kw):
    doc, key = element.clauses
    return f"json_extract({compiler.process(doc, **kw)}, '$.{_literal_key(key)}')"


@compiles(json_member, "postgresql")
def _json_member_postgresql(element, compiler, **kw):
    doc, key = element.clauses
    member = f"({compiler.process(doc, **kw)} -> '{_literal_key(key)}')"
    return _null_for_json_null(member)


def _null_for_json_null(value: str) -> str:
    # PostgreSQL's json has no equality operator (NULLIF): ask for the type instead.
    return f"CASE WHEN json_typeof({value}) = 'null' THEN NULL ELSE {value} END"


def _literal_key(key: ColumnElement) -> str:
    value = key.value  # type: ignore[attr-defined]
    if not isinstance(value, str) or not value.replace("_", "").isalnum():
        raise ValueError(f"JSON keys in views are plain names, not {value!r}")
    return value


class json_or_null(FunctionElement):
    """A JSON column with JSON `null` read as SQL NULL (SQLAlchemy writes None as `null`)."""

    name = "json_or_null"
    inherit_cache = True


@compiles(json_or_null, "sqlite")
def _json_or_null_sqlite(element, compiler, **kw):
    return f"NULLIF({_args(element, compiler, **kw)[0]}, 'null')"


@compiles(json_or_null, "postgresql")
def _json_or_null_postgresql(element, compiler, **kw):
    return _null_for_json_null(_args(element, compiler, **kw)[0])


class json_array_length(FunctionElement):
    """The length of a JSON array; 0 for NULL, JSON null or anything not an array."""

    type = Integer()
    name = "json_array_length"
    inherit_cache = True


@compiles(json_array_length, "sqlite")
def _json_array_length_sqlite(element, compiler, **kw):
    (doc,) = _args(element, compiler, **kw)
    return f"(CASE WHEN json_type({doc}) = 'array' THEN json_array_length({doc}) ELSE 0 END)"


@compiles(json_array_length, "postgresql")
def _json_array_length_postgresql(element, compiler, **kw):
    (doc,) = _args(element, compiler, **kw)
    return f"(CASE WHEN json_typeof({doc}) = 'array' THEN json_array_length({doc}) ELSE 0 END)"


class json_array_elements(FunctionElement):
    """The elements of a JSON array as rows (none for anything not an array).

    Use through `elements(doc)`: its `value` column is the element (JSON), and
    `element_index(...)`, `element_text(...)` read it the same way on both databases.
    """

    name = "json_array_elements"
    inherit_cache = True


@compiles(json_array_elements, "sqlite")
def _json_array_elements_sqlite(element, compiler, **kw):
    (doc,) = _args(element, compiler, **kw)
    return f"json_each(CASE WHEN json_type({doc}) = 'array' THEN {doc} ELSE '[]' END)"


@compiles(json_array_elements, "postgresql")
def _json_array_elements_postgresql(element, compiler, **kw):
    (doc,) = _args(element, compiler, **kw)
    return (
        f"json_array_elements(CASE WHEN json_typeof({doc}) = 'array' "
        f"THEN {doc} ELSE '[]'::json END) WITH ORDINALITY"
    )


class json_object_entries(FunctionElement):
    """The (key, value) entries of a JSON object as rows (none for anything else)."""

    name = "json_object_entries"
    inherit_cache = True


@compiles(json_object_entries, "sqlite")
def _json_object_entries_sqlite(element, compiler, **kw):
    (doc,) = _args(element, compiler, **kw)
    return f"json_each(CASE WHEN json_type({doc}) = 'object' THEN {doc} ELSE '{{}}' END)"


@compiles(json_object_entries, "postgresql")
def _json_object_entries_postgresql(element, compiler, **kw):
    (doc,) = _args(element, compiler, **kw)
    return f"json_each(CASE WHEN json_typeof({doc}) = 'object' THEN {doc} ELSE '{{}}'::json END)"


def elements(doc: ColumnElement, name: str) -> TableValuedAlias:
    """`json_array_elements(doc)` as a FROM item named `name`."""
    # json_each gives (key, value, type, ...); json_array_elements WITH ORDINALITY gives
    # (value, ordinality): declare them all, each database reads the ones it has.
    return json_array_elements(doc).table_valued("value", "key", "type", "ordinality", name=name)


def entries(doc: ColumnElement, name: str) -> TableValuedAlias:
    """`json_object_entries(doc)` as a FROM item named `name` (columns key, value)."""
    return json_object_entries(doc).table_valued("key", "value", "type", name=name)


class element_index(ColumnElement):
    """The 0-based index of a row of `elements(...)` in its array."""

    type = Integer()
    inherit_cache = True

    def __init__(self, alias: TableValuedAlias) -> None:
        self.alias = alias


@compiles(element_index, "sqlite")
def _element_index_sqlite(element, compiler, **kw):
    return compiler.process(element.alias.c.key, **kw)


@compiles(element_index, "postgresql")
def _element_index_postgresql(element, compiler, **kw):
    return f"({compiler.process(element.alias.c.ordinality, **kw)} - 1)"


class element_text(ColumnElement):
    """A row of `elements(...)` or `entries(...)` as text (for arrays of strings)."""

    type = String()
    inherit_cache = True

    def __init__(self, alias: TableValuedAlias) -> None:
        self.alias = alias


@compiles(element_text, "sqlite")
def _element_text_sqlite(element, compiler, **kw):
    return compiler.process(element.alias.c.value, **kw)  # json_each's value is SQL already


@compiles(element_text, "postgresql")
def _element_text_postgresql(element, compiler, **kw):
    return f"({compiler.process(element.alias.c.value, **kw)} #>> '{{}}')"


class element_number(ColumnElement):
    """A row of `elements(...)` or `entries(...)` as a float (true is 1, false is 0)."""

    type = Float()
    inherit_cache = True

    def __init__(self, alias: TableValuedAlias) -> None:
        self.alias = alias


@compiles(element_number, "sqlite")
def _element_number_sqlite(element, compiler, **kw):
    value = compiler.process(element.alias.c.value, **kw)
    kind = compiler.process(element.alias.c.type, **kw)
    return (
        f"(CASE WHEN {kind} IN ('integer', 'real') THEN CAST({value} AS DOUBLE PRECISION) "
        f"WHEN {kind} = 'true' THEN 1.0 WHEN {kind} = 'false' THEN 0.0 END)"
    )


@compiles(element_number, "postgresql")
def _element_number_postgresql(element, compiler, **kw):
    value = compiler.process(element.alias.c.value, **kw)
    return (
        f"(CASE json_typeof({value}) "
        f"WHEN 'number' THEN CAST({value} #>> '{{}}' AS DOUBLE PRECISION) "
        f"WHEN 'boolean' THEN CASE WHEN CAST({value} AS TEXT) = 'true' THEN 1.0 ELSE 0.0 END END)"
    )


class text_agg(FunctionElement):
    """Aggregate texts into one, `, `-separated, in the order of `order_by`."""

    type = String()
    name = "text_agg"
    inherit_cache = True


@compiles(text_agg, "sqlite")
def _text_agg_sqlite(element, compiler, **kw):
    # SQLite (before 3.44) has no ORDER BY in aggregates: it concatenates in scan order,
    # which for json_each is the array's order.
    text, _order = _args(element, compiler, **kw)
    return f"group_concat({text}, ', ')"


@compiles(text_agg, "postgresql")
def _text_agg_postgresql(element, compiler, **kw):
    text, order = _args(element, compiler, **kw)
    return f"string_agg({text}, ', ' ORDER BY {order})"


# --- building blocks --------------------------------------------------------------------


def _flag(condition: ColumnElement) -> ColumnElement[int]:
    return case((condition, 1), else_=0)


def _tool_name(tool_call: ColumnElement) -> ColumnElement[str]:
    """The tool's name in LangChain's form (`{"name": ...}`) or OpenAI's (`{"function": ...}`)."""
    return func.coalesce(json_field(tool_call, "name"), json_field(tool_call, "function", "name"))


def _tool_names(tool_calls: ColumnElement, alias: str) -> ColumnElement[str]:
    """Names of the tools in a list of tool calls, in order: `search, calculator`."""
    calls = elements(tool_calls, alias)
    return (
        select(text_agg(_tool_name(calls.c.value), element_index(calls)))
        .select_from(calls)
        .scalar_subquery()
    )


def _is_policy(role: ColumnElement) -> ColumnElement[bool]:
    """A rollout that trains (the policy), also when its rollout row is missing."""
    return func.coalesce(role, "policy") != "validation"


def _latest(rewards) -> ColumnElement[bool]:
    """This reward row is the last one recorded for its rollout and scorer (the one
    `latest_rewards` holds: rewards are projected in the order of their events)."""
    latest = t.latest_rewards
    return exists().where(
        latest.c.rollout_id == rewards.c.rollout_id,
        latest.c.scorer == rewards.c.scorer,
        latest.c.position == rewards.c.position,
    )


def _latest_rewards(name: str):
    """Latest rewards with the role of their rollout, as a subquery named `name`."""
    r, ro = t.latest_rewards.alias(f"{name}_r"), t.rollouts.alias(f"{name}_ro")
    return (
        select(r.c.rollout_id, r.c.group_id, r.c.scorer, r.c.reward, ro.c.role)
        .select_from(r.outerjoin(ro, ro.c.rollout_id == r.c.rollout_id))
        .subquery(name)
    )


# --- the views --------------------------------------------------------------------------


def _v_runs() -> Select:
    ru, ro, g, ts, c = t.runs, t.rollouts, t.groups, t.train_steps, t.llm_calls
    rollouts = (
        select(
            ro.c.run,
            func.count().label("num_rollouts"),
            func.count(case((ro.c.status == "finished", 1))).label("num_finished"),
            func.count(case((ro.c.status == "failed", 1))).label("num_failed"),
            func.count(case((ro.c.status == "running", 1))).label("num_running"),
        )
        .group_by(ro.c.run)
        .subquery("rollout_counts")
    )
    tokens = (
        select(ro.c.run, func.sum(c.c.total_tokens).label("total_tokens"))
        .select_from(c.join(ro, ro.c.rollout_id == c.c.rollout_id))
        .group_by(ro.c.run)
        .subquery("token_counts")
    )
    groups = (
        select(g.c.run, func.count().label("num_groups")).group_by(g.c.run).subquery("group_counts")
    )
    steps = (
        select(
            ts.c.run,
            func.count().label("num_train_steps"),
            func.max(ts.c.step).label("last_step"),
        )
        .where(ts.c.status == "completed")
        .group_by(ts.c.run)
        .subquery("step_counts")
    )
    return select(
        ru.c.run,
        ru.c.project,
        ru.c.model,
        # "project/model": how v_train_steps, v_train_step_metrics and v_groups name it.
        case(
            (func.coalesce(ru.c.project, "") == "", ru.c.model),
            else_=ru.c.project + "/" + ru.c.model,
        ).label("model_key"),
        ru.c.base_model,
        ru.c.validation_model,
        ru.c.scorer,
        ru.c.status,
        ru.c.trainer,
        ru.c.error,
        ru.c.num_scenarios,
        func.coalesce(rollouts.c.num_rollouts, 0).label("num_rollouts"),
        func.coalesce(rollouts.c.num_finished, 0).label("num_finished"),
        func.coalesce(rollouts.c.num_failed, 0).label("num_failed"),
        func.coalesce(rollouts.c.num_running, 0).label("num_running"),
        func.coalesce(groups.c.num_groups, 0).label("num_groups"),
        func.coalesce(steps.c.num_train_steps, 0).label("num_train_steps"),
        steps.c.last_step,
        tokens.c.total_tokens,
        utc_text(ru.c.started_at).label("started_at"),
        utc_text(ru.c.finished_at).label("finished_at"),
        seconds_between(ru.c.started_at, ru.c.finished_at).label("duration_s"),
        json_or_null(ru.c.config).label("config"),
    ).select_from(
        ru.outerjoin(rollouts, rollouts.c.run == ru.c.run)
        .outerjoin(tokens, tokens.c.run == ru.c.run)
        .outerjoin(groups, groups.c.run == ru.c.run)
        .outerjoin(steps, steps.c.run == ru.c.run)
    )


def _v_rollouts() -> Select:
    # The call totals and the latest reward by the run's scorer are kept on the rollout's
    # row (artstore/projections/bulk.py, rollout_rewards.py): no aggregate over llm_calls,
    # no lookup in latest_rewards.
    ro, ru = t.rollouts, t.runs
    return select(
        ro.c.rollout_id,
        ro.c.run,
        ro.c.group_id,
        ro.c.scenario_index,
        ro.c.model,
        ro.c.role,
        ro.c.policy_step,
        ro.c.status,
        ro.c.error_type,
        ro.c.error_message,
        ro.c.num_llm_calls,
        ro.c.prompt_tokens,
        ro.c.completion_tokens,
        ro.c.total_tokens,
        ro.c.num_tool_calls,
        ro.c.llm_latency_s,
        ru.c.scorer,
        ro.c.reward,
        utc_text(ro.c.started_at).label("started_at"),
        utc_text(ro.c.finished_at).label("finished_at"),
        ro.c.duration_s,
        _flag(ro.c.imported).label("imported"),
        json_or_null(ro.c.scenario).label("scenario"),
        json_or_null(ro.c.result).label("result"),
    ).select_from(ro.outerjoin(ru, ru.c.run == ro.c.run))


def _v_llm_calls() -> Select:
    c, ro = t.llm_calls, t.rollouts
    return select(
        c.c.call_id,
        c.c.rollout_id,
        ro.c.run,
        ro.c.group_id,
        ro.c.policy_step,
        ro.c.role,
        c.c.call_index,
        c.c.model,
        c.c.prompt_tokens,
        c.c.completion_tokens,
        c.c.total_tokens,
        c.c.latency_s,
        c.c.finish_reason,
        c.c.num_input_messages,
        json_array_length(c.c.tool_calls).label("num_tool_calls"),
        _tool_names(c.c.tool_calls, "call_tool").label("tool_names"),
        _flag(c.c.has_logprobs).label("has_logprobs"),
        c.c.error_type,
        c.c.error_message,
        utc_text(c.c.started_at).label("started_at"),
        c.c.position,
        json_or_null(c.c.tool_calls).label("tool_calls"),
        c.c.source,
        c.c.endpoint,
        _flag(c.c.streamed).label("streamed"),
        _flag(c.c.art_exchange).label("art_exchange"),
    ).select_from(c.outerjoin(ro, ro.c.rollout_id == c.c.rollout_id))


def _v_tool_calls() -> Select:
    c, ro = t.llm_calls, t.rollouts
    calls = select(
        c.c.call_id,
        c.c.rollout_id,
        c.c.call_index,
        c.c.latency_s,
        c.c.started_at,
        c.c.tool_calls,
        func.lead(c.c.started_at)
        .over(partition_by=c.c.rollout_id, order_by=c.c.call_index)
        .label("next_started_at"),
    ).subquery("calls")
    tool = elements(calls.c.tool_calls, "tool")
    return select(
        calls.c.call_id,
        calls.c.rollout_id,
        ro.c.run,
        ro.c.policy_step,
        ro.c.role,
        calls.c.call_index,
        element_index(tool).label("tool_index"),
        _tool_name(tool.c.value).label("tool_name"),
        json_array_length(calls.c.tool_calls).label("num_parallel"),
        calls.c.latency_s.label("call_latency_s"),
        (seconds_between(calls.c.started_at, calls.c.next_started_at) - calls.c.latency_s).label(
            "tool_time_s"
        ),
        utc_text(calls.c.started_at).label("started_at"),
        json_member(tool.c.value, literal("args")).label("args"),
    ).select_from(calls.join(tool, true()).outerjoin(ro, ro.c.rollout_id == calls.c.rollout_id))


def _reward_columns(r, ro):
    return (
        r.c.rollout_id,
        r.c.group_id,
        ro.c.run,
        ro.c.policy_step,
        ro.c.role,
        r.c.scorer,
        r.c.reward,
        _flag(r.c.rescored).label("rescored"),
    )


def _reward_tail(r):
    return (
        utc_text(r.c.recorded_at).label("recorded_at"),
        r.c.position,
        r.c.id,
        json_or_null(r.c.metrics).label("metrics"),
    )


def _v_rewards() -> Select:
    r, ro = t.rewards, t.rollouts
    return select(
        *_reward_columns(r, ro), _flag(_latest(r)).label("is_latest"), *_reward_tail(r)
    ).select_from(r.outerjoin(ro, ro.c.rollout_id == r.c.rollout_id))


def _v_latest_rewards() -> Select:
    r, ro = t.rewards, t.rollouts
    every = t.rewards.alias("every")
    num_scores = (
        select(func.count())
        .where(every.c.rollout_id == r.c.rollout_id, every.c.scorer == r.c.scorer)
        .scalar_subquery()
    )
    return (
        select(*_reward_columns(r, ro), num_scores.label("num_scores"), *_reward_tail(r))
        .select_from(r.outerjoin(ro, ro.c.rollout_id == r.c.rollout_id))
        .where(_latest(r))
    )


def _group_reward_stats() -> tuple[Subquery, Subquery]:
    """Per group and scorer, its policy rewards' count, mean, min and max and its validation
    rewards' mean (`stats`), and their variance (`spread`)."""
    latest = _latest_rewards("latest")
    policy = _is_policy(latest.c.role)
    policy_reward = case((policy, latest.c.reward))
    stats = (
        select(
            latest.c.group_id,
            latest.c.scorer,
            func.count(policy_reward).label("num_rewards"),
            func.avg(policy_reward).label("reward_mean"),
            func.min(policy_reward).label("reward_min"),
            func.max(policy_reward).label("reward_max"),
            func.avg(case((~policy, latest.c.reward))).label("validation_reward_mean"),
        )
        .group_by(latest.c.group_id, latest.c.scorer)
        .subquery("stats")
    )
    # Population standard deviation in two passes (mean first, then the mean squared
    # deviation): exact enough, and never the square root of a tiny negative number.
    again = _latest_rewards("again")
    deviation = again.c.reward - stats.c.reward_mean
    spread = (
        select(
            again.c.group_id,
            again.c.scorer,
            func.avg(deviation * deviation).label("variance"),
        )
        .select_from(
            again.join(
                stats,
                and_(stats.c.group_id == again.c.group_id, stats.c.scorer == again.c.scorer),
            )
        )
        .where(_is_policy(again.c.role))
        .group_by(again.c.group_id, again.c.scorer)
        .subquery("spread")
    )
    return stats, spread


def _v_groups() -> Select:
    g, gc = t.groups, t.group_consumptions
    stats, spread = _group_reward_stats()
    # A group whose rewards are all equal has exactly 0 (ART learns nothing from it).
    reward_std = case(
        (stats.c.reward_max == stats.c.reward_min, literal(0.0, Float())),
        else_=func.sqrt(spread.c.variance),
    )

    def first_consumption(column):
        return (
            select(column)
            .where(gc.c.group_id == g.c.group_id)
            .order_by(gc.c.position, gc.c.model)
            .limit(1)
            .scalar_subquery()
        )

    num_consumptions = select(func.count()).where(gc.c.group_id == g.c.group_id)
    return select(
        g.c.group_id,
        g.c.run,
        g.c.epoch,
        g.c.batch,
        g.c.scenario_index,
        g.c.size,
        g.c.num_validation,
        g.c.num_failed,
        stats.c.scorer,
        func.coalesce(stats.c.num_rewards, 0).label("num_rewards"),
        stats.c.reward_mean,
        reward_std.label("reward_std"),
        stats.c.reward_min,
        stats.c.reward_max,
        stats.c.validation_reward_mean,
        first_consumption(gc.c.model).label("consumed_by"),
        first_consumption(gc.c.step).label("consumed_at_step"),
        first_consumption(gc.c.scorer).label("consumed_with_scorer"),
        num_consumptions.scalar_subquery().label("num_consumptions"),
        utc_text(g.c.sealed_at).label("sealed_at"),
        g.c.position,
    ).select_from(
        g.outerjoin(stats, stats.c.group_id == g.c.group_id).outerjoin(
            spread,
            and_(spread.c.group_id == stats.c.group_id, spread.c.scorer == stats.c.scorer),
        )
    )


def _v_train_steps() -> Select:
    # What a step trained (its groups' policy rollouts with a latest reward by its scorer,
    # their count and mean) is kept on its row (artstore/projections/trained.py): no join
    # of every rollout and latest reward for every query.
    ts = t.train_steps
    return select(
        ts.c.id,
        ts.c.run,
        ts.c.model,
        ts.c.step_before,
        ts.c.step,
        ts.c.status,
        ts.c.scorer,
        ts.c.num_groups,
        ts.c.num_trajectories,
        ts.c.reward_mean,
        ts.c.checkpoint,
        ts.c.pushed_to,
        _flag(ts.c.reconciled).label("reconciled"),
        ts.c.error_type,
        ts.c.error_message,
        utc_text(ts.c.started_at).label("started_at"),
        utc_text(ts.c.finished_at).label("finished_at"),
        ts.c.duration_s,
        json_or_null(ts.c.group_ids).label("group_ids"),
        json_or_null(ts.c.metrics).label("metrics"),
    )


def _v_train_step_metrics() -> Select:
    ts = t.train_steps
    metric = entries(ts.c.metrics, "metric")
    return select(
        ts.c.id.label("train_step_id"),
        ts.c.run,
        ts.c.model,
        ts.c.step,
        ts.c.status,
        metric.c.key.label("metric"),
        element_number(metric).label("value"),
    ).select_from(ts.join(metric, true()))


def _v_trajectory_messages() -> Select:
    m, ro = t.trajectory_messages, t.rollouts
    return select(
        m.c.rollout_id,
        ro.c.run,
        ro.c.policy_step,
        ro.c.role.label("rollout_role"),
        m.c.history_index,
        m.c.message_index,
        m.c.role,
        m.c.content,
        _flag(m.c.trainable).label("trainable"),
        m.c.num_logprobs,
        m.c.tool_call_id,
        json_array_length(m.c.tool_calls).label("num_tool_calls"),
        _tool_names(m.c.tool_calls, "message_tool").label("tool_names"),
        json_or_null(m.c.tool_calls).label("tool_calls"),
    ).select_from(m.outerjoin(ro, ro.c.rollout_id == m.c.rollout_id))


@dataclass(frozen=True)
class View:
    name: str
    summary: str
    query: Select

    def create_sql(self, dialect: Dialect) -> str:
        compiled = self.query.compile(dialect=dialect, compile_kwargs={"literal_binds": True})
        return f"CREATE VIEW {self.name} AS\n{compiled}"

    def drop_sql(self) -> str:
        return f"DROP VIEW IF EXISTS {self.name}"

    @property
    def columns(self) -> list[str]:
        return [column.name for column in self.query.selected_columns]

    @property
    def json_columns(self) -> list[str]:
        """The columns that hold JSON (`config`, `metrics`, `tool_calls`...)."""
        return [
            selected.name
            for selected in self.query.selected_columns
            if isinstance(getattr(selected, "element", selected), json_or_null | json_member)
        ]

    def as_table(self) -> TableClause:
        """The view as a table to select from with SQLAlchemy Core; its JSON columns are
        typed JSON, so they come back decoded (dicts and lists) from both databases."""
        json_columns = set(self.json_columns)
        return table(
            self.name,
            *(column(name, t.Json if name in json_columns else None) for name in self.columns),
        )


VIEWS: tuple[View, ...] = (
    View("v_runs", "one row per run, with counts of its rollouts, groups and steps", _v_runs()),
    View("v_rollouts", "one row per rollout, with its tokens and its reward", _v_rollouts()),
    View("v_llm_calls", "one row per LLM call", _v_llm_calls()),
    View("v_tool_calls", "one row per tool call an LLM call requested", _v_tool_calls()),
    View("v_rewards", "one row per reward ever recorded", _v_rewards()),
    View("v_latest_rewards", "the latest reward per rollout and scorer", _v_latest_rewards()),
    View("v_groups", "one row per sealed group and scorer", _v_groups()),
    View("v_train_steps", "one row per train step", _v_train_steps()),
    View("v_train_step_metrics", "one row per train step and metric", _v_train_step_metrics()),
    View("v_trajectory_messages", "one row per trajectory message", _v_trajectory_messages()),
)


VIEWS_BY_NAME = {view.name: view for view in VIEWS}


def view_table(name: str) -> TableClause:
    """`VIEWS_BY_NAME[name].as_table()`: a view to query, e.g. `select(view_table("v_runs"))`."""
    return VIEWS_BY_NAME[name].as_table()


def json_column_names() -> frozenset[str]:
    """Names of the columns that hold JSON in any view."""
    return frozenset(name for view in VIEWS for name in view.json_columns)


def create_statements(dialect: Dialect) -> list[str]:
    """`CREATE VIEW` for every view, compiled for `dialect`."""
    return [view.create_sql(dialect) for view in VIEWS]


def drop_statements() -> list[str]:
    return [view.drop_sql() for view in reversed(VIEWS)]
