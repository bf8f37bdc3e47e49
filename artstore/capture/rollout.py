"""A rollout: one run of an agent on one scenario, recorded as a stream of events.

    async with store.rollout(model, scenario=scenario) as rollout:
        rollout.result = await agent(scenario)

Inside the block every LLM call becomes an `llm.call` event of this rollout: those made
through `artstore.langgraph.init_chat_model` or ART's own `art.langgraph.init_chat_model`
(LangChain messages), and every OpenAI-compatible HTTP call made through an `openai`
client, ART's `model.openai_client()` included (`artstore.capture.http`); a loop of your
own can also record with `rollout.record_llm_call(input, output)`. Each call is recorded
once: a LangChain record of a call already recorded from HTTP supersedes that record
(`artstore.capture.matching` says how it is found).
Calls are handed to the store's writer without waiting for a commit; the block's exit
waits for all of them and records `rollout.finished` (or `rollout.failed`, and the
exception still reaches the caller), so a rollout is durable once its block has exited.

Messages are recorded by value, as they are at the moment of each call: a message the
agent edits in place between two calls is recorded with its new content in the second.

The current rollout is a context variable: concurrent rollouts in concurrent tasks never
see each other's calls, and LangGraph's worker threads (which copy the context) record
into the rollout of the task that started them.

`check(connection, event)` runs in the transaction that records the rollout's start
(`rollout.started`) and in the one that records its end (`rollout.finished` or
`rollout.failed`); raising refuses that event. Rollout workers pass one that checks their
lease (fencing): a worker whose claim expired can neither start nor end the rollout.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import dataclasses
import json
import threading
import time
import traceback
import weakref
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Literal

from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.utils.function_calling import convert_to_openai_tool

from artstore.art_api import art_module
from artstore.capture import http, matching
from artstore.capture.replay import Replay, load_replay, message_request, replayed_event
from artstore.capture.targets import CURRENT_ROLLOUT, CallTarget
from artstore.capture.tools import ToolReplay
from artstore.documents import messages as lc
from artstore.errors import InvalidEventError, NoRolloutError, StorageFullError, StoreClosedError
from artstore.events import (
    LLMCall,
    ReplayDiverged,
    RolloutFailed,
    RolloutFinished,
    RolloutStarted,
    ToolCalled,
    new_id,
)
from artstore.eventstore.blobs import blob_hash, blob_json, canonical_json
from artstore.eventstore.records import follows
from artstore.redaction import Redactor, redact_url

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection

    from artstore.eventstore.records import AppendResult
    from artstore.eventstore.store import EventStore

# Checks the start and the end of a rollout in the transactions that record them.
RolloutCheck = Callable[["Connection", "RolloutStarted | RolloutFinished | RolloutFailed"], None]


def current_rollout() -> Rollout | None:
    """The open rollout whose block the caller runs in, if any."""
    return CURRENT_ROLLOUT.get()


def require_rollout(what: str) -> Rollout:
    """The current rollout, or a NoRolloutError that says how to get one."""
    found = CURRENT_ROLLOUT.get()
    if found is None or found.closed:
        raise NoRolloutError(
            f"{what} needs a rollout: call it inside `async with store.rollout(model, ...)` "
            "(or in a function wrapped by `artstore.langgraph.wrap_rollout`). A thread started "
            "by hand must run in a copy of the rollout's context (`contextvars.copy_context`, "
            "`asyncio.to_thread` and LangGraph do this)."
        )
    return found


def rollout_stream(rollout_id: str) -> str:
    return f"rollout-{rollout_id}"


# The rollouts whose `async with store.rollout(...)` block is running, per event store: a
# store closed under them ends them first (`end_open_rollouts`), so that none is left
# `running` and the calls they had sent are recorded.
_OPEN_BLOCKS: weakref.WeakKeyDictionary[EventStore, set[Rollout]] = weakref.WeakKeyDictionary()


async def end_open_rollouts(store: EventStore) -> None:
    """Fail every rollout block still running on `store` (the store is being closed): its
    calls on their way are recorded as calls that did not complete, then `rollout.failed`
    with a `StoreClosedError`. A process whose loop raised while rollouts were in flight
    (ART's `max_exceptions` does) closes its store before those tasks are cancelled."""
    for recorder in list(_OPEN_BLOCKS.pop(store, ())):
        await recorder.abandon(
            StoreClosedError("the store was closed while this rollout was running")
        )


def to_json_value(value: Any) -> Any:
    """A scenario or result as JSON: pydantic models and dataclasses are dumped."""
    if hasattr(value, "model_dump"):
        return value.model_dump(mode="json")
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    return value


def _openai_tools(tools: Sequence[Any]) -> list[dict[str, Any]]:
    """OpenAI tool dicts as ART records them (LangChain tools and schemas are converted)."""
    return [t if isinstance(t, dict) else convert_to_openai_tool(t) for t in tools]


class Rollout(CallTarget):
    """The recorder of one rollout.

    Set `result` (JSON, a pydantic model or a dataclass) before the block exits; `metrics`,
    `metadata` and `log()` end up in the trajectory as in `art.Trajectory`.
    """

    def __init__(
        self,
        store: EventStore,
        *,
        rollout_id: str,
        model_name: str,
        inference_base_url: str | None,
        inference_api_key: str | None,
        inference_model_name: str | None,
    ) -> None:
        super().__init__()
        self.store = store
        self.id = rollout_id
        self.model_name = model_name
        self.inference_base_url = inference_base_url
        self.inference_api_key = inference_api_key  # used for calls, never stored
        self.inference_model_name = inference_model_name or model_name
        self.result: Any = None
        self.metrics: dict[str, float | int | bool] = {}
        self.metadata: dict[str, float | int | str | bool | None] = {}
        self.logs: list[str] = []
        self.redact = Redactor([inference_api_key], urls=[inference_base_url])
        self.closed = False  # the block has exited: no new calls
        self._ended = False  # rollout.finished or rollout.failed is queued
        self._abandoned = False  # failed by `abandon` when its store closed under its block
        self._version = 0  # the stream's version once every append queued so far is stored
        self._event_ids: dict[int, str] = {}  # version -> the id of the event queued for it
        # Each append checks that the event before it is this rollout's own (workers: after
        # a lease is lost, another worker may end the stream while appends are queued).
        self._chained = False
        self._stored_version = 0  # its version after the appends settled so far
        self._calls = 0
        self._pending: list[asyncio.Future[AppendResult]] = []
        self._clock = time.monotonic()  # reset when `rollout.started` is queued
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self._handoffs = 0  # calls recorded from other threads, not yet queued
        self._handoffs_lock = threading.Lock()
        self._handoff_error: Exception | None = None
        self._sent_blobs: set[str] = set()  # blob bodies already queued by this rollout
        self._indexes: dict[str, int] = {}  # call id -> index
        # Calls recorded from HTTP that a LangChain record may supersede, by each of their
        # keys (`artstore.capture.matching`); `_taken` holds those superseded already.
        self._http_calls: dict[str, list[LLMCall]] = {}
        self._taken: set[str] = set()
        self._tool_calls = 0  # `recorded_tool` calls numbered so far

    @property
    def tool_replay(self) -> ToolReplay | None:
        """The earlier attempt's tool results, when this rollout resumes one."""
        return self.replay.tools if self.replay is not None else None

    def number_tool_call(self, event: ToolCalled) -> ToolCalled:
        with self.numbering:
            index, self._tool_calls = self._tool_calls, self._tool_calls + 1
        return event.model_copy(update={"index": index})

    def served_answer(self, input: Any, tools: Sequence[Any] | None) -> AIMessage | None:
        """For a LangChain chat model's call: the answer the earlier attempt this rollout
        resumes recorded for it (recorded here as a copy), or None: call the model."""
        chat = self.replay.chat if self.replay is not None else None
        if chat is None or chat.live:
            return None
        messages = lc.as_messages(input)
        dumps = [json.loads(self.redact(lc.dump_message(m))) for m in messages]
        offered = json.loads(self.redact(blob_json(_openai_tools(tools)))) if tools else None
        found = chat.take(message_request(dumps, offered), self.id)
        if isinstance(found, ReplayDiverged):
            self.submit_event(found)
            return None
        if found is None:
            return None
        event = replayed_event(found, datetime.now(UTC))
        self.submit_call(lambda: (event, {}, []))
        answer = lc.load_message(json.dumps(found.response))
        assert isinstance(answer, AIMessage)
        return answer

    def stored_json(self, value: Any, what: str) -> Any:
        """`value` as stored: JSON, secrets redacted; a clear error if it is not JSON."""
        return self._json(value, what)

    @property
    def stream_id(self) -> str:
        return rollout_stream(self.id)

    @property
    def num_llm_calls(self) -> int:
        """LLM calls queued so far (failed ones included)."""
        return self._calls

    def log(self, message: str) -> None:
        """A line for the trajectory's `logs`, as `art.Trajectory.log`."""
        self.logs.append(message)

    def record_event(self, event: Any, blobs: dict[str, str] | None = None) -> None:
        """Append an event of this rollout's own stream (the trajectory a loop built).

        Queued in order after the calls recorded so far; the block's exit waits for it.
        """
        if self.closed:
            raise NoRolloutError(f"rollout {self.id} has already ended")
        new = {h: body for h, body in (blobs or {}).items() if h not in self._sent_blobs}
        self._append(event, new)
        self._sent_blobs.update(new)

    # --- recording ----------------------------------------------------------------------

    def record_llm_call(
        self,
        input: Any,
        output: Any,
        *,
        tools: Sequence[Any] | None = None,
        call_id: str | None = None,
        started_at: datetime | None = None,
        latency_s: float | None = None,
        error: BaseException | None = None,
        attempts: Sequence[LLMCall] | None = None,
    ) -> None:
        """Record one LLM call; returns at once. Callable from the rollout's task or any thread.

        `input` is what the chat model was given (messages, a PromptValue or a string),
        `output` the `AIMessage` it returned (None for a failed call, with `error`), `tools`
        what it was offered (OpenAI tool dicts, or LangChain tools, converted as ART does).
        The messages are serialised here, in the caller's thread, as they are now; the
        append is queued and its commit awaited when the block exits.

        When this rollout recorded the same call from HTTP, this record supersedes that
        one: the HTTP record with the same response id, or for a streamed response the
        same answer (`artstore.capture.matching`). A chat model that made the call inside
        `artstore.capture.http.attempts()` passes what it collected as `attempts`: then
        this record supersedes the last of them if that has the same outcome (an answer,
        or a failure), and no other.
        """
        self.submit_call(
            lambda: self._llm_call_event(
                input, output, tools, call_id, started_at, latency_s, error, attempts
            )
        )

    def submit_call(
        self,
        make: Callable[[], tuple[LLMCall, dict[str, str], list[str]]],
        origin: asyncio.Task | None = None,
    ) -> asyncio.Future[AppendResult] | None:
        """Build an `llm.call` event with `make` (in the caller's thread), number it, queue it.

        `make` returns (event, blobs, the keys a later record of the same call finds it
        by: those of a call recorded from HTTP, none for any other). Returns the append's
        future when called on the store's loop (None from another thread).
        """
        on_loop = threading.get_ident() == self._loop_thread
        if self.closed:
            raise NoRolloutError(
                f"rollout {self.id} has already ended: an LLM call made after its block "
                "exited cannot be recorded in it"
            )
        if not on_loop:
            with self._handoffs_lock:
                self._handoffs += 1
        try:
            event, blobs, keys = make()
            event = self._number(event, keys)
        except BaseException:
            if not on_loop:
                self._handoff_done()
            raise
        if on_loop:
            return self._queue_llm_call(event, blobs)
        # a sync call in a worker thread: hand over to the store's loop
        self._loop.call_soon_threadsafe(self._queue_llm_call, event, blobs, True)
        return None

    def _number(self, event: LLMCall, keys: list[str]) -> LLMCall:
        """The call's index: the next one, or that of the call it supersedes."""
        with self.numbering:
            if event.supersedes is not None:
                index = self._indexes[event.supersedes]
            else:
                index, self._calls = self._calls, self._calls + 1
            self._indexes[event.call_id] = index
            if event.error_type is None:
                for key in keys:
                    self._http_calls.setdefault(key, []).append(event)
        return event.model_copy(update={"index": index})

    def _superseded(self, keys: list[str]) -> LLMCall | None:
        """The newest call recorded from HTTP under the first of `keys` that finds one, taken
        (once: a call found by its response id is not found again by its answer)."""
        with self.numbering:
            for key in keys:
                found = self._http_calls.get(key) or []
                while found and found[-1].call_id in self._taken:
                    found.pop()
                if found:
                    call = found.pop()
                    self._taken.add(call.call_id)
                    return call
        return None

    def submit_event(self, event: Any) -> None:
        """Queue an event of this rollout's stream in order with its calls, from any thread."""
        if threading.get_ident() == self._loop_thread:
            self._queue_llm_call(event, {})
            return
        with self._handoffs_lock:
            self._handoffs += 1
        self._loop.call_soon_threadsafe(self._queue_llm_call, event, {}, True)

    def capture_failed(self, error: Exception) -> None:
        """A call could not be recorded: the block's exit raises it (nobody else can see it)."""
        if self._handoff_error is None:
            self._handoff_error = error

    def _llm_call_event(
        self,
        input: Any,
        output: Any,
        tools: Sequence[Any] | None,
        call_id: str | None,
        started_at: datetime | None,
        latency_s: float | None,
        error: BaseException | None,
        attempts: Sequence[LLMCall] | None = None,
    ) -> tuple[LLMCall, dict[str, str], list[str]]:
        blobs: dict[str, str] = {}
        try:
            messages = lc.as_messages(input)
        except (TypeError, ValueError, NotImplementedError):
            if error is None:
                raise
            messages = []  # the call failed on its unusable input: keep the error
        fields: dict[str, Any] = {
            "call_id": call_id or new_id(),
            "input": [self._message_blob(m, blobs) for m in messages],
            "tools": self._blob(blob_json(_openai_tools(tools)), blobs) if tools else None,
            "latency_s": latency_s,
            "started_at": started_at or datetime.now(UTC),
            "model": self.inference_model_name,
        }
        if isinstance(output, dict) and "raw" in output:  # with_structured_output(include_raw)
            output = output["raw"]
        if output is not None and not isinstance(output, AIMessage):
            raise InvalidEventError(
                f"an LLM call's output is the AIMessage the chat model returned, not a "
                f"{type(output).__name__}"
            )
        if output is not None:
            metadata = output.response_metadata or {}
            prompt_tokens, completion_tokens = lc.token_usage(output)
            fields |= {
                "output": self._message_blob(output, blobs),
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "finish_reason": metadata.get("finish_reason"),
                "tool_calls": self._json(lc.tool_calls_of(output), "tool calls"),
                "num_logprobs": lc.count_logprobs(output),
                "model": metadata.get("model_name") or self.inference_model_name,
            }
        same = self._same_call(messages, output, attempts)
        if same is not None:  # recorded from HTTP already: this record replaces it
            fields["supersedes"] = same.call_id
            fields["stream"], fields["art_exchange"] = same.stream, same.art_exchange
            fields["replayed_from"] = same.replayed_from  # served from a record: a copy still
            if started_at is None and latency_s is None:
                fields["started_at"], fields["latency_s"] = same.started_at, same.latency_s
        if error is not None:
            fields["error_type"] = type(error).__name__
            fields["error_message"] = self.redact(str(error) or repr(error))
        return LLMCall(index=0, **fields), blobs, []  # validated here, numbered when submitted

    def _same_call(
        self, messages: list[BaseMessage], output: Any, attempts: Sequence[LLMCall] | None
    ) -> LLMCall | None:
        """The HTTP record of the call a LangChain record records (taken), if any."""
        if attempts is None:
            return self._superseded(call_keys(messages, output)) if output is not None else None
        last = attempts[-1] if attempts else None
        if last is None or (last.error_type is None) != (output is not None):
            return None  # its outcome was not recorded from HTTP (only ART's capture does)
        with self.numbering:
            self._taken.add(last.call_id)
        return last

    def _queue_llm_call(
        self, event: LLMCall, blobs: dict[str, str], handoff: bool = False
    ) -> asyncio.Future[AppendResult] | None:
        """On the store's loop: queue the call's append, in arrival order."""
        try:
            if self._ended:
                return None  # never: the block's exit waits for calls on their way
            new_blobs = {h: body for h, body in blobs.items() if h not in self._sent_blobs}
            future = self._append(event, new_blobs)
            self._sent_blobs.update(new_blobs)
            return future
        except Exception as exc:
            if not handoff:
                raise
            self._handoff_error = exc  # raised by the block's exit: nobody else can see it
        finally:
            if handoff:
                self._handoff_done()

    def _handoff_done(self) -> None:
        with self._handoffs_lock:
            self._handoffs -= 1

    def _message_blob(self, message: BaseMessage, blobs: dict[str, str]) -> str:
        """The message as it is now (by value: an in-place edit since the last call shows)."""
        if isinstance(message, AIMessage) and self.redact:
            message = self._without_spelled_secrets(message)
        return self._blob(lc.dump_message(message), blobs)

    def _without_spelled_secrets(self, message: AIMessage) -> AIMessage:
        """The message with logprob tokens that spell a secret rewritten (see redaction)."""
        metadata = message.response_metadata or {}
        logprobs = metadata.get("logprobs")
        if not isinstance(logprobs, dict):
            return message
        changed = {}
        for key in ("content", "refusal"):
            entries = logprobs.get(key)
            if isinstance(entries, list):
                rewritten = self.redact.token_logprobs(entries)
                if rewritten is not None:
                    changed[key] = rewritten
        if not changed:
            return message
        metadata = {**metadata, "logprobs": {**logprobs, **changed}}
        return message.model_copy(update={"response_metadata": metadata})

    def _blob(self, text: str, blobs: dict[str, str]) -> str:
        body = self.redact(text)
        digest = blob_hash(body)
        if digest not in self._sent_blobs:
            blobs[digest] = body
        return digest

    def _append(
        self, event: Any, blobs: dict[str, str] | None = None, check: RolloutCheck | None = None
    ) -> asyncio.Future:
        conditions: list[Callable[[Any], None]] = []
        if check is not None:
            conditions.append(lambda c: check(c, event))
        previous = self._event_ids.get(self._version)
        if self._chained and previous is not None:
            conditions.append(follows(self.stream_id, self._version, previous))

        def condition(connection: Any) -> None:
            for each in conditions:
                each(connection)

        future = self.store.append_nowait(
            self.stream_id,
            [event],
            expected_version=self._version,
            blobs=blobs,
            condition=condition if conditions else None,
        )
        self._version += 1
        self._event_ids[self._version] = event.event_id
        self._pending.append(future)
        return future

    def _json(self, value: Any, what: str) -> Any:
        """`value` as stored: JSON, secrets redacted; a clear error if it is not JSON."""
        try:
            text = canonical_json(to_json_value(value))
        except (TypeError, ValueError) as exc:
            raise InvalidEventError(f"the {what} is not JSON-serializable: {exc}") from None
        return json.loads(self.redact(text)) if self.redact else json.loads(text)

    async def _settle(self) -> None:
        """Wait until every call recorded so far, from any thread, is committed."""
        while self._handoffs > 0:  # calls of worker threads still on their way to the loop
            await asyncio.sleep(0.001)
        if self._handoff_error is not None:
            error, self._handoff_error = self._handoff_error, None
            raise error
        pending, self._pending = self._pending, []
        if not pending:
            return
        outcomes = await asyncio.gather(*pending, return_exceptions=True)
        stored = [o.version for o in outcomes if not isinstance(o, BaseException)]
        self._stored_version = max([self._stored_version, *stored])
        failed = next((o for o in outcomes if isinstance(o, BaseException)), None)
        if failed is not None:
            # The appends queued after a refused one counted it in their expected version
            # and were refused too: the stream ends at the last one stored.
            self._version = self._stored_version
            raise failed

    def _failure(
        self, exc: BaseException, duration_s: float, *, compact: bool = False
    ) -> RolloutFailed:
        message = self.redact(str(exc) or repr(exc))
        return RolloutFailed(
            rollout_id=self.id,
            error_type=type(exc).__name__,
            error_message=message[:500] if compact else message,
            traceback="" if compact else self.redact("".join(traceback.format_exception(exc))),
            duration_s=duration_s,
        )

    async def _record_failure(
        self, exc: BaseException, duration_s: float, check: RolloutCheck | None
    ) -> None:
        """`rollout.failed`, stored (its traceback left out when there is no room for it)."""
        self._append(self._failure(exc, duration_s), check=check)
        try:
            await self._settle()  # when even this fails, the caller gets its error
        except StorageFullError:  # no room for a traceback: the cause alone may fit
            self._append(self._failure(exc, duration_s, compact=True), check=check)
            await self._settle()

    def begin(self, started: RolloutStarted, check: RolloutCheck | None = None) -> None:
        """Queue `rollout.started` (`check` fences every end of this rollout too)."""
        self._chained = check is not None
        self._append(started, check=check)
        self._clock = time.monotonic()

    async def finish(self, check: RolloutCheck | None = None) -> None:
        """Record `rollout.finished` once every call on its way is stored (calls closed)."""
        finished = RolloutFinished(
            rollout_id=self.id,
            result=self._json(self.result, "agent's result"),
            duration_s=time.monotonic() - self._clock,
            metrics=self._json(self.metrics, "metrics"),
            metadata=self._json(self.metadata, "metadata"),
            logs=[self.redact(line) for line in self.logs],
        )
        await self._settle()
        self._ended = True
        # Checked above: the end of the stream is never missing (unless `check` refuses).
        self._append(finished, check=check)
        await self._settle()

    async def fail(self, exc: BaseException, check: RolloutCheck | None = None) -> None:
        """Record `rollout.failed` for `exc` (which the caller raises); nothing when not even
        `rollout.started` was stored (there is no rollout to fail then), or when its store
        was closed under it (`abandon` failed it then)."""
        if self._abandoned:
            return
        with contextlib.suppress(Exception):
            await self._settle()
        self._ended = True
        if self._stored_version == 0:
            return
        await self._record_failure(exc, time.monotonic() - self._clock, check)

    async def abandon(self, exc: BaseException) -> None:
        """End the rollout now, from outside its block (its store is closing): the calls on
        their way recorded as incomplete, then `rollout.failed` for `exc`, unless it has
        ended already. The block, when it exits later, records nothing more."""
        if self._ended:
            self.closed = True
            return
        self.end_open_calls()
        self.closed = True
        await self.fail(exc)
        self._abandoned = True

    async def settle(self) -> None:
        """Wait until every append queued so far is committed (raises a refused one)."""
        await self._settle()

    def _started(
        self,
        scenario: Any,
        *,
        run: str | None,
        group_id: str | None,
        scenario_index: int | None,
        role: Literal["policy", "validation"],
        policy_step: int | None,
    ) -> RolloutStarted:
        return RolloutStarted(
            rollout_id=self.id,
            run=run,
            group_id=group_id,
            scenario=self._json(scenario, "scenario"),
            scenario_index=scenario_index,
            model=self.model_name,
            role=role,
            policy_step=policy_step,
            inference_model_name=self.inference_model_name,
            inference_base_url=redact_url(self.inference_base_url)
            if self.inference_base_url
            else None,
            started_at=datetime.now(UTC),
            resumes=self.replay.resumes if self.replay is not None else None,
        )


def open_rollout(
    store: EventStore,
    model: Any,
    *,
    scenario: Any = None,
    run: str | None = None,
    group_id: str | None = None,
    scenario_index: int | None = None,
    role: Literal["policy", "validation"] = "policy",
    policy_step: int | None = None,
    rollout_id: str | None = None,
    check: RolloutCheck | None = None,
    replay: Replay | None = None,
) -> Rollout:
    """A rollout whose `rollout.started` is queued: end it with `finish()` or `fail()`.

    What `rollout()` does around its block, for a caller whose rollout outlives one
    block (`artstore serve` records the calls of an agent elsewhere through it).
    """
    recorder = Rollout(
        store,
        rollout_id=rollout_id or new_id(),
        model_name=getattr(model, "name", None) or str(model),
        inference_base_url=getattr(model, "inference_base_url", None),
        inference_api_key=getattr(model, "inference_api_key", None),
        inference_model_name=getattr(model, "inference_model_name", None),
    )
    # The store checks every event it writes for the model's key too, whatever made it.
    store.redact.add([recorder.inference_api_key], urls=[recorder.inference_base_url])
    recorder.replay = replay
    started = recorder._started(
        scenario,
        run=run,
        group_id=group_id,
        scenario_index=scenario_index,
        role=role,
        policy_step=policy_step,
    )
    recorder.begin(started, check)
    return recorder


@asynccontextmanager
async def rollout(
    store: EventStore,
    model: Any,
    *,
    scenario: Any = None,
    run: str | None = None,
    group_id: str | None = None,
    scenario_index: int | None = None,
    role: Literal["policy", "validation"] = "policy",
    policy_step: int | None = None,
    rollout_id: str | None = None,
    check: RolloutCheck | None = None,
    resumes: str | None = None,
) -> AsyncIterator[Rollout]:
    """Record a rollout of `model` (an `art.Model`, or anything with its inference fields).

    `resumes`: the id of an earlier attempt that did not finish, whose recorded calls are
    served back to the agent while its requests match them (`artstore.capture.replay`).
    """
    http.install()  # once: OpenAI-compatible calls of the block are recorded from HTTP
    replay = None
    if resumes is not None:
        replay = await load_replay(store, rollout_stream(resumes), resumes)
    recorder = open_rollout(
        store,
        model,
        scenario=scenario,
        run=run,
        group_id=group_id,
        scenario_index=scenario_index,
        role=role,
        policy_step=policy_step,
        rollout_id=rollout_id,
        check=check,
        replay=replay,
    )
    token = CURRENT_ROLLOUT.set(recorder)
    art_token = _install_art_logger(recorder)
    open_blocks = _OPEN_BLOCKS.setdefault(store, set())
    open_blocks.add(recorder)
    try:
        try:
            yield recorder
        finally:
            _reset(token, art_token)
            recorder.end_open_calls()
            recorder.closed = True  # no new calls; those on their way are still recorded
        await recorder.finish(check)
    except BaseException as exc:  # the agent failed, its result is unusable, or a write was
        await recorder.fail(exc, check)  # refused: `exc` says why, record it
        raise
    finally:
        open_blocks.discard(recorder)


def _install_art_logger(recorder: Rollout) -> tuple[contextvars.ContextVar, contextvars.Token]:
    """Point ART's own `art.langgraph` at this rollout, so agents written for it are recorded."""
    llm_wrapper = art_module("langgraph.llm_wrapper")
    token = llm_wrapper.CURRENT_CONFIG.set(
        {
            "logger": ArtLogger(recorder),
            "base_url": recorder.inference_base_url,
            "api_key": recorder.inference_api_key,
            "model": recorder.inference_model_name,
        }
    )
    return llm_wrapper.CURRENT_CONFIG, token


def _reset(token: contextvars.Token, art: tuple[contextvars.ContextVar, contextvars.Token]) -> None:
    CURRENT_ROLLOUT.reset(token)
    art[0].reset(art[1])


def call_keys(messages: list[BaseMessage], output: AIMessage) -> list[str]:
    """The keys an HTTP record of the call that returned `output` is found by."""
    response_id = (output.response_metadata or {}).get("id")
    return matching.keys(response_id, matching.answer_key_of_message(len(messages), output))


class ArtLogger:
    """Stands where ART's `FileLogger` stood: `log(name, entry)` records an LLM call event.

    ART's wrapper logs only successful calls, after they were made, and cannot time them.
    Its calls go through `ChatOpenAI`, so the HTTP capture records each one first (failed
    ones included); the logged record then supersedes the HTTP one, with its start time
    and latency (`Rollout.record_llm_call`).
    """

    def __init__(self, recorder: Rollout) -> None:
        self.recorder = recorder

    def log(self, name: str, entry: dict[str, Any]) -> None:
        self.recorder.record_llm_call(
            entry["input"], entry["output"], tools=entry.get("tools"), call_id=name
        )
