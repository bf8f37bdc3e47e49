"""ART trajectories, projected from a rollout's `llm.call` events.

The conversations are merged with ART's own rule (`create_messages_from_logs` in
`art/langgraph/llm_wrapper.py`): a call whose input, without tool messages and without a
trailing human message, equals an earlier conversation without its tool messages
continues that conversation; any other call starts a new one. The first conversation
becomes `messages_and_choices`, the others `additional_histories`, each with the tools
of its latest call.

- Calls recorded from LangChain: assistant turns that carried logprobs become trainable
  `Choice` objects, built by ART's own `convert_langgraph_messages`.
- Chat completions recorded from HTTP (an `openai` client, ART's `model.openai_client()`):
  the conversation is what an ART agent builds by hand, `Trajectory(messages_and_choices=
  [system, user])`, then `completion.choices[0]` appended after each call and tool results
  after that, `trajectory.messages()` sent next. Its items are the request's messages as
  sent, each assistant message among them replaced by the `Choice` it came from (the
  first choice of an earlier call of the conversation, matched by content and tool
  calls), and the call's own first `Choice` last, as the client returned it
  (`artstore.documents.exchanges.chat_completion`). The same rule merges them, an
  assistant message equalling the `Choice` it came from.

The two kinds never continue each other's conversations; conversations are in the order
of their first call. A rollout whose calls ART's own capture put in `Trajectory.exchanges`
(ART >= 0.5.20, `art.trajectory(...)`) projects as ART's trajectory does: those exchanges,
rebuilt by ART's `build_exchange` from the stored request and response, and no legacy
histories (ART refuses a trajectory holding both).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)
from pydantic import TypeAdapter, ValidationError
from sqlalchemy.engine import Connection

from artstore.art_api import art_module, trajectory_class
from artstore.art_versions import build_exchange, exchange_trajectory, history_class
from artstore.documents import exchanges as http_documents
from artstore.documents.messages import count_logprobs, from_json
from artstore.eventstore.blobs import StoredBlob, read_stored_blobs
from artstore.eventstore.database import recorder_of
from artstore.eventstore.streams import events_of_streams
from artstore.schema.tables import events

if TYPE_CHECKING:
    import art

logger = logging.getLogger(__name__)


@dataclass
class Call:
    """What ART's logger receives for one call: input messages, output, tools offered.

    `input_hashes` / `output_hash` are the blob hashes the messages were read from (None
    for calls built in memory): equal hashes mean equal messages, which spares the merge
    a deep comparison of logprobs. Messages are LangChain's, or `StoredMessage`s where
    only the projection's rows are made of them (`StoredCalls.rollout(for_rows=True)`).
    """

    input: list[Message]
    output: Message
    tools: list[dict[str, Any]] | None
    input_hashes: list[str] | None = None
    output_hash: str | None = None
    index: int = 0


@dataclass
class HttpCall:
    """A call recorded from HTTP: the request and response documents as stored."""

    index: int
    endpoint: str
    request: dict[str, Any]  # the body as sent, messages and tools in place
    response: dict[str, Any]  # {"json": ...} | {"sse": [...]} | {"text": ...}
    art_exchange: bool
    art_client: str | None
    started_at: str
    finished_at: str | None
    superseded: bool = False  # a LangChain record of the same call replaces it, but
    # ART's exchange is this record's

    @property
    def messages(self) -> list[Any]:
        found = self.request.get("messages")
        return list(found) if isinstance(found, list) else []

    @property
    def tools(self) -> Any:
        return self.request.get("tools")

    def choice(self) -> Any:
        """The first `Choice` the agent got (None when the response holds none)."""
        try:
            completion = http_documents.chat_completion(
                self.response, art_client=self.art_client, request_model=self.request.get("model")
            )
        except Exception as exc:  # never at capture time: the event summarised it
            logger.warning("call %d: its response cannot be rebuilt: %r", self.index, exc)
            return None
        return completion.choices[0] if completion.choices else None

    def exchange(self) -> Any:
        """ART's exchange for this call, as ART's capture built it."""
        return build_exchange(
            self.endpoint,
            self.request,
            http_documents.response_body(self.response),
            start_time=_datetime(self.started_at),
            end_time=_datetime(self.finished_at or self.started_at),
        )


@dataclass
class Conversation:
    """One history: LangChain messages (`kind="langchain"`) or ART items (`"openai"`)."""

    messages: list[Any]
    tools: list[dict[str, Any]] | None
    hashes: list[str | None] | None = None
    kind: str = "langchain"
    first_index: int = 0


class StoredMessage:
    """A LangChain message as its stored document (`message_to_dict`), for the projection.

    The projection needs a message's type for ART's merging rule and a few fields for its
    row, and building LangChain message objects was most of its time. Only documents that
    LangChain would read back unchanged in those fields are kept as documents (`plain`);
    the message object is built when a merge compares two messages by value.
    """

    __slots__ = ("_message", "document", "type")

    def __init__(self, document: dict[str, Any]):
        self.document = document
        self.type: str = document["type"]
        self._message: BaseMessage | None = None

    @property
    def message(self) -> BaseMessage:
        if self._message is None:
            self._message = from_json([self.document])[0]
        return self._message

    @staticmethod
    def plain(document: Any) -> bool:
        """Whether LangChain reads this document back as a message, with its row fields
        as they are: a human, system, ai or tool message (no chunk) with text content;
        every field one of its class, of its type as is (pydantic's strict mode: nothing
        to coerce); an ai message's tool calls complete (name, dict args, id) and nothing
        to derive them from; a tool message's call id text."""
        if not isinstance(document, dict) or not isinstance(data := document.get("data"), dict):
            return False
        kind = document.get("type")
        fields = _PLAIN_FIELDS.get(kind)  # type: ignore[arg-type]
        if (
            fields is None
            or not data.keys() <= fields.keys()
            or data.get("type", kind) != kind
            or not isinstance(data.get("content"), str)
        ):
            return False
        try:
            for name, value in data.items():
                adapter, default = fields[name]
                if type(value) is not type(default) or value != default:  # defaults are valid
                    adapter.validate_python(value, strict=True)
        except ValidationError:
            return False
        if kind == "tool":
            return isinstance(data.get("tool_call_id"), str)
        if kind != "ai":
            return True
        calls = data.get("tool_calls")
        return (
            isinstance(calls, list)
            and all(_plain_tool_call(call) for call in calls)
            and not data.get("invalid_tool_calls")
            and (bool(calls) or not (data.get("additional_kwargs") or {}).get("tool_calls"))
        )


# The fields of each message class a plain document may have (LangChain's own list),
# each with a validator of its type and its default value.
_PLAIN_FIELDS: dict[str, dict[str, tuple[TypeAdapter, Any]]] = {
    kind: {
        name: (TypeAdapter(field.annotation), field.get_default(call_default_factory=True))
        for name, field in cls.model_fields.items()
    }
    for kind, cls in (
        ("human", HumanMessage),
        ("system", SystemMessage),
        ("ai", AIMessage),
        ("tool", ToolMessage),
    )
}


def _plain_tool_call(call: Any) -> bool:
    return (
        isinstance(call, dict)
        and call.keys() <= {"name", "args", "id", "type"}
        and "id" in call
        and isinstance(call.get("name"), str)
        and isinstance(call.get("args"), dict)
        and (call.get("id") is None or isinstance(call.get("id"), str))
        and call.get("type", "tool_call") == "tool_call"
    )


Message = BaseMessage | StoredMessage


def _is_tool(message: Message) -> bool:
    if isinstance(message, StoredMessage):
        return message.type == "tool"
    return isinstance(message, ToolMessage)


def _is_human(message: Message) -> bool:
    if isinstance(message, StoredMessage):
        return message.type == "human"
    return isinstance(message, HumanMessage)


def _as_message(message: Message) -> BaseMessage:
    return message.message if isinstance(message, StoredMessage) else message


def _without_tool_messages(
    messages: list[Message], hashes: list[str | None]
) -> list[tuple[str | None, Message]]:
    return [(h, m) for h, m in zip(hashes, messages, strict=True) if not _is_tool(m)]


def _same(a: list[tuple[str | None, Message]], b: list[tuple[str | None, Message]]) -> bool:
    """`[m for m in a] == [m for m in b]`, deciding by hash where both have one."""
    return len(a) == len(b) and all(
        (ha is not None and ha == hb) or _as_message(ma) == _as_message(mb)
        for (ha, ma), (hb, mb) in zip(a, b, strict=True)
    )


def merge_conversations(calls: Iterable[Call]) -> list[Conversation]:
    """ART's conversation-merging rule (`create_messages_from_logs`), over one rollout's calls."""
    conversations: list[Conversation] = []
    keys: list[list[tuple[str | None, Message]]] = []  # each conversation without tools
    for call in calls:
        input_hashes: list[str | None] = list(call.input_hashes or [None] * len(call.input))
        new_non_tool = _without_tool_messages(call.input, input_hashes)
        if new_non_tool and _is_human(new_non_tool[-1][1]):
            new_non_tool = new_non_tool[:-1]
        for index, existing in enumerate(keys):
            if _same(existing, new_non_tool):
                first = conversations[index].first_index
                break
        else:
            index, first = len(conversations), call.index
            conversations.append(None)  # type: ignore[arg-type]
            keys.append([])
        grown = Conversation(
            [*call.input, call.output],
            call.tools,
            [*input_hashes, call.output_hash],
            first_index=first,
        )
        conversations[index] = grown
        keys[index] = _without_tool_messages(grown.messages, grown.hashes or [])
    return conversations


# --- chat completions recorded from HTTP ------------------------------------------------------


def _is_tool_message(item: Any) -> bool:
    return isinstance(item, dict) and item.get("role") in ("tool", "function")


def _came_from(message: Any, choice: Any) -> bool:
    """True when `message` is the assistant message an agent sends back for `choice`.

    ART's `Trajectory.messages()` turns a Choice into `{"role": "assistant", "content":
    content or "", "tool_calls": [...]}`; agents that build the message themselves differ
    in fields that carry nothing (`refusal: None`, a `None` content): content and tool
    calls decide.
    """
    from openai.types.chat.chat_completion import Choice

    if not isinstance(choice, Choice) or not isinstance(message, dict):
        return False
    if message.get("role") != "assistant" or (message.get("content") or "") != (
        choice.message.content or ""
    ):
        return False
    sent = [
        (
            c.get("id"),
            (c.get("function") or {}).get("name"),
            (c.get("function") or {}).get("arguments"),
        )
        if isinstance(c, dict)
        else None
        for c in message.get("tool_calls") or []
    ]
    given = [
        (
            c.id,
            getattr(c, "function", None) and c.function.name,
            getattr(c, "function", None) and c.function.arguments,
        )
        for c in choice.message.tool_calls or []
    ]
    return sent == given


def _same_items(items: list[Any], messages: list[Any]) -> bool:
    return len(items) == len(messages) and all(
        _came_from(message, item) or item == message
        for item, message in zip(items, messages, strict=True)
    )


def merge_http_conversations(calls: Iterable[HttpCall]) -> list[Conversation]:
    """ART's merging rule over chat completions, on the items an ART agent keeps."""
    conversations: list[Conversation] = []
    keys: list[list[Any]] = []
    for call in calls:
        choice = call.choice()
        if choice is None:
            continue
        messages = call.messages
        new_key = [m for m in messages if not _is_tool_message(m)]
        if new_key and isinstance(new_key[-1], dict) and new_key[-1].get("role") == "user":
            new_key = new_key[:-1]
        for index, key in enumerate(keys):
            if _same_items(key, new_key):
                earlier = conversations[index]
                break
        else:
            index, earlier = len(conversations), None
            conversations.append(None)  # type: ignore[arg-type]
            keys.append([])
        before = earlier.messages if earlier is not None else []
        items = [
            before[position]
            if position < len(before) and _came_from(message, before[position])
            else message
            for position, message in enumerate(messages)
        ]
        items.append(choice)
        tools = call.tools if isinstance(call.tools, list) else None
        first = earlier.first_index if earlier is not None else call.index
        conversations[index] = Conversation(items, tools, kind="openai", first_index=first)
        keys[index] = [item for item in items if not _is_tool_message(item)]
    return conversations


@dataclass
class RolloutCalls:
    """A rollout's successful calls, in order: LangChain ones and HTTP ones."""

    langchain: list[Call]
    http: list[HttpCall]

    def conversations(self) -> list[Conversation]:
        """Every history of the rollout, in the order of its first call."""
        chat = [
            call
            for call in self.http
            if call.endpoint == "chat_completions" and not call.superseded
        ]
        found = merge_conversations(self.langchain) + merge_http_conversations(chat)
        return sorted(found, key=lambda conversation: conversation.first_index)

    def exchanges(self) -> list[tuple[str, Any]]:
        """(endpoint, ART exchange) of the calls ART's own capture took, in order."""
        found = []
        for call in self.http:
            if not call.art_exchange:
                continue
            try:
                found.append((call.endpoint, call.exchange()))
            except Exception as exc:  # ART built it at capture time: not expected
                logger.warning("call %d: ART's exchange cannot be rebuilt: %r", call.index, exc)
        return found


class StoredCalls:
    """The successful LLM calls of some rollouts, as stored: event payloads and blob texts.

    Read with two queries per 500 rollouts (their `llm.call` events, then the distinct
    blobs they name). `calls(rollout_id)` parses one rollout's messages when asked, each
    message once: a rebuild holds one rollout's parsed messages at a time, not all of
    them (thousands of parsed logprob entries kept alive make Python's garbage collector
    the slowest part of a rebuild). A call superseded by a later record of the same call
    is left out (unless ART captured it: its exchange is ART's); calls are in the order
    of their index.
    """

    def __init__(self, by_rollout: dict[str, list[dict[str, Any]]], bodies: dict[str, StoredBlob]):
        self.by_rollout = by_rollout
        self.bodies = bodies

    @classmethod
    def load(cls, connection: Connection, rollout_ids: Iterable[str]) -> StoredCalls:
        """Read (synchronously: inside a write, or through `AsyncConnection.run_sync`)."""
        streams = {f"rollout-{rollout_id}": rollout_id for rollout_id in rollout_ids}
        by_rollout: dict[str, list[dict[str, Any]]] = {
            rollout_id: [] for rollout_id in streams.values()
        }
        stream_ids = list(streams)
        for start in range(0, len(stream_ids), 500):
            query = events_of_streams(
                recorder_of(connection),
                stream_ids[start : start + 500],
                [events.c.stream_id, events.c.data],
                "llm.call",
            )
            for row in connection.execute(query):
                by_rollout[streams[row.stream_id]].append(_as_dict(row.data))
        return cls.of_payloads(connection, by_rollout)

    @classmethod
    def of_payloads(
        cls,
        connection: Connection,
        by_rollout: dict[str, list[dict[str, Any]]],
        blobs_at_hand: Mapping[str, str] | None = None,
    ) -> StoredCalls:
        """From each rollout's `llm.call` payloads in stream order (all of them, already
        at hand: the projection of a batch that started the rollouts); reads the blobs
        (those of `blobs_at_hand` from memory, as `read_stored_blobs` does)."""
        superseded = {
            data["supersedes"]
            for calls in by_rollout.values()
            for data in calls
            if data.get("supersedes")
        }
        kept_by_rollout: dict[str, list[dict[str, Any]]] = {}
        for rollout_id, calls in by_rollout.items():
            kept = []
            for data in calls:
                if not data.get("output") or data.get("error_type"):  # failed: ART never sees them
                    continue
                if data["call_id"] in superseded:
                    if not data.get("art_exchange"):
                        continue
                    data = {**data, "superseded": True}
                kept.append(data)
            kept_by_rollout[rollout_id] = sorted(kept, key=lambda data: data["index"])
        hashes = {
            h
            for calls in kept_by_rollout.values()
            for data in calls
            for h in [*data["input"], data["output"], data.get("tools"), data.get("request")]
            if h
        }
        return cls(kept_by_rollout, read_stored_blobs(connection, sorted(hashes), blobs_at_hand))

    def rollout(self, rollout_id: str, *, for_rows: bool = False) -> RolloutCalls:
        """One rollout's calls, parsed: LangChain messages, HTTP documents.

        `for_rows`: for `message_rows` only (the projection): plain messages are kept as
        their documents (`StoredMessage`), not built as LangChain messages.
        """
        built: dict[str, Any] = {}

        def document(digest: str) -> Any:
            if digest not in built:
                built[digest] = self.bodies[digest].document()
            return built[digest]

        messages: dict[str, Message] = {}

        def message(digest: str) -> Message:
            if digest not in messages:
                found = document(digest)
                messages[digest] = (
                    StoredMessage(found)
                    if for_rows and StoredMessage.plain(found)
                    else from_json([found])[0]
                )
            return messages[digest]

        langchain, http = [], []
        for data in self.by_rollout[rollout_id]:
            if data.get("source") == "http":
                http.append(
                    HttpCall(
                        index=data["index"],
                        endpoint=data.get("endpoint") or "chat_completions",
                        request=http_documents.join_request(
                            document(data["request"]),
                            list(data["input"]),
                            data.get("tools"),
                            {h: document(h) for h in [*data["input"], data.get("tools")] if h},
                        ),
                        response=document(data["output"]),
                        art_exchange=bool(data.get("art_exchange")),
                        art_client=data.get("art_client"),
                        started_at=data["started_at"],
                        finished_at=data.get("finished_at"),
                        superseded=bool(data.get("superseded")),
                    )
                )
                continue
            langchain.append(
                Call(
                    input=[message(h) for h in data["input"]],
                    output=message(data["output"]),  # type: ignore[arg-type]
                    tools=document(data["tools"]) if data.get("tools") else None,
                    input_hashes=list(data["input"]),
                    output_hash=data["output"],
                    index=data["index"],
                )
            )
        return RolloutCalls(langchain, http)

    def calls(self, rollout_id: str) -> list[Call]:
        """One rollout's calls recorded from LangChain, as LangChain messages, in order."""
        return self.rollout(rollout_id).langchain


def load_calls(connection: Connection, rollout_ids: Iterable[str]) -> dict[str, RolloutCalls]:
    """The successful LLM calls of each rollout, parsed."""
    stored = StoredCalls.load(connection, rollout_ids)
    return {rollout_id: stored.rollout(rollout_id) for rollout_id in stored.by_rollout}


def _as_dict(data: Any) -> dict[str, Any]:
    return data if isinstance(data, dict) else json.loads(data)


def _datetime(value: Any) -> datetime:
    return value if isinstance(value, datetime) else datetime.fromisoformat(value)


def build_trajectory(
    calls: RolloutCalls,
    *,
    reward: float = 0.0,
    metrics: dict[str, float | int | bool] | None = None,
    metadata: dict[str, Any] | None = None,
    logs: list[str] | None = None,
    policy_step: int | None = None,
) -> art.Trajectory:
    """An `art.Trajectory` with trainable `Choice`s (or ART's exchanges), as ART builds it."""
    fields: dict[str, Any] = {
        "reward": reward,
        "metrics": dict(metrics or {}),
        "metadata": dict(metadata or {}),
        "logs": list(logs or []),
        "initial_policy_version": policy_step,
        "final_policy_version": policy_step,
    }
    exchanges = calls.exchanges()
    if exchanges:
        return exchange_trajectory(exchanges, **fields)
    return legacy_trajectory(calls.conversations(), **fields)


def legacy_trajectory(conversations: list[Conversation], **fields: Any) -> art.Trajectory:
    """`messages_and_choices`, `tools` and `additional_histories` from the conversations."""
    convert_langgraph_messages = art_module("langgraph.message_utils").convert_langgraph_messages
    Trajectory = trajectory_class()
    history = history_class()  # LegacyHistory on ART >= 0.5.20

    histories = []
    for index, conversation in enumerate(conversations):
        if conversation.kind == "openai":
            converted = conversation.messages
        else:
            try:
                converted = convert_langgraph_messages(conversation.messages)
            except Exception as exc:  # ART skips a conversation it cannot convert; so do we
                logger.warning("conversation %d left out, as ART leaves it: %r", index, exc)
                continue
        histories.append((converted, conversation.tools, conversation.kind))
    if not histories:
        return Trajectory(messages_and_choices=[], **fields)
    (main, tools, kind), *others = histories
    if (
        kind == "openai"
    ):  # as an ART agent builds it: Trajectory(messages_and_choices=..., tools=...)
        trajectory = Trajectory(messages_and_choices=main, tools=tools, **fields)
    else:  # as ART's create_messages_from_logs builds it: assigned, not validated
        trajectory = Trajectory(messages_and_choices=[], **fields)
        trajectory.messages_and_choices = main
        trajectory.tools = tools  # type: ignore[assignment]
    # Both build additional histories with the History constructor.
    trajectory.additional_histories = [
        history(messages_and_choices=items, tools=item_tools)  # type: ignore[arg-type]
        for items, item_tools, _ in others
    ]
    return trajectory


_ROLES = {"human": "user", "ai": "assistant", "system": "system", "tool": "tool"}


def message_rows(rollout_id: str, conversations: list[Conversation]) -> list[dict[str, Any]]:
    """Rows of `trajectory_messages`: one per message of every history of the trajectory."""
    rows = []
    for history_index, conversation in enumerate(conversations):
        for message_index, message in enumerate(conversation.messages):
            row = _item_row(message) if conversation.kind == "openai" else _langchain_row(message)
            rows.append(
                {
                    "rollout_id": rollout_id,
                    "history_index": history_index,
                    "message_index": message_index,
                    **row,
                }
            )
    return rows


def _langchain_row(message: Message) -> dict[str, Any]:
    if isinstance(message, StoredMessage):
        return _document_row(message)
    num_logprobs = count_logprobs(message) if isinstance(message, AIMessage) else 0
    content = message.content
    return {
        "role": _ROLES.get(message.type, message.type),
        "content": content if isinstance(content, str) else json.dumps(content),
        "trainable": num_logprobs > 0,
        "tool_calls": [
            {"id": c.get("id"), "name": c["name"], "args": c.get("args")}
            for c in getattr(message, "tool_calls", None) or []
        ]
        or None,
        "tool_call_id": getattr(message, "tool_call_id", None),
        "num_logprobs": num_logprobs,
    }


def _document_row(message: StoredMessage) -> dict[str, Any]:
    """`_langchain_row` of a plain document, read from the document itself."""
    data = message.document["data"]
    num_logprobs = 0
    if message.type == "ai":
        logprobs = (data.get("response_metadata") or {}).get("logprobs") or {}
        num_logprobs = len(logprobs.get("content") or []) if isinstance(logprobs, dict) else 0
    return {
        "role": _ROLES[message.type],
        "content": data["content"],
        "trainable": num_logprobs > 0,
        "tool_calls": [
            {"id": c.get("id"), "name": c["name"], "args": c.get("args")}
            for c in data.get("tool_calls") or []
        ]
        or None,
        "tool_call_id": data.get("tool_call_id"),
        "num_logprobs": num_logprobs,
    }


def _item_row(item: Any) -> dict[str, Any]:
    """A row for an item of an ART history: a message dict, or a `Choice`."""
    from openai.types.chat.chat_completion import Choice

    if isinstance(item, Choice):
        logprobs = item.logprobs
        num_logprobs = len((logprobs.content or []) + (logprobs.refusal or [])) if logprobs else 0
        summary = http_documents.call_summary_of_choice(item)
        return {
            "role": "assistant",
            "content": item.message.content,
            "trainable": num_logprobs > 0,
            "tool_calls": summary or None,
            "tool_call_id": None,
            "num_logprobs": num_logprobs,
        }
    message = item if isinstance(item, dict) else {}
    content = message.get("content")
    return {
        "role": str(message.get("role") or "user"),
        "content": content if content is None or isinstance(content, str) else json.dumps(content),
        "trainable": False,
        "tool_calls": [_tool_call(call) for call in message.get("tool_calls") or []] or None,
        "tool_call_id": message.get("tool_call_id"),
        "num_logprobs": 0,
    }


def _tool_call(call: Any) -> dict[str, Any]:
    function = call.get("function") or {} if isinstance(call, dict) else {}
    return {
        "id": call.get("id") if isinstance(call, dict) else None,
        "name": function.get("name"),
        "args": http_documents.parse_arguments(function.get("arguments")),
    }
