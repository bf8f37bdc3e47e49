"""Every event type artstore writes, declared once.

An event is an immutable fact. Its payload is a pydantic model serialised to JSON (never
pickle); its envelope (id, stream, version, global position) belongs to the store. The
`event_id` is made by the client when the event object is created, so that retrying an
append with the same objects writes nothing twice.

Streams:

- `run-<run>`: run started / resumed / finished (or `run.imported`, once per import);
- `rollout-<rollout id>`: rollout started, one `llm.call` per LLM call, finished or failed
  (an imported rollout ends with `trajectory.imported` instead of having LLM calls; a
  trajectory a loop built itself is `trajectory.recorded`, just before `rollout.finished`);
- `group-<group id>`: rewards per scorer, group sealed;
- `train-<run>`: train step started / completed / failed / reconciled, checkpoint pushed;
- `langgraph-<thread id>`: a LangGraph thread's checkpoints and pending writes
  (`artstore.langgraph.checkpointer`), and `langgraph.thread_deleted`;
- `feedback-<rollout id>`: a person's judgements of the rollout (`feedback`), one each;
- `dataset-<name>`: the versions of a dataset (`dataset.created`), version N is event N;
- `datasets`: one `dataset.named` per version made, so that the names can be listed;
- `archive-<run>`: `run.archived` when `artstore archive` moved the run out of the
  database, `run.restored` when `artstore restore` brought it back.
"""

from __future__ import annotations

import os
import time
import uuid
from datetime import datetime
from typing import Any, ClassVar, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from artstore.errors import InvalidEventError, UnknownEventTypeError

JSONValue = Any  # anything `json.dumps` accepts; checked when the event is encoded


def new_id() -> str:
    """A random UUID (version 4): the ids users see and type (rollouts, groups, calls).

    Random from the first character, so that the first few characters of an id name one
    rollout (`artstore trajectory 3f2a9c1e`); a time-ordered id would share its first
    eight characters with every id made in the same minute.
    """
    return str(uuid.uuid4())


def new_event_id() -> str:
    """A UUID version 7 (RFC 9562) for an event: Unix time in milliseconds, 74 random bits.

    Time-ordered, so that the unique index on `events.event_id` takes a new id on its last
    page instead of on a random one: with random (version 4) ids a commit of 100 events
    rewrote ~100 index pages, now it rewrites one or two. Still 36 characters, still
    unique (74 random bits per millisecond), still a valid UUID. Nobody types an event id.
    """
    millis = f"{time.time_ns() // 1_000_000:012x}"  # unix_ts_ms: 48 bits
    random = os.urandom(10).hex()  # 80 bits, of which 74 are used
    variant = "89ab"[int(random[3], 16) & 3]  # the bits 10, then 2 random bits
    return f"{millis[:8]}-{millis[8:]}-7{random[:3]}-{variant}{random[4:7]}-{random[7:19]}"


class Event(BaseModel):
    """Base of every event payload. Subclasses declare `type` and register themselves."""

    # NaN and the infinities stay floats when dumped (pydantic would write null where a
    # field takes any JSON), so that the store refuses them wherever they are.
    model_config = ConfigDict(extra="forbid", frozen=True, ser_json_inf_nan="constants")

    type: ClassVar[str]
    # Client-made, excluded from the payload: the store keeps it in the envelope.
    event_id: str = Field(default_factory=new_event_id, exclude=True)


EVENT_TYPES: dict[str, type[Event]] = {}

E = TypeVar("E", bound=type[Event])


def event_type(name: str):
    """Declare an event type under `name` (also for users' own event types)."""

    def register(cls: E) -> E:
        if name in EVENT_TYPES and EVENT_TYPES[name] is not cls:
            raise ValueError(f"event type {name!r} is declared twice")
        cls.type = name
        EVENT_TYPES[name] = cls
        return cls

    return register


def decode_event(type_name: str, data: dict[str, Any], event_id: str | None = None) -> Event:
    """Rebuild a typed event from what the store holds."""
    cls = EVENT_TYPES.get(type_name)
    if cls is None:
        raise UnknownEventTypeError(
            f"unknown event type {type_name!r}: this artstore does not declare it "
            "(written by a newer artstore, or a custom type not imported here)"
        )
    try:
        return cls.model_validate({**data, "event_id": event_id or new_event_id()})
    except ValidationError as exc:
        raise InvalidEventError(f"stored {type_name!r} event does not validate: {exc}") from None


# --- runs -------------------------------------------------------------------------------


@event_type("run.started")
class RunStarted(Event):
    run: str
    project: str
    model: str  # the trained model's name
    base_model: str | None = None
    config: dict[str, JSONValue]
    scenarios: list[JSONValue]
    validation_model: str | None = None
    scorer: str
    trainer: str  # host:pid of the process that trains


@event_type("run.resumed")
class RunResumed(Event):
    run: str
    trainer: str
    at_step: int
    config: dict[str, JSONValue] | None = None  # when the epochs changed


@event_type("run.finished")
class RunFinished(Event):
    run: str
    status: Literal["finished", "failed"] = "finished"
    error: str | None = None


# --- rollouts ---------------------------------------------------------------------------


@event_type("rollout.started")
class RolloutStarted(Event):
    rollout_id: str
    run: str | None = None
    group_id: str | None = None
    scenario: JSONValue = None
    scenario_index: int | None = None
    model: str
    role: Literal["policy", "validation"] = "policy"
    policy_step: int | None = None
    inference_model_name: str | None = None
    inference_base_url: str | None = None
    started_at: datetime
    # The earlier attempt (a rollout that did not finish) whose recorded calls this one
    # replays (`artstore.capture.replay`).
    resumes: str | None = None


@event_type("llm.call")
class LLMCall(Event):
    """One call of an LLM inside a rollout.

    Two sources record calls (`source`):

    - `langchain`: a LangChain chat model (artstore's or ART's `init_chat_model`, or
      `rollout.record_llm_call`). `input` and `output` are messages in LangChain's own JSON
      serialisation (`message_to_dict`).
    - `http`: an OpenAI-compatible HTTP request made through httpx (an `openai` client,
      ART's `model.openai_client()`, LangChain's `ChatOpenAI` outside `init_chat_model`),
      recorded from its bytes. `endpoint` says which API; `input` holds the request's
      `messages` (each as sent), `tools` its `tools`, `request` the rest of the body (its
      `messages` and `tools` values replaced by their hashes, keys in order), `output` the
      response as received (`{"json": ...}`, or `{"sse": [[event, data], ...]}` streamed,
      or `{"text": ...}` when the body is not JSON).

    Every message, the tool list, the request and the response are content-addressed
    blobs referenced here by hash: the output of one turn is an input of the next, and a
    growing conversation costs linear storage. What SQL wants of the output is copied
    here. A `langchain` call that records again a call already recorded from HTTP (ART's
    `init_chat_model` logs its calls after they were sent) names it in `supersedes` and
    takes its `index`: projections show the later record only.
    """

    call_id: str
    index: int  # order of the call within the rollout
    input: list[str]  # blob hashes of the input messages
    # blob hash of the output (see above). A failed call: None, or for `http` what arrived
    # (the error body the server sent, a stream's events until it broke off).
    output: str | None = None
    tools: str | None = None  # blob hash of the OpenAI tool list offered
    model: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    latency_s: float | None = None
    finish_reason: str | None = None
    tool_calls: list[dict[str, JSONValue]] = []  # [{"id", "name", "args"}] the model asked for
    num_logprobs: int = 0  # tokens of the output that carry logprobs (0: not trainable)
    error_type: str | None = None
    error_message: str | None = None
    started_at: datetime
    source: Literal["langchain", "http"] = "langchain"
    endpoint: Literal["chat_completions", "completions", "responses", "messages"] | None = None
    request: str | None = None  # http: blob hash of the request body (see above)
    # http, and a record superseding one: the response was streamed (server-sent events)
    stream: bool = False
    finished_at: datetime | None = None  # http: when the response was complete
    # http, and a record superseding one: ART's own capture put it in `Trajectory.exchanges`
    art_exchange: bool = False
    art_client: str | None = None  # http: ART's `model.openai_client()` post-processed it
    supersedes: str | None = None  # call id of the `http` record of this same call
    # A call served from an earlier attempt's record (`artstore.capture.replay`): that
    # record's call id; every other field is the recorded call's (its output, logprobs).
    replayed_from: str | None = None


@event_type("llm.replay_diverged")
class ReplayDiverged(Event):
    """A resumed rollout's request differed from the one its earlier attempt recorded at
    that position: that call and every later one went to the inference server."""

    rollout_id: str
    resumes: str  # the earlier attempt
    index: int  # the position of the call that differed
    recorded_call_id: str | None  # the earlier attempt's call there (None: a call it lacks)
    recorded_fingerprint: str | None
    fingerprint: str  # of the request the agent sent
    # The request's top-level fields that differ from the recorded one's (`messages`,
    # `model`, `temperature`, ...): names only, never a value.
    differs: list[str] = []


@event_type("tool.called")
class ToolCalled(Event):
    """A tool's result, recorded by `artstore.recorded_tool` (`artstore.capture.tools`) and
    served back instead of running the tool again when a resumed rollout calls it the same."""

    call_id: str
    index: int  # order among the rollout's recorded tool calls
    name: str
    fingerprint: str  # of the name and the arguments (`artstore.capture.tools`)
    arguments: JSONValue = None
    result: JSONValue = None
    error_type: str | None = None  # the tool raised: it runs again on replay
    error_message: str | None = None
    replayed_from: str | None = None  # a result served from the earlier attempt's record


@event_type("rollout.finished")
class RolloutFinished(Event):
    rollout_id: str
    result: JSONValue = None
    duration_s: float
    metrics: dict[str, float | int | bool] = {}
    metadata: dict[str, float | int | str | bool | None] = {}
    logs: list[str] = []


@event_type("rollout.failed")
class RolloutFailed(Event):
    rollout_id: str
    error_type: str
    error_message: str
    traceback: str
    duration_s: float


# --- groups and rewards -----------------------------------------------------------------


@event_type("group.sealed")
class GroupSealed(Event):
    """A group is complete and may be trained: its rollouts and their rewards exist."""

    group_id: str
    run: str | None = None
    epoch: int | None = None
    batch: int | None = None  # index of the batch (train step) within the run
    scenario_index: int | None = None
    rollout_ids: list[str]
    validation_rollout_ids: list[str] = []
    failed_rollout_ids: list[str] = []
    metadata: dict[str, float | int | str | bool | None] = {}
    # Sealed from an `art.TrajectoryGroup` a loop built: blob hash of the group's own
    # metadata, metrics, logs and exceptions, as the group held them (key order kept).
    art_group: str | None = None


@event_type("rewards.recorded")
class RewardsRecorded(Event):
    """Rewards of a group's rollouts by one scorer. Re-scoring appends another."""

    group_id: str
    scorer: str
    rewards: dict[str, float]  # rollout id -> reward
    metrics: dict[str, dict[str, float | int | bool]] = {}  # rollout id -> metrics
    rescored: bool = False


@event_type("feedback")
class Feedback(Event):
    """A person's judgement of a rollout, or of one of its LLM calls (`call_index`).

    A score of the whole rollout is a reward by the scorer `human:<name>` (projected into
    `rewards` under the rollout's group); a call's score, a label and a comment are kept
    here only. Immutable: a second judgement is another event, and the latest score wins.
    """

    rollout_id: str
    name: str  # who judged: the scorer is `human:<name>`
    group_id: str | None = None  # the rollout's group when it was judged
    call_index: int | None = None
    score: float | None = None
    label: str | None = None
    comment: str | None = None


@event_type("dataset.created")
class DatasetCreated(Event):
    """A version of a dataset: the exact rollouts it holds, frozen.

    `digest`: SHA-256 over each rollout's id, its events' ids and the rewards by the
    scorer that chose it (see `artstore.datasets.selection`), so that what it holds can be
    checked later. `selection`: the options that chose the rollouts, as given.
    """

    name: str
    version: int
    rollout_ids: list[str]
    digest: str
    run: str | None = None
    scorer: str | None = None
    rewards: dict[str, float] = {}  # rollout id -> reward by `scorer` when chosen
    selection: dict[str, JSONValue] = {}


@event_type("dataset.named")
class DatasetNamed(Event):
    """The index of datasets (stream `datasets`): a version of `name` was made, in the same
    transaction as its `dataset.created`."""

    name: str
    version: int


# --- training ---------------------------------------------------------------------------


@event_type("train_step.started")
class TrainStepStarted(Event):
    run: str
    model: str  # the trained model, "project/name"
    step: int  # the model's step before training
    group_ids: list[str]
    scorer: str
    trainer: str


@event_type("train_step.completed")
class TrainStepCompleted(Event):
    """Recorded in the same transaction as the consumption of its groups (invariant 4)."""

    run: str
    model: str
    step: int  # the step after training (`TrainResult.step`)
    group_ids: list[str]
    scorer: str
    metrics: dict[str, float] = {}
    duration_s: float | None = None
    checkpoint: str | None = None
    reconciled: bool = False  # True when recovered from the backend's step after a crash


@event_type("train_step.failed")
class TrainStepFailed(Event):
    run: str
    model: str
    step: int
    group_ids: list[str]
    error_type: str
    error_message: str


@event_type("checkpoint.pushed")
class CheckpointPushed(Event):
    run: str
    model: str
    step: int
    destination: str | None = None


# --- archives (`artstore archive` / `artstore restore`, stream `archive-<run>`) -----------


@event_type("run.archived")
class RunArchived(Event):
    """The run's streams and the blobs nothing else names were written to `target`, read
    back, and removed from the database in this event's transaction (the one deletion
    artstore makes). `manifest_sha256`: the SHA-256 of the archive's manifest."""

    run: str
    target: str  # where the archive is, as given (a password in a URL left out)
    manifest_sha256: str
    num_events: int
    num_blobs: int  # blobs the archive holds (those still named elsewhere stay stored too)


@event_type("run.restored")
class RunRestored(Event):
    """The run's events and blobs were brought back from `source`, in this transaction."""

    run: str
    source: str
    manifest_sha256: str
    num_events: int


# --- imports (`artstore import`: trajectories recorded elsewhere) ----------------------------


@event_type("run.imported")
class RunImported(Event):
    """Trajectories of `run` were imported from a file (one event per import of a source)."""

    run: str
    project: str
    model: str
    base_model: str | None = None
    validation_model: str | None = None
    scorer: str
    config: dict[str, JSONValue] = {}
    source: Literal["parquet", "jsonl", "atif", "otlp"]
    path: str  # what was imported, as given


class ImportedHistory(BaseModel):
    """One history of an imported or recorded trajectory, its items as content-addressed blobs."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    items: list[str]  # blob hashes: each a message dict or a Choice's JSON dump
    choices: list[int] = []  # positions of `items` rebuilt as openai `Choice` objects
    trainable: list[int] = []  # positions the source marked trainable (ART's parquet flag)
    tools: str | None = None  # blob hash of the tool list


@event_type("trajectory.imported")
class TrajectoryImported(Event):
    """The trajectory of an imported rollout, exactly as it was (it has no `llm.call`).

    Follows the rollout's `rollout.finished` (or `rollout.failed`) in its stream.
    `histories[0]` is `messages_and_choices`, the others `additional_histories`.
    `exchanges` is ART's `Trajectory.exchanges` (ART >= 0.5.20: the raw request and response
    of each LLM call ART captured), kept as the source held it; such a trajectory has no
    other history.
    """

    rollout_id: str
    source: Literal["parquet", "jsonl", "atif", "otlp"]
    path: str
    histories: list[ImportedHistory]
    exchanges: str | None = None  # blob hash of the exchanges' JSON (None: none captured)
    initial_policy_version: int | None = None
    final_policy_version: int | None = None
    split: str | None = None  # parquet: `trajectories/<split>/<step>.parquet`
    step: int | None = None
    group_index: int | None = None


# --- trajectories a loop built (record_group, the recording backend, PipelineTrainer) ----


@event_type("trajectory.recorded")
class TrajectoryRecorded(Event):
    """An `art.Trajectory` a loop built itself, stored whole and exactly.

    Comes just before the rollout's `rollout.finished`, so a finished rollout always has
    it. `histories[0]` is `messages_and_choices` (Choice objects whole, logprobs included),
    the others `additional_histories`, each with its tools. Blobs keep key order: what
    the trajectory held comes back as it was, dict for dict.
    """

    rollout_id: str
    histories: list[ImportedHistory]
    exchanges: str | None = None  # blob: `Trajectory.exchanges` (ART >= 0.5.20) as JSON
    details: str  # blob: {"metrics", "metadata", "logs"} of the trajectory, in its order
    reward: float  # the trajectory's reward when it was recorded (scored rewards: groups)
    initial_policy_version: int | None = None
    final_policy_version: int | None = None
    start_time: str | None = None  # `Trajectory.start_time`, ISO 8601 as it was


# --- LangGraph checkpoints (artstore.langgraph.checkpointer) -------------------------------
#
# A value LangGraph's serializer wrote (`serde.dumps_typed`: a type and bytes, never
# pickle) is kept as `[type, base64]` (`[type, base64, "zlib"]` when compressed) in the
# payload when small, or as `{"blob": hash}` naming a blob whose text is that list when
# large; a list longer than `CHUNK_ITEMS` as `{"chunks": [...]}`, each chunk of items a
# blob's hash or a small chunk's `[type, base64]`. `None`: the channel was emptied.


@event_type("langgraph.checkpoint")
class LangGraphCheckpoint(Event):
    """A checkpoint `put` stored: the state of a thread's graph after a super-step.

    `checkpoint` is the checkpoint without its channel values (`{"json": ...}` where JSON
    holds it exactly, else `{"typed": [type, base64]}`), `metadata` likewise; `values`
    holds the channels of `versions` (LangGraph's `new_versions`) only: a channel whose
    version did not change is read from the checkpoint that wrote that version.
    """

    thread_id: str
    checkpoint_ns: str = ""
    checkpoint_id: str
    parent_checkpoint_id: str | None = None
    checkpoint: dict[str, JSONValue]
    metadata: dict[str, JSONValue]
    versions: dict[str, JSONValue] = {}  # channel -> its new version
    values: dict[str, JSONValue] = {}  # channel -> its value at that version (None: empty)
    rollout_id: str | None = None  # the rollout that was current, if any


@event_type("langgraph.writes")
class LangGraphWrites(Event):
    """Pending writes of one task against a checkpoint (`put_writes`).

    `writes` is `[[index, channel, value], ...]`, each index as LangGraph's `WRITES_IDX_MAP`
    gives it (negative for errors, interrupts, ...). A regular write already stored for
    (task, index) is kept; a special one (negative index) is replaced by the newer.
    """

    thread_id: str
    checkpoint_ns: str = ""
    checkpoint_id: str
    task_id: str
    task_path: str = ""
    writes: list[list[JSONValue]]
    rollout_id: str | None = None


@event_type("langgraph.thread_deleted")
class LangGraphThreadDeleted(Event):
    """`delete_thread`: the thread's earlier checkpoints and writes are hidden from reads.

    The log is immutable, so they stay in it; the checkpointer's tables drop them, and a
    rebuild of the projections drops them again. Later checkpoints of the same thread id
    start a new history.
    """

    thread_id: str


def encode_event(event: Event) -> tuple[str, dict[str, Any]]:
    """The (type, JSON payload) of an event, refusing anything the store cannot keep."""
    cls = type(event)
    if EVENT_TYPES.get(getattr(cls, "type", "")) is not cls:
        raise UnknownEventTypeError(
            f"{cls.__name__} is not a declared event type (use @artstore.events.event_type)"
        )
    try:
        return cls.type, event.model_dump(mode="json")
    except Exception as exc:  # pydantic raises several kinds for non-JSON values
        raise InvalidEventError(f"{cls.type!r} event is not JSON-serializable: {exc}") from None
