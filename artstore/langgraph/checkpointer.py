"""`checkpointer(store)`: LangGraph's checkpoint saver on artstore's event log.

    graph = builder.compile(checkpointer=artstore.langgraph.checkpointer(store))

Every `put` is a `langgraph.checkpoint` event and every `put_writes` a `langgraph.writes`
event in the thread's stream (`langgraph-<thread id>`), immutable like every other event;
each names the rollout that was current when it was written (`rollout_id`). Values are
serialized with LangGraph's own serializer (`JsonPlusSerializer`: msgpack, never pickle),
zlib-compressed from `COMPRESS_FROM_BYTES` on where that pays; a small value is kept in
the event, a large one (over `INLINE_BYTES` of base64) in a blob, and a long list (a
conversation's messages) in chunks of `CHUNK_ITEMS`, each in a content-addressed blob, so
that a full chunk is stored once however many checkpoints hold it. A
checkpoint stores the channels that changed (`new_versions`) only: an unchanged channel
is read from the checkpoint that wrote its version, as LangGraph's PostgreSQL saver does.

Reads go through three projection tables (`artstore.projections.checkpoints`) that say
which event holds each checkpoint, channel value and write: a read is a few lookups by
key whatever the length of the thread. `delete_thread` appends `langgraph.thread_deleted`,
which hides the thread's earlier checkpoints and writes from every read; the events stay
in the log, and a rebuild of the projections hides them again.

The async methods run on the store's event loop. The sync ones (`graph.invoke`) may be
called from any other thread: they run the async method on the loop the checkpointer was
made on and wait for it. Called on that loop's own thread they would wait for themselves,
and raise instead.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import zlib
from collections.abc import AsyncIterator, Coroutine, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    get_checkpoint_id,
    get_checkpoint_metadata,
    writes_sort_key,
)
from langgraph.checkpoint.serde.base import SerializerProtocol
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from sqlalchemy import Integer, Text, and_, bindparam, cast, null, select, tuple_, union_all
from sqlalchemy.engine import Connection

from artstore.capture.rollout import current_rollout
from artstore.errors import ConfigurationError, InvalidArgumentError
from artstore.events import LangGraphCheckpoint, LangGraphThreadDeleted, LangGraphWrites
from artstore.eventstore.blobs import blob_hash, blob_json, load_payload, read_blob_texts
from artstore.langgraph.decoded import DecodedBlobs, Kept
from artstore.projections.checkpoints import thread_stream, version_key
from artstore.redaction import known_secrets
from artstore.schema import tables as t

if TYPE_CHECKING:
    from artstore.store import Store

T = TypeVar("T")

# A serialized value up to this many bytes is kept in its event; a larger one in a blob.
INLINE_BYTES = 2048
# A list longer than this (a conversation's messages) is kept in chunks of this many items,
# each a content-addressed blob: a conversation that grows by a message a step stores its
# full chunks once, not once per checkpoint, and is read back in a few blobs.
CHUNK_ITEMS = 16
# A serialized value this large or larger is kept zlib-compressed where that saves at
# least a tenth: conversations compress to a third, and base64 adds a third back.
COMPRESS_FROM_BYTES = 512
# How many compressed values a saver remembers by the SHA-256 of their serialized bytes:
# a conversation's full chunks are serialized again at every step (LangGraph hands over
# the whole list), and compressing them again cost as much as serializing them.
COMPRESSED_KEPT = 4096
# How many characters of blob texts a saver keeps for its reads: blobs are content-
# addressed (the text is what its hash names, forever), so a chunk written or read once
# is not read from the database again.
BLOB_TEXT_CHARS_KEPT = 32 * 2**20
# How many bytes of decoded blob values a saver keeps (`artstore.langgraph.decoded`): a
# get hands out copies of them, where decoding them again cost most of its time. A chunk
# of 16 messages of ~300 characters takes ~7 KB.
DECODED_BYTES_KEPT = 16 * 2**20
# A value kept in its event (a conversation's last, partial chunk) is kept decoded too, by
# its stored text, from this many characters: the latest checkpoint is read again and
# again between two steps, and a smaller value decodes faster than it is looked up.
DECODED_INLINE_FROM_CHARS = 512

_CHECKPOINTS = t.langgraph_checkpoints
_VALUES = t.langgraph_channel_values
_WRITES = t.langgraph_writes
_EVENTS = t.events


def checkpointer(store: Store, *, serde: SerializerProtocol | None = None) -> EventLogSaver:
    """A LangGraph checkpoint saver that keeps checkpoints in `store`'s event log.

    `serde`: LangGraph's serializer (default: `JsonPlusSerializer()`); one that falls back
    to pickle is refused. Make it on the event loop the store was opened on.
    """
    return EventLogSaver(store, serde=serde)


class EventLogSaver(BaseCheckpointSaver[str]):
    """`BaseCheckpointSaver` over artstore's event log (see the module's docstring)."""

    def __init__(self, store: Store, *, serde: SerializerProtocol | None = None) -> None:
        if getattr(serde, "pickle_fallback", False):
            raise InvalidArgumentError(
                "serde", "falls back to pickle; artstore stores JSON and msgpack only"
            )
        super().__init__(serde=serde or JsonPlusSerializer())
        self.store = store
        self._compressed = _Kept(COMPRESSED_KEPT)  # typed forms by their bytes' SHA-256
        self._blob_texts = _BlobTexts(BLOB_TEXT_CHARS_KEPT)
        self._decoded = DecodedBlobs(DECODED_BYTES_KEPT)
        try:
            self._loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            self._loop = None  # taken from the first async call

    # --- writing ------------------------------------------------------------------------

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        self._remember_loop()
        configurable = config["configurable"]
        thread_id = str(configurable["thread_id"])
        checkpoint_ns = configurable.get("checkpoint_ns", "")
        skeleton = dict(checkpoint)
        values = skeleton.pop("channel_values")
        blobs: dict[str, str] = {}
        event = LangGraphCheckpoint(
            thread_id=thread_id,
            checkpoint_ns=checkpoint_ns,
            checkpoint_id=checkpoint["id"],
            parent_checkpoint_id=configurable.get("checkpoint_id"),
            checkpoint=self._document(skeleton),
            metadata=self._document(get_checkpoint_metadata(config, metadata)),
            versions=dict(new_versions),
            values={
                channel: self._value(values[channel], blobs) if channel in values else None
                for channel in new_versions
            },
            rollout_id=_current_rollout_id(),
        )
        await self.store.append(thread_stream(thread_id), [event], blobs=blobs)
        self._blob_texts.add(blobs)
        return {
            "configurable": {
                "thread_id": thread_id,
                "checkpoint_ns": checkpoint_ns,
                "checkpoint_id": checkpoint["id"],
            }
        }

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        self._remember_loop()
        if not writes:
            return
        configurable = config["configurable"]
        thread_id = str(configurable["thread_id"])
        blobs: dict[str, str] = {}
        event = LangGraphWrites(
            thread_id=thread_id,
            checkpoint_ns=configurable.get("checkpoint_ns", ""),
            checkpoint_id=configurable["checkpoint_id"],
            task_id=task_id,
            task_path=task_path,
            writes=[
                [WRITES_IDX_MAP.get(channel, index), channel, self._value(value, blobs)]
                for index, (channel, value) in enumerate(writes)
            ],
            rollout_id=_current_rollout_id(),
        )
        await self.store.append(thread_stream(thread_id), [event], blobs=blobs)
        self._blob_texts.add(blobs)

    async def adelete_thread(self, thread_id: str) -> None:
        self._remember_loop()
        thread_id = str(thread_id)
        await self.store.append(
            thread_stream(thread_id), [LangGraphThreadDeleted(thread_id=thread_id)]
        )

    # --- reading ------------------------------------------------------------------------

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        self._remember_loop()
        configurable = config["configurable"]
        thread_id = str(configurable["thread_id"])
        checkpoint_ns = configurable.get("checkpoint_ns", "")
        checkpoint_id = get_checkpoint_id(config)
        parameters = {"thread_id": thread_id, "checkpoint_ns": checkpoint_ns}
        if checkpoint_id:
            parameters["checkpoint_id"] = checkpoint_id
        statement = _ONE_BY_ID if checkpoint_id else _LATEST

        def read(c: Connection) -> _Row | None:
            return _read_one(c, statement, parameters, self._load_document, self._known)

        row = await self.store.database.run_lookup(read)  # blobs and events never change
        if row is None:
            return None
        self._blob_texts.add(row.blobs)
        return self._tuple(row)

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        self._remember_loop()
        query = _select_checkpoints()
        configurable = (config or {}).get("configurable", {})
        if "thread_id" in configurable:
            query = query.where(_CHECKPOINTS.c.thread_id == str(configurable["thread_id"]))
        if configurable.get("checkpoint_ns") is not None:
            query = query.where(_CHECKPOINTS.c.checkpoint_ns == configurable["checkpoint_ns"])
        if checkpoint_id := configurable.get("checkpoint_id"):
            query = query.where(_CHECKPOINTS.c.checkpoint_id == checkpoint_id)
        if before is not None and (before_id := get_checkpoint_id(before)):
            query = query.where(_CHECKPOINTS.c.checkpoint_id < before_id)
        # Newest first, as LangGraph's savers list them (checkpoint ids grow with time).
        query = query.order_by(_CHECKPOINTS.c.checkpoint_id.desc())
        for found in await self._read(query, filter or None, limit):
            yield found

    # --- sync: the async methods, run on the store's loop --------------------------------

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return self._wait(self.aget_tuple(config))

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        async def collect() -> list[CheckpointTuple]:
            listed = self.alist(config, filter=filter, before=before, limit=limit)
            return [found async for found in listed]

        return iter(self._wait(collect()))

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        return self._wait(self.aput(config, checkpoint, metadata, new_versions))

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        self._wait(self.aput_writes(config, writes, task_id, task_path))

    def delete_thread(self, thread_id: str) -> None:
        self._wait(self.adelete_thread(thread_id))

    def _remember_loop(self) -> None:
        if self._loop is None:
            self._loop = asyncio.get_running_loop()

    def _wait(self, work: Coroutine[Any, Any, T]) -> T:
        loop = self._loop
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if loop is None or running is loop:
            work.close()
            raise ConfigurationError(
                "the synchronous methods of artstore's checkpointer run on the store's event "
                "loop from another thread: use the async ones (`graph.ainvoke`) on that loop, "
                "or run the sync graph in a thread (`await asyncio.to_thread(graph.invoke, ...)`)"
            )
        return asyncio.run_coroutine_threadsafe(work, loop).result()

    # --- values -------------------------------------------------------------------------

    def _typed(self, value: Any) -> list[str]:
        """`[type, base64]` of what the serializer wrote, `[type, base64, "zlib"]` compressed."""
        kind, data = self.serde.dumps_typed(value)
        if kind == "pickle":
            raise InvalidArgumentError("serde", "wrote pickle; artstore never stores pickle")
        data = _masked(data)
        if len(data) < COMPRESS_FROM_BYTES:
            return [kind, base64.b64encode(data).decode("ascii")]
        key = (kind, hashlib.sha256(data).digest())
        typed = self._compressed.get(key)
        if typed is None:
            typed = _compressed_typed(kind, data)
            self._compressed.remember(key, typed)
        return list(typed)

    def _value(self, value: Any, blobs: dict[str, str]) -> Any:
        """How a value is stored: `[type, base64(, "zlib")]` in the event, `{"blob": hash}`,
        or for a long list `{"chunks": [...]}`, each chunk of `CHUNK_ITEMS` items a blob's
        hash or, when small, its typed form."""
        if type(value) is list and len(value) > CHUNK_ITEMS:
            return {
                "chunks": [
                    self._chunk(value[start : start + CHUNK_ITEMS], blobs)
                    for start in range(0, len(value), CHUNK_ITEMS)
                ]
            }
        typed = self._typed(value)
        if len(typed[1]) <= INLINE_BYTES:
            return typed
        return {"blob": _in_blob(typed, blobs)}

    def _chunk(self, items: list[Any], blobs: dict[str, str]) -> Any:
        typed = self._typed(items)
        return typed if len(typed[1]) <= INLINE_BYTES else _in_blob(typed, blobs)

    def _document(self, value: dict[str, Any]) -> dict[str, Any]:
        """`{"json": value}` where JSON gives `value` back exactly, else its typed form."""
        try:
            if json.loads(json.dumps(value, allow_nan=False)) == value:
                return {"json": value}
        except (TypeError, ValueError):
            pass
        return {"typed": self._typed(value)}

    def _load(self, typed: list[str]) -> Any:
        kind, text, *encoding = typed
        if kind == "pickle":
            raise InvalidArgumentError("serde", "a stored value is pickle; artstore never loads it")
        data = base64.b64decode(text)
        if encoding == ["zlib"]:
            data = zlib.decompress(data)
        return self.serde.loads_typed((kind, data))

    def _load_document(self, document: dict[str, Any]) -> Any:
        return document["json"] if "json" in document else self._load(document["typed"])

    # --- reading, inside one connection -------------------------------------------------

    async def _read(
        self, query: Any, metadata_filter: dict[str, Any] | None, limit: int | None
    ) -> list[CheckpointTuple]:
        known = self._known
        rows = await self.store.database.run_read(
            lambda c: _read_rows(c, query, metadata_filter, limit, self._load_document, known)
        )
        if rows:
            self._blob_texts.add(rows[0].blobs)  # one dict, shared by the rows
        return [self._tuple(row) for row in rows]

    @property
    def _known(self) -> _Known:
        return _Known(self._blob_texts, self._decoded)

    def _blob_value(self, row: _Row, digest: str) -> Any:
        """The value the blob `digest` holds: a copy of the one kept decoded, else its text
        decoded now."""
        kept = row.decoded.get(digest)
        if kept is None:
            text = row.blobs[digest]
            return self._decoded_now(digest, json.loads(text), len(text))
        return kept.copy()

    def _inline_value(self, typed: list[str]) -> Any:
        """The value of a typed form kept in an event: for a large one, a copy of the one
        kept decoded, else decoded now."""
        if len(typed[1]) < DECODED_INLINE_FROM_CHARS:
            return self._load(typed)
        key = tuple(typed)  # its kind, text and encoding: what the value is made of
        kept = self._decoded.get(key)
        if kept is None:
            return self._decoded_now(key, typed, len(typed[1]))
        return kept.copy()

    def _decoded_now(self, key: Any, typed: list[str], chars: int) -> Any:
        """`typed` decoded, and kept (`DecodedBlobs`) if it was decoded before: the value
        itself is handed out only when it is not kept, so nothing else ever holds it."""
        value = self._load(typed)
        if not self._decoded.decoded_before(key):
            return value
        kept = Kept(value, chars)
        self._decoded.add(key, kept)
        return kept.copy()

    def _tuple(self, row: _Row) -> CheckpointTuple:
        def typed(stored: Any) -> Any:  # a typed form, or the hash of a blob holding one
            if isinstance(stored, str):
                return self._blob_value(row, stored)
            return self._inline_value(stored)

        def value(stored: Any) -> Any:
            if isinstance(stored, dict) and "chunks" in stored:
                return [item for chunk in stored["chunks"] for item in typed(chunk)]
            return typed(stored["blob"] if isinstance(stored, dict) else stored)

        checkpoint = dict(row.checkpoint)
        checkpoint["channel_values"] = {
            channel: value(stored) for channel, stored in row.values.items() if stored is not None
        }
        thread = {"thread_id": row.thread_id, "checkpoint_ns": row.checkpoint_ns}
        parent = row.data.get("parent_checkpoint_id")
        return CheckpointTuple(
            config={"configurable": {**thread, "checkpoint_id": row.data["checkpoint_id"]}},
            checkpoint=checkpoint,
            metadata=row.metadata,
            parent_config={"configurable": {**thread, "checkpoint_id": parent}} if parent else None,
            pending_writes=[(task, channel, value(stored)) for task, channel, stored in row.writes],
        )


class _Row:
    """A checkpoint as read: its event's payload, its values and writes as stored."""

    def __init__(
        self, thread_id: str, checkpoint_ns: str, data: dict[str, Any], metadata: Any
    ) -> None:
        self.thread_id = thread_id
        self.checkpoint_ns = checkpoint_ns
        self.data = data
        self.metadata = metadata
        self.checkpoint: dict[str, Any] = {}
        self.values: dict[str, Any] = {}
        self.writes: list[tuple[str, str, Any]] = []
        self.blobs: dict[str, str] = {}  # texts by hash, of those not kept decoded
        self.decoded: dict[str, Kept] = {}  # values kept decoded, by hash: never handed out


def _select_checkpoints() -> Any:
    return select(_CHECKPOINTS.c.thread_id, _CHECKPOINTS.c.checkpoint_ns, _EVENTS.c.data).join(
        _EVENTS, _EVENTS.c.position == _CHECKPOINTS.c.position
    )


def _checkpoint_with_writes(by_id: bool) -> Any:
    """One statement for `get_tuple`: the checkpoint's event (idx NULL), then the events of
    its pending writes, each with its task and index. Built once, with bound parameters."""
    thread = and_(
        _CHECKPOINTS.c.thread_id == bindparam("thread_id"),
        _CHECKPOINTS.c.checkpoint_ns == bindparam("checkpoint_ns"),
    )
    chosen = select(_CHECKPOINTS.c.checkpoint_id, _CHECKPOINTS.c.position).where(thread)
    if by_id:
        chosen = chosen.where(_CHECKPOINTS.c.checkpoint_id == bindparam("checkpoint_id"))
    chosen = chosen.order_by(_CHECKPOINTS.c.checkpoint_id.desc()).limit(1).cte("chosen")
    checkpoint = select(
        cast(null(), Text).label("task_id"), cast(null(), Integer).label("idx"), _EVENTS.c.data
    ).join_from(chosen, _EVENTS, _EVENTS.c.position == chosen.c.position)
    writes = (
        select(_WRITES.c.task_id, _WRITES.c.idx, _EVENTS.c.data)
        .join_from(
            chosen,
            _WRITES,
            and_(
                _WRITES.c.thread_id == bindparam("thread_id"),
                _WRITES.c.checkpoint_ns == bindparam("checkpoint_ns"),
                _WRITES.c.checkpoint_id == chosen.c.checkpoint_id,
            ),
        )
        .join(_EVENTS, _EVENTS.c.position == _WRITES.c.position)
    )
    return union_all(checkpoint, writes)


_LATEST = _checkpoint_with_writes(by_id=False)
_ONE_BY_ID = _checkpoint_with_writes(by_id=True)


def _read_one(
    c: Connection,
    statement: Any,
    parameters: dict[str, str],
    load_document: Any,
    known: _Known,
) -> _Row | None:
    """The checkpoint `statement` selects, with its values, writes and blobs; None if none."""
    found = c.execute(statement, parameters).all()
    checkpoint = next((data for _, idx, data in found if idx is None), None)
    if checkpoint is None:
        return None
    data = _payload(checkpoint)
    row = _Row(parameters["thread_id"], parameters["checkpoint_ns"], data, None)
    row.metadata = load_document(data["metadata"])
    row.checkpoint = load_document(data["checkpoint"])
    _read_values(c, row)
    row.writes = _ordered_writes([(task, idx, d) for task, idx, d in found if idx is not None])
    hashes = list(_blob_refs(row))
    if hashes:
        row.blobs, row.decoded = _blob_texts(c, hashes, known)
    return row


def _read_rows(
    c: Connection,
    query: Any,
    metadata_filter: dict[str, Any] | None,
    limit: int | None,
    load_document: Any,
    known: _Known,
) -> list[_Row]:
    """The checkpoints `query` selects, newest first, those whose metadata holds every
    item of `metadata_filter`, at most `limit`, with their values, writes and blobs."""
    rows: list[_Row] = []
    if metadata_filter is None and limit is not None:
        query = query.limit(limit)
    for _, _, data in c.execute(query):
        data = _payload(data)
        metadata = load_document(data["metadata"])
        if metadata_filter and any(
            k not in metadata or metadata[k] != v for k, v in metadata_filter.items()
        ):
            continue
        # The ids as the event holds them (the tables hold NUL as U+FFFD).
        rows.append(_Row(data["thread_id"], data.get("checkpoint_ns", ""), data, metadata))
        if limit is not None and len(rows) >= limit:
            break
    for row in rows:
        row.checkpoint = load_document(row.data["checkpoint"])
        _read_values(c, row)
        _read_writes(c, row)
    hashes = [h for row in rows for h in _blob_refs(row)]
    if hashes:
        texts, decoded = _blob_texts(c, hashes, known)
        for row in rows:
            row.blobs, row.decoded = texts, decoded
    return rows


def _read_values(c: Connection, row: _Row) -> None:
    """The value of each channel at its version in the checkpoint: from the checkpoint's
    own event where it wrote that version, else from the event that did."""
    versions = row.checkpoint.get("channel_versions", {})
    own_versions = row.data.get("versions", {})
    own_values = row.data.get("values", {})
    elsewhere = []
    for channel, version in versions.items():
        if channel in own_versions and version_key(own_versions[channel]) == version_key(version):
            row.values[channel] = own_values.get(channel)
        else:
            elsewhere.append((channel, version_key(version)))
    if not elsewhere:
        return
    query = (
        select(_VALUES.c.channel, _EVENTS.c.data)
        .join(_EVENTS, _EVENTS.c.position == _VALUES.c.position)
        .where(
            _VALUES.c.thread_id == row.thread_id,
            _VALUES.c.checkpoint_ns == row.checkpoint_ns,
            tuple_(_VALUES.c.channel, _VALUES.c.version).in_(elsewhere),
        )
    )
    for channel, data in c.execute(query):
        row.values[channel] = _payload(data).get("values", {}).get(channel)


def _read_writes(c: Connection, row: _Row) -> None:
    """The checkpoint's pending writes, in LangGraph's order (`writes_sort_key`)."""
    query = (
        select(_WRITES.c.task_id, _WRITES.c.idx, _EVENTS.c.data)
        .join(_EVENTS, _EVENTS.c.position == _WRITES.c.position)
        .where(
            _WRITES.c.thread_id == row.thread_id,
            _WRITES.c.checkpoint_ns == row.checkpoint_ns,
            _WRITES.c.checkpoint_id == row.data["checkpoint_id"],
        )
    )
    row.writes = _ordered_writes(c.execute(query).all())


def _ordered_writes(rows: list[Any]) -> list[tuple[str, str, Any]]:
    """(task, channel, value as stored) of each (task id, index, event payload) row, in
    LangGraph's order (`writes_sort_key`)."""
    found = []
    for task_id, idx, data in rows:
        payload = _payload(data)
        for index, channel, stored in payload["writes"]:
            if index == idx:
                key = writes_sort_key(payload.get("task_path", ""), task_id, idx)
                found.append((key, (task_id, channel, stored)))
                break
    return [write for _, write in sorted(found, key=lambda item: item[0])]


def _blob_refs(row: _Row) -> Iterator[str]:
    stored = [*row.values.values(), *(w[2] for w in row.writes)]
    for value in stored:
        if isinstance(value, dict) and "chunks" in value:
            yield from (chunk for chunk in value["chunks"] if isinstance(chunk, str))
        elif isinstance(value, dict):
            yield value["blob"]


def _in_blob(typed: list[str], blobs: dict[str, str]) -> str:
    """The hash of the blob that holds `typed`, added to the append's `blobs`."""
    body = blob_json(typed)
    digest = blob_hash(body)
    blobs[digest] = body
    return digest


def _payload(data: Any) -> dict[str, Any]:
    return data if isinstance(data, dict) else load_payload(data)


def _current_rollout_id() -> str | None:
    rollout = current_rollout()
    return rollout.id if rollout is not None and not rollout.closed else None


def _compressed_typed(kind: str, data: bytes) -> tuple[str, ...]:
    """`[type, base64(zlib)]` where compressing saves a tenth, else `[type, base64]`."""
    compressed = zlib.compress(data, 1)
    if len(compressed) <= len(data) * 0.9:
        return (kind, base64.b64encode(compressed).decode("ascii"), "zlib")
    return (kind, base64.b64encode(data).decode("ascii"))


class _Kept(dict):
    """The newest `size` entries remembered (the oldest go first)."""

    def __init__(self, size: int) -> None:
        super().__init__()
        self.size = size

    def remember(self, key: Any, value: Any) -> None:
        self[key] = value
        while len(self) > self.size:
            del self[next(iter(self))]


class _BlobTexts(dict):
    """Blob texts by hash, the newest up to `chars` characters. Looked up from the thread
    a read runs on (SQLite's), filled on the event loop: single dict operations, each
    atomic in CPython, never an iteration there."""

    def __init__(self, chars: int) -> None:
        super().__init__()
        self.chars, self.held = chars, 0

    def add(self, texts: dict[str, str]) -> None:
        for digest, text in texts.items():
            if digest not in self and len(text) <= self.chars:
                self[digest] = text
                self.held += len(text)
        while self.held > self.chars:
            self.held -= len(self.pop(next(iter(self))))


class _Known(NamedTuple):
    """What a saver keeps of the blobs it has written or read."""

    texts: _BlobTexts
    decoded: DecodedBlobs


def _blob_texts(
    c: Connection, hashes: Iterable[str], known: _Known
) -> tuple[dict[str, str], dict[str, Kept]]:
    """The values kept decoded of the blobs `hashes` name, taken here (the event loop may
    drop them from the saver's memory before they are used), and the texts of the rest:
    those kept, the others read."""
    texts: dict[str, str] = {}
    decoded: dict[str, Kept] = {}
    missing = []
    for digest in hashes:
        kept = known.decoded.get(digest)
        if kept is not None:
            decoded[digest] = kept
            continue
        text = known.texts.get(digest)
        if text is None:
            missing.append(digest)
        else:
            texts[digest] = text
    if missing:
        texts.update(read_blob_texts(c, missing))
    return texts, decoded


def _masked(data: bytes) -> bytes:
    """`data` with each credential the process knows overwritten byte for byte (msgpack
    keeps the length of every string, so the value still reads)."""
    for secret in known_secrets():
        encoded = secret.encode()
        if encoded in data:
            data = data.replace(encoded, b"*" * len(encoded))
    return data
