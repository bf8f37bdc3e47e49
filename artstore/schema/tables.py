"""Every table, declared once. Migrations and queries both import these objects.

Two kinds of table:

- the event log (`events`) and content-addressed `blobs`: append-only, the source of
  truth; triggers refuse every statement that would change or remove a row of them
  (UPDATE, DELETE, TRUNCATE, and on SQLite the REPLACE that deletes before inserting);
- projections (read models) built from the events inside the same transaction that
  appends them: runs, rollouts, llm_calls, rewards, latest_rewards, groups, group_consumptions,
  train_steps, train_step_groups, trajectory_messages, and LangGraph's checkpoints
  (langgraph_checkpoints, langgraph_channel_values, langgraph_writes). They can be
  rebuilt from the events at any time;
- coordination of rollout workers on PostgreSQL (worker_runs, rollout_claims,
  group_claims): who may do which piece of a run's work now. Not projections and not
  history: a claim says who holds a lease, the events say what happened.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Column,
    DateTime,
    Float,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
    false,
    text,
)
from sqlalchemy.engine import Dialect
from sqlalchemy.types import TypeDecorator

metadata = MetaData(
    naming_convention={
        "ix": "ix_%(table_name)s_%(column_0_N_name)s",
        "uq": "uq_%(table_name)s_%(column_0_N_name)s",
        "pk": "pk_%(table_name)s",
    }
)

# JSON text, kept exactly as written: `json` on PostgreSQL (not `jsonb`, which reorders
# keys and refuses the escape \u0000), text on SQLite.
Json = JSON()
# SQLite only makes INTEGER PRIMARY KEY an alias of the rowid (and AUTOINCREMENT).
Position = BigInteger().with_variant(Integer(), "sqlite")


class Timestamp(TypeDecorator):
    """`DateTime(timezone=True)`, always written in UTC.

    SQLite keeps no zone: a time with an offset would be stored as its wall-clock time and
    no longer compare with the others (nor match PostgreSQL, which converts to UTC itself).
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is not None and value.tzinfo is not None:
            return value.astimezone(UTC)
        return value


REPLACEMENT_CHARACTER = "\ufffd"
# What neither database's text can hold: NUL (PostgreSQL) and lone surrogates (UTF-8).
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


def storable_text(value: str) -> str:
    """`value` with NUL and lone surrogates replaced by U+FFFD."""
    if value.isascii():  # a flag of the string: no scan
        return value.replace("\x00", REPLACEMENT_CHARACTER) if "\x00" in value else value
    return _UNSTORABLE.sub(REPLACEMENT_CHARACTER, value)


class ProjectedText(TypeDecorator):
    """Text of a projection table: a NUL character or a lone surrogate becomes U+FFFD.

    PostgreSQL's text cannot hold NUL, and neither database's UTF-8 text a lone surrogate
    (a file name decoded with surrogateescape, say); the event log keeps both (escaped in
    JSON), and the projections, rebuilt from the log at will, show U+FFFD in their place
    on both databases, so that the views agree.
    """

    impl = String
    cache_ok = True

    def process_bind_param(self, value: str | None, dialect: Dialect) -> str | None:
        return storable_text(value) if isinstance(value, str) else value


class ProjectedLongText(ProjectedText):
    impl = Text
    cache_ok = True


ID = ProjectedText(64)

NAME = ProjectedText(200)

# --- source of truth ----------------------------------------------------------------------

events = Table(
    "events",
    metadata,
    # Global position: read in commit order on both databases (artstore/eventstore/store.py).
    Column("position", Position, primary_key=True, autoincrement=True),
    Column("event_id", String(36), nullable=False, unique=True),
    Column("stream_id", String(255), nullable=False),
    Column("version", Integer, nullable=False),
    Column("type", String(100), nullable=False),
    Column("data", Json, nullable=False),
    Column("recorded_at", Timestamp, nullable=False),
    UniqueConstraint("stream_id", "version"),
    # No index on `type` (dropped in 0008): each append paid for it and no query needs it.
    # No AUTOINCREMENT on SQLite (dropped in 0011): events are never deleted, and the
    # writer numbers them after the highest position ever handed out.
)

blobs = Table(
    "blobs",
    metadata,
    Column("hash", String(64), primary_key=True),  # sha256 of the blob's text
    # The text itself when `codec` is NULL, else its compact form (eventstore/blob_codec.py);
    # read through eventstore.blobs.read_blob_texts, which gives the text back either way.
    Column("body", Text, nullable=False),
    Column("size", Integer, nullable=False),  # characters of `body` as stored
    Column("codec", String(32)),
)

# `artstore archive`: while a row is here, the triggers let a DELETE of events and blobs
# through (migration 0016). Only the archive's transaction writes one, and removes it
# before it commits: no committed state holds a permit.
archive_permits = Table("archive_permits", metadata, Column("run", NAME, primary_key=True))

# PostgreSQL: a transaction that appends events holds an EXCLUSIVE lock on this empty
# table until it commits (taken by a statement trigger on `events`), so that global
# positions are handed out in commit order; appends with nothing to project share it in
# ROW EXCLUSIVE mode (migration 0010). A table lock, unlike an advisory lock, is refused
# to a role without privileges on the table (artstore sql's).
# SQLite leaves it unused: one writer at a time is the file's own rule.
append_lock = Table("append_lock", metadata, Column("id", Integer, primary_key=True))

# --- projections ----------------------------------------------------------------------------

runs = Table(
    "runs",
    metadata,
    Column("run", NAME, primary_key=True),
    Column("project", NAME, nullable=False),
    Column("model", NAME, nullable=False),
    Column("base_model", NAME),
    Column("validation_model", NAME),
    Column("scorer", NAME, nullable=False),
    # running | finished | failed | imported | recorded (only rollouts named it)
    Column("status", ProjectedText(20), nullable=False),
    Column("config", Json, nullable=False),
    Column("num_scenarios", Integer, nullable=False),
    Column("trainer", NAME),
    Column("error", ProjectedLongText),
    Column("started_at", Timestamp, nullable=False),
    Column("finished_at", Timestamp),
)

rollouts = Table(
    "rollouts",
    metadata,
    Column("rollout_id", ID, primary_key=True),
    Column("run", NAME),
    Column("group_id", ID),
    Column("scenario_index", Integer),
    Column("scenario", Json),
    Column("model", NAME, nullable=False),
    Column("role", ProjectedText(20), nullable=False),  # policy | validation
    Column("policy_step", Integer),
    Column("status", ProjectedText(20), nullable=False),  # running | finished | failed
    Column("result", Json),
    Column("error_type", NAME),
    Column("error_message", ProjectedLongText),
    Column("num_llm_calls", Integer, nullable=False, default=0),
    # Totals of the rollout's LLM calls (sums as SQL's SUM gives them: NULL until a call
    # reports the value), kept up to date with each call so that v_rollouts need not
    # aggregate llm_calls for every query.
    Column("prompt_tokens", BigInteger),
    Column("completion_tokens", BigInteger),
    Column("total_tokens", BigInteger),
    Column("num_tool_calls", Integer, nullable=False, server_default="0"),
    Column("llm_latency_s", Float),
    # The latest reward by the run's scorer (artstore/projections/rollout_rewards.py).
    Column("reward", Float),
    Column("started_at", Timestamp, nullable=False),
    Column("finished_at", Timestamp),
    Column("duration_s", Float),
    Column("imported", Boolean, nullable=False, default=False),
    Index(None, "run", "status"),
    Index(None, "group_id"),
    # Covers what the per-step questions read of a rollout (reward curve, tokens per
    # step), in their order: SQLite reads this index alone, neither the rows (with their
    # scenarios and results) nor a sort.
    Index(
        "ix_rollouts_run_policy_step",
        "run",
        "policy_step",
        "role",
        "reward",
        "num_llm_calls",
        "prompt_tokens",
        "completion_tokens",
        "total_tokens",
        "llm_latency_s",
    ),
)

llm_calls = Table(
    "llm_calls",
    metadata,
    Column("call_id", ID, primary_key=True),
    Column("rollout_id", ID, nullable=False),
    Column("call_index", Integer, nullable=False),
    Column("model", NAME),
    Column("prompt_tokens", Integer),
    Column("completion_tokens", Integer),
    Column("total_tokens", Integer),
    Column("latency_s", Float),
    Column("finish_reason", ProjectedText(40)),
    Column("num_input_messages", Integer, nullable=False),
    Column("tool_calls", Json),  # [{"name": ..., "args": {...}}] requested by the model
    Column("has_logprobs", Boolean, nullable=False),
    Column("error_type", NAME),
    Column("error_message", ProjectedLongText),
    Column("started_at", Timestamp, nullable=False),
    Column("position", Position, nullable=False),  # of the llm.call event
    # How it was recorded: "langchain" (a chat model's messages) or "http" (the request).
    Column("source", String(20), nullable=False, server_default="langchain"),
    Column("endpoint", String(40)),  # http: chat_completions | completions | responses | ...
    Column("streamed", Boolean, nullable=False, server_default=false()),
    Column("art_exchange", Boolean, nullable=False, server_default=false()),  # ART captured it
    Index(None, "rollout_id", "call_index"),
    # The calls that reported no latency (rare): tokens_per_step.sql counts them per step
    # without reading every call.
    Index(
        "ix_llm_calls_untimed",
        "rollout_id",
        sqlite_where=text("latency_s IS NULL"),
        postgresql_where=text("latency_s IS NULL"),
    ),
)

groups = Table(
    "groups",
    metadata,
    Column("group_id", ID, primary_key=True),
    Column("run", NAME),
    Column("epoch", Integer),
    Column("batch", Integer),
    Column("scenario_index", Integer),
    Column("size", Integer, nullable=False),
    Column("num_validation", Integer, nullable=False),
    Column("num_failed", Integer, nullable=False),
    Column("sealed_at", Timestamp, nullable=False),
    Column("position", Position, nullable=False),  # of the group.sealed event
    Index(None, "run", "batch"),
)

rewards = Table(
    "rewards",
    metadata,
    Column("id", Position, primary_key=True, autoincrement=True),
    Column("rollout_id", ID, nullable=False),
    Column("group_id", ID, nullable=False),
    Column("scorer", NAME, nullable=False),
    Column("reward", Float, nullable=False),
    Column("metrics", Json),
    Column("rescored", Boolean, nullable=False),
    Column("recorded_at", Timestamp, nullable=False),
    Column("position", Position, nullable=False),  # of the rewards.recorded event
    Index(None, "group_id", "scorer"),
    Index(None, "rollout_id", "scorer"),
    sqlite_autoincrement=True,
)

# The latest reward per rollout and scorer (the last `rewards` row of the pair, by event
# position): what v_rollouts, v_groups and v_train_steps read, one primary-key lookup per
# rollout instead of an anti-join over every reward ever recorded.
latest_rewards = Table(
    "latest_rewards",
    metadata,
    Column("rollout_id", ID, primary_key=True),
    Column("scorer", NAME, primary_key=True),
    Column("group_id", ID, nullable=False),
    Column("reward", Float, nullable=False),
    Column("position", Position, nullable=False),  # of the rewards.recorded event
)

train_steps = Table(
    "train_steps",
    metadata,
    Column("id", Position, primary_key=True, autoincrement=True),
    Column("run", NAME, nullable=False),
    Column("model", NAME, nullable=False),
    Column("step_before", Integer, nullable=False),
    Column("step", Integer),  # after training; NULL until completed
    Column("status", ProjectedText(20), nullable=False),  # started | completed | failed
    Column("scorer", NAME, nullable=False),
    Column("group_ids", Json, nullable=False),
    Column("num_groups", Integer, nullable=False),
    Column("metrics", Json),
    Column("checkpoint", ProjectedLongText),
    Column("pushed_to", ProjectedLongText),
    Column("reconciled", Boolean, nullable=False, default=False),
    Column("error_type", NAME),
    Column("error_message", ProjectedLongText),
    Column("started_at", Timestamp),
    Column("finished_at", Timestamp),
    Column("duration_s", Float),
    # What v_train_steps shows of the rollouts trained: the policy rollouts of the step's
    # groups that have a latest reward by the step's scorer, their count and mean reward.
    # Kept up to date by artstore/projections/trained.py whenever the step, those rewards
    # or those rollouts' groups change (a re-scoring after training included).
    Column("num_trajectories", Integer, nullable=False, server_default="0"),
    Column("reward_mean", Float),
    Index(None, "run", "model"),
    sqlite_autoincrement=True,
)

# Which train steps name a group (train_steps.group_ids, one row per distinct group): how
# a new reward or a group's new member finds the steps whose numbers it changes.
train_step_groups = Table(
    "train_step_groups",
    metadata,
    Column("group_id", ID, primary_key=True),
    Column("train_step_id", Position, primary_key=True),
)

# Invariant 4: a group is consumed by a given trained model at most once. Written in the
# transaction of the train_step.completed event; the primary key refuses a second time.
group_consumptions = Table(
    "group_consumptions",
    metadata,
    Column("group_id", ID, primary_key=True),
    Column("model", NAME, primary_key=True),
    Column("run", NAME, nullable=False),
    Column("step", Integer, nullable=False),
    Column("scorer", NAME, nullable=False),
    Column("consumed_at", Timestamp, nullable=False),
    Column("position", Position, nullable=False),  # of the train_step.completed event
)

trajectory_messages = Table(
    "trajectory_messages",
    metadata,
    Column("rollout_id", ID, primary_key=True),
    Column("history_index", Integer, primary_key=True),  # 0 = messages_and_choices
    Column("message_index", Integer, primary_key=True),
    Column("role", ProjectedText(20), nullable=False),
    Column("content", ProjectedLongText),
    Column("trainable", Boolean, nullable=False),
    Column("tool_calls", Json),
    Column("tool_call_id", ProjectedText(100)),
    Column("num_logprobs", Integer, nullable=False, default=0),
)

# LangGraph checkpoints (artstore.langgraph.checkpointer), projected from the
# `langgraph.*` events of each thread's stream: where each checkpoint, channel value and
# pending write of a thread is in the log (`position`: the event that holds it), so that a
# read is a few lookups by key. `langgraph.thread_deleted` removes a thread's rows.
langgraph_checkpoints = Table(
    "langgraph_checkpoints",
    metadata,
    Column("thread_id", ProjectedLongText, primary_key=True),
    Column("checkpoint_ns", ProjectedLongText, primary_key=True),
    Column("checkpoint_id", ProjectedLongText, primary_key=True),
    Column("parent_checkpoint_id", ProjectedLongText),
    Column("position", Position, nullable=False),
)

langgraph_channel_values = Table(
    "langgraph_channel_values",
    metadata,
    Column("thread_id", ProjectedLongText, primary_key=True),
    Column("checkpoint_ns", ProjectedLongText, primary_key=True),
    Column("channel", ProjectedLongText, primary_key=True),
    Column("version", ProjectedLongText, primary_key=True),  # the version as JSON text
    Column("position", Position, nullable=False),
)

langgraph_writes = Table(
    "langgraph_writes",
    metadata,
    Column("thread_id", ProjectedLongText, primary_key=True),
    Column("checkpoint_ns", ProjectedLongText, primary_key=True),
    Column("checkpoint_id", ProjectedLongText, primary_key=True),
    Column("task_id", ProjectedLongText, primary_key=True),
    Column("idx", Integer, primary_key=True),
    Column("position", Position, nullable=False),
)

PROJECTION_TABLES = (
    runs,
    rollouts,
    llm_calls,
    groups,
    rewards,
    latest_rewards,
    train_steps,
    train_step_groups,
    group_consumptions,
    trajectory_messages,
    langgraph_checkpoints,
    langgraph_channel_values,
    langgraph_writes,
)

# --- coordination of rollout workers (used on PostgreSQL) ----------------------------------
#
# A trainer in workers mode registers its run here and publishes the run's work; workers
# claim it with `SELECT ... FOR UPDATE SKIP LOCKED`. A claim is a lease (`lease_expires_at`,
# renewed by heartbeats) with a fencing token (`token`, +1 at every claim): the write that
# records the end of a rollout or the seal of a group checks the token and the lease in its
# own transaction, so a worker whose lease expired is refused by the database.

# One row per run trained from workers: what workers need to know, and how far training is.
worker_runs = Table(
    "worker_runs",
    metadata,
    Column("run", NAME, primary_key=True),
    Column("model", NAME, nullable=False),  # the trained model, "project/name"
    Column("trainer", NAME, nullable=False),  # host:pid of the trainer that registered last
    # Which database the trainer wrote this in (a copy of the database answers differently).
    Column("database_id", String(200), nullable=False),
    Column("status", String(20), nullable=False),  # open | finished | failed
    Column("policy_step", Integer, nullable=False),  # the model's step now
    Column("next_batch", Integer, nullable=False),  # the batch the trainer trains next
    Column("max_steps_off_policy", Integer, nullable=False),
    # Inference settings per role ("policy", "validation"): name, URL, model name; no keys.
    Column("models", Json, nullable=False),
    Column("reward_function", String(500)),  # module:qualname, when importable by that name
    Column("error", Text),
    Column("updated_at", Timestamp, nullable=False),
)

# One row per rollout a group needs (its slot): open, claimed by a worker, or ended.
rollout_claims = Table(
    "rollout_claims",
    metadata,
    Column("group_id", ID, primary_key=True),
    Column("slot", Integer, primary_key=True),  # policy slots first, then validation
    Column("run", NAME, nullable=False),
    Column("batch", Integer, nullable=False),
    Column("role", String(20), nullable=False),  # policy | validation
    Column("status", String(20), nullable=False),  # open | claimed | finished | failed
    Column("token", BigInteger, nullable=False),  # fencing token
    Column("worker", NAME),  # who holds (or last held) the claim
    Column("rollout_id", ID),  # the rollout of the current (or last) claim
    # The latest rollout of the slot that started: the one its next claim resumes.
    Column("resume_rollout_id", ID),
    Column("attempts", Integer, nullable=False),
    Column("lease_expires_at", Timestamp),
    Column("updated_at", Timestamp, nullable=False),
    Index(None, "run", "status", "batch"),
)

# One row per group: rolling out, ready to seal, being sealed (a lease), sealed or failed.
group_claims = Table(
    "group_claims",
    metadata,
    Column("group_id", ID, primary_key=True),
    Column("run", NAME, nullable=False),
    Column("epoch", Integer, nullable=False),
    Column("batch", Integer, nullable=False),
    Column("scenario_index", Integer, nullable=False),
    Column("status", String(20), nullable=False),  # rolling | sealable | sealing | sealed | failed
    Column("token", BigInteger, nullable=False),  # fencing token of the seal
    Column("worker", NAME),
    Column("lease_expires_at", Timestamp),
    Column("error", Text),  # why the group could not be sealed
    Column("updated_at", Timestamp, nullable=False),
    Index(None, "run", "status", "batch"),
)

COORDINATION_TABLES = (worker_runs, rollout_claims, group_claims)

# --- tokens of `artstore serve` ------------------------------------------------------------
#
# Who may use the server's API and proxy: a token is shown once, when it is made, and only
# its SHA-256 is kept (never in an event: tokens are not history). A run token (`scope`
# read or write) opens the API for one run; a rollout token, made when its rollout starts,
# names that rollout in the base URL its agent calls, and dies when the rollout ends.
# A served rollout is leased to the server process serving it (`lease_expires_at`).
api_tokens = Table(
    "api_tokens",
    metadata,
    Column("token_hash", String(64), primary_key=True),  # sha256 hex of the token
    Column("kind", String(20), nullable=False),  # run | rollout
    Column("scope", String(20), nullable=False),  # read | write
    Column("run", NAME, nullable=False),
    Column("rollout_id", ID),  # the rollout of a rollout token
    Column("created_at", Timestamp, nullable=False),
    Column("expires_at", Timestamp),
    Column("ended_at", Timestamp),  # a rollout token: when its rollout ended
    # A rollout token: until when the server serving its rollout answers for it (renewed
    # while it runs); past it, any server records the rollout as abandoned.
    Column("lease_expires_at", Timestamp),
    Index(None, "rollout_id"),
)
