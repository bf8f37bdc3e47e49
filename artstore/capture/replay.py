"""Resume inside a rollout: an earlier attempt's recorded calls served back to the agent.

A rollout that did not finish (its process was killed, its lease expired) is run again as
a new rollout that `resumes` it (`store.rollout(model, resumes=earlier_id)`;
`durable_rollouts` finds the earlier attempt itself). While the agent sends the requests
the earlier attempt recorded, in the same order, each is answered from the record instead
of the inference server: the same bytes (a stream as a stream, its events rebuilt from the
record), so the agent sees the answers it saw before and makes the same next request.

Matching is by position and fingerprint: the n-th request the agent sends is served the
n-th call the earlier attempt recorded if `request_fingerprint` of both is the same. The
first request that differs (or the first one past the end of the record) goes to the
inference server, and so does every later one: the divergence is recorded
(`llm.replay_diverged`), the record is not consulted again.

A served call is recorded in the new attempt as an `llm.call` copied from the earlier
one (its output, token ids and logprobs, its tool calls) with `replayed_from` naming the
call it copies: the new attempt's trajectory is whole, each call once, and the abandoned
attempt keeps its own events (nothing is ever changed).

Only calls recorded from HTTP (`source="http"`: an `openai` client, `ChatOpenAI`, ART's
`model.openai_client()`) are served; a call that failed is not (the agent's retry sends
the same request, served by the next recorded answer).
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import httpx

from artstore.capture.tools import ToolReplay
from artstore.documents import exchanges as docs
from artstore.events import LLMCall, ReplayDiverged, ToolCalled, new_event_id, new_id
from artstore.eventstore.blobs import blob_hash, blob_json, canonical_json

if TYPE_CHECKING:
    from artstore.eventstore.store import EventStore
    from artstore.redaction import Redactor


def request_fingerprint(request: dict[str, Any]) -> str:
    """The fingerprint of a request body: `sha256:` of its canonical JSON.

    The body is what the client sent: `model`, `messages` (each as sent, tool calls and
    tool results included), `tools`, `tool_choice`, `response_format`, the sampling
    parameters (`temperature`, `top_p`, `max_tokens`, `seed`, `n`, `logprobs`, ...) and
    `stream`; keys sorted, no whitespace. It never holds the API key or any header (they
    are not in the body), and it is taken of the body as stored: secrets redacted.
    """
    return "sha256:" + hashlib.sha256(canonical_json(request).encode()).hexdigest()


def stored_form(request: dict[str, Any], redact: Redactor) -> dict[str, Any]:
    """`request` as the HTTP capture stores it (each message, the tools and the rest
    redacted apart), put back together: what a recorded request's fingerprint is taken of."""
    documents: dict[str, Any] = {}

    def blob(value: Any) -> str:
        text = redact(blob_json(value))
        digest = blob_hash(text)
        documents[digest] = json.loads(text)
        return digest

    inputs, tools, rest = docs.split_request(request, blob)
    return docs.join_request(documents[rest], inputs, tools, documents)


@dataclass(frozen=True)
class RecordedCall:
    """A call of the earlier attempt that may be served again."""

    event: LLMCall
    request: dict[str, Any]  # what its fingerprint is taken of
    fingerprint: str  # `request_fingerprint(request)`
    response: dict[str, Any]  # the stored response document ({"json": ...} or {"sse": ...})


class Replay:
    """The earlier attempt's calls, handed out in order until the agent's requests differ."""

    def __init__(
        self, resumes: str, calls: list[RecordedCall], tools: list[ToolCalled] | None = None
    ) -> None:
        self.resumes = resumes
        self.calls = calls
        self.tools = ToolReplay(tools or [])  # results of `recorded_tool`s, served apart
        self.chat: Replay | None = None  # calls of a LangChain chat model, served apart
        self.position = 0
        self.live = False  # a request differed, or the record ran out: no more replay
        self.served = 0
        self._lock = threading.Lock()

    def take(
        self, request: dict[str, Any], rollout_id: str
    ) -> RecordedCall | ReplayDiverged | None:
        """The recorded call to serve for `request` (as its fingerprint is taken); else the
        divergence to record (once), or None (live already, or past the end of the record)."""
        fingerprint = request_fingerprint(request)
        with self._lock:
            if self.live:
                return None
            if self.position >= len(self.calls):
                self.live = True
                return None
            recorded = self.calls[self.position]
            if recorded.fingerprint == fingerprint:
                self.position += 1
                self.served += 1
                return recorded
            self.live = True
            return ReplayDiverged(
                rollout_id=rollout_id,
                resumes=self.resumes,
                index=self.position,
                recorded_call_id=recorded.event.call_id,
                recorded_fingerprint=recorded.fingerprint,
                fingerprint=fingerprint,
                differs=differing_keys(recorded.request, request),
            )


def differing_keys(recorded: dict[str, Any], sent: dict[str, Any]) -> list[str]:
    """The names of a request's top-level fields whose values differ from the record's
    (`messages`, `model`, `temperature`, ...): why a resumed rollout went live, without
    storing a value."""
    return sorted(k for k in recorded.keys() | sent.keys() if recorded.get(k) != sent.get(k))


def message_request(messages: list[dict[str, Any]], tools: Any) -> dict[str, Any]:
    """What the fingerprint of a call of a LangChain chat model (artstore's
    `init_chat_model`) is taken of: each message as stored (`message_to_dict`) reduced to
    its type, content, tool calls, tool call id and name (ids that LangGraph makes up anew
    on each run left out), and the tools offered."""

    def essential(message: dict[str, Any]) -> list[Any]:
        data = message.get("data") or {}
        calls = [[c.get("name"), c.get("args"), c.get("id")] for c in data.get("tool_calls") or []]
        return [
            message.get("type"),
            data.get("content"),
            calls,
            data.get("tool_call_id"),
            data.get("name"),
        ]

    return {"messages": [essential(m) for m in messages], "tools": tools}


def _answered(events: list[LLMCall], source: str) -> list[LLMCall]:
    """The calls of `source` that were answered, one per index, in order."""
    by_index: dict[int, LLMCall] = {}
    for event in events:
        if event.source == source and event.error_type is None and event.output is not None:
            if source == "http" and event.request is None:
                continue
            by_index.setdefault(event.index, event)
    return [by_index[i] for i in sorted(by_index)]


def _recorded(events: list[LLMCall], bodies: dict[str, Any]) -> list[RecordedCall]:
    """Each call with its fingerprint, up to the first whose blobs are missing."""
    calls = []
    for event in events:
        if not all(
            h in bodies for h in (*event.input, event.tools, event.request, event.output) if h
        ):
            break
        assert event.output is not None
        if event.source == "http":
            assert event.request is not None
            request = docs.join_request(bodies[event.request], event.input, event.tools, bodies)
        else:
            tools = bodies[event.tools] if event.tools else None
            request = message_request([bodies[h] for h in event.input], tools)
        fingerprint = request_fingerprint(request)
        calls.append(RecordedCall(event, request, fingerprint, bodies[event.output]))
    return calls


async def load_replay(store: EventStore, stream_id: str, resumes: str) -> Replay:
    """What the rollout `resumes` recorded: its answered calls from HTTP and those of a
    LangChain chat model (each in their order), and its recorded tools' results."""
    stored = await store.read_stream(stream_id)
    events = [e.decode() for e in stored if e.type == "llm.call"]
    tools = [e.decode() for e in stored if e.type == "tool.called"]
    http_calls = _answered(events, "http")  # type: ignore[arg-type]
    chat_calls = _answered(events, "langchain")  # type: ignore[arg-type]
    hashes = {
        h for e in http_calls + chat_calls for h in (*e.input, e.tools, e.request, e.output) if h
    }
    bodies = {h: json.loads(body) for h, body in (await store.get_blobs(hashes)).items()}
    replay = Replay(resumes, _recorded(http_calls, bodies), sorted(tools, key=lambda e: e.index))  # type: ignore
    replay.chat = Replay(resumes, _recorded(chat_calls, bodies))
    return replay


def replayed_event(recorded: RecordedCall, started_at: datetime) -> LLMCall:
    """The new attempt's record of a served call: the earlier one's, under a new id."""
    now = datetime.now(UTC)
    return recorded.event.model_copy(
        update={
            "event_id": new_event_id(),
            "call_id": new_id(),
            "index": 0,  # numbered when submitted
            "replayed_from": recorded.event.call_id,
            "supersedes": None,
            "art_exchange": False,  # unless ART's capture takes it as served (capture.http)
            "started_at": started_at,
            "finished_at": now,
            "latency_s": (now - started_at).total_seconds(),
        }
    )


class _Events(httpx.SyncByteStream, httpx.AsyncByteStream):
    """A recorded body, one chunk per server-sent event (one chunk when not streamed)."""

    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = chunks

    def __iter__(self) -> Iterator[bytes]:
        yield from self.chunks

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for chunk in self.chunks:
            yield chunk


def response_for(request: httpx.Request, recorded: RecordedCall) -> httpx.Response:
    """The HTTP response the earlier attempt received, rebuilt from its record."""
    document = recorded.response
    if "sse" in document:
        chunks = [docs.response_body({"sse": [each]}) for each in document["sse"]]
        content_type = "text/event-stream"
    else:
        chunks = [docs.response_body(document)]
        content_type = "application/json" if "json" in document else "text/plain"
    response = httpx.Response(
        200,
        headers={"content-type": content_type, "x-artstore-replayed-from": recorded.event.call_id},
        stream=_Events(chunks),
        request=request,
    )
    response.elapsed = timedelta(0)
    return response


async def resumable_attempts(store: EventStore, group_id: str, skip: set[str]) -> list[str]:
    """The attempts of `group_id` left running and that no other rollout resumes,
    newest first (an attempt that resumed another holds the calls of both), `skip` left out.

    For a caller that runs a group's rollouts again after its process died: an attempt
    still running in a live process must be in `skip` (or fenced by a lease).
    """
    from sqlalchemy import select

    from artstore.schema import tables as t

    async with store.database.read() as connection:
        rows = (
            await connection.execute(
                select(t.rollouts.c.rollout_id, t.rollouts.c.status)
                .where(t.rollouts.c.group_id == group_id)
                .order_by(t.rollouts.c.started_at.desc(), t.rollouts.c.rollout_id)
            )
        ).all()
    resumed = set()
    for row in rows:  # each stream's first event: its `rollout.started`
        started = await store.read_stream(f"rollout-{row.rollout_id}", 1, limit=1)
        resumed |= {event.data.get("resumes") for event in started}
    # Only an attempt left running (its process died): one that failed (the agent raised,
    # a call timed out) is run again afresh, as a retry is meant to, never replayed.
    return [
        row.rollout_id
        for row in rows
        if row.status == "running" and row.rollout_id not in resumed | skip
    ]
