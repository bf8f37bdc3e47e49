"""A rollout: one run of an agent on one scenario, recorded as a stream of events.

    async with store.rollout(model, scenario=scenario) as rollout:
        rollout.result = await agent(scenario)

Inside the block every LLM call made through `artstore.langgraph.init_chat_model`, or
through ART's own `art.langgraph.init_chat_model`, becomes an `llm.call` event of this
rollout. Calls are handed to the store's writer without waiting for a commit; the block's
exit waits for all of them and records `rollout.finished` (or `rollout.failed`, and the
exception still reaches the caller), so a rollout is durable once its block has exited.
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import threading
import time
import traceback
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Literal

from artstore.capture import messages as lc
from artstore.capture.redaction import Redactor
from artstore.errors import InvalidEventError
from artstore.events import (
    LLMCall,
    RolloutFailed,
    RolloutFinished,
    RolloutStarted,
    new_id,
)
from artstore.eventstore.blobs import blob_hash, canonical_json
from artstore.urls import redact

if TYPE_CHECKING:
    from artstore.eventstore.store import AppendResult, EventStore

CURRENT_ROLLOUT: contextvars.ContextVar[Rollout | None] = contextvars.ContextVar(
    "artstore_current_rollout", default=None
)


def current_rollout() -> Rollout | None:
    """The rollout whose block the caller runs in, if any."""
    return CURRENT_ROLLOUT.get()


def rollout_stream(rollout_id: str) -> str:
    return f"rollout-{rollout_id}"


class Rollout:
    """The recorder of one rollout. Set `result` (JSON-serializable) before the block exits."""

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
        self.redact = Redactor([inference_api_key])
        self._version = 0
        self._calls = 0
        self._pending: list[asyncio.Future[AppendResult]] = []
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self._known_blobs: set[str] = set()

    @property
    def stream_id(self) -> str:
        return rollout_stream(self.id)

    def log(self, message: str) -> None:
        """A line for the trajectory's `logs`, as `art.Trajectory.log`."""
        self.logs.append(message)

    # --- recording ----------------------------------------------------------------------

    def record_llm_call(
        self,
        input: Any,
        output: Any,
        *,
        tools: Sequence[dict[str, Any]] | None = None,
        call_id: str | None = None,
        started_at: datetime | None = None,
        latency_s: float | None = None,
        error: BaseException | None = None,
    ) -> None:
        """Record one LLM call; callable from the rollout's task or from any thread.

        The messages are serialised here, in the caller's thread; the append is queued
        and its commit awaited when the rollout's block exits.
        """
        blobs: dict[str, str] = {}
        input_hashes = [self._blob(lc.to_json(m), blobs) for m in lc.as_messages(input)]
        tools_hash = self._blob(list(tools), blobs) if tools else None
        fields: dict[str, Any] = {}
        if output is not None:
            output = output.get("raw", output) if isinstance(output, dict) else output
            prompt_tokens, completion_tokens = lc.token_usage(output)
            fields = {
                "output": self._blob(lc.to_json(output), blobs),
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "finish_reason": (output.response_metadata or {}).get("finish_reason"),
                "tool_calls": [
                    {"id": c.get("id"), "name": c["name"], "args": c.get("args")}
                    for c in getattr(output, "tool_calls", None) or []
                ],
                "num_logprobs": lc.count_logprobs(output),
                "model": (output.response_metadata or {}).get("model_name"),
            }
        if error is not None:
            fields["error_type"] = type(error).__name__
            fields["error_message"] = self.redact(str(error))
        started = started_at or datetime.now(UTC)

        def queue() -> None:
            event = LLMCall(
                call_id=call_id or new_id(),
                index=self._calls,
                input=input_hashes,
                tools=tools_hash,
                latency_s=latency_s,
                started_at=started,
                **{"model": self.inference_model_name, **fields},
            )
            self._calls += 1
            self._append(event, blobs)

        if threading.get_ident() == self._loop_thread:
            queue()
        else:  # a sync LangChain call in a worker thread: hand over to the store's loop
            self._loop.call_soon_threadsafe(queue)

    def _blob(self, value: Any, blobs: dict[str, str]) -> str:
        body = self.redact(canonical_json(value))
        digest = blob_hash(body)
        if digest not in self._known_blobs:
            self._known_blobs.add(digest)
            blobs[digest] = body
        return digest

    def _append(self, event: Any, blobs: dict[str, str] | None = None) -> asyncio.Future:
        future = self.store.append_nowait(
            self.stream_id, [event], expected_version=self._version, blobs=blobs
        )
        self._version += 1
        self._pending.append(future)
        return future

    def _json(self, value: Any, what: str) -> Any:
        """`value` as stored: JSON, secrets redacted; a clear error if it is not JSON."""
        try:
            text = canonical_json(value)
        except (TypeError, ValueError) as exc:
            raise InvalidEventError(f"the {what} is not JSON-serializable: {exc}") from None
        return json.loads(self.redact(text))

    async def _settle(self) -> None:
        pending, self._pending = self._pending, []
        if pending:
            await asyncio.gather(*pending)


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
) -> AsyncIterator[Rollout]:
    """Record a rollout of `model` (an `art.Model`, or anything with its inference fields)."""
    recorder = Rollout(
        store,
        rollout_id=rollout_id or new_id(),
        model_name=getattr(model, "name", None) or str(model),
        inference_base_url=getattr(model, "inference_base_url", None),
        inference_api_key=getattr(model, "inference_api_key", None),
        inference_model_name=getattr(model, "inference_model_name", None),
    )
    started = RolloutStarted(
        rollout_id=recorder.id,
        run=run,
        group_id=group_id,
        scenario=recorder._json(scenario, "scenario"),
        scenario_index=scenario_index,
        model=recorder.model_name,
        role=role,
        policy_step=policy_step,
        inference_model_name=recorder.inference_model_name,
        inference_base_url=redact(recorder.inference_base_url)
        if recorder.inference_base_url
        else None,
        started_at=datetime.now(UTC),
    )
    recorder._append(started)
    clock = time.monotonic()
    token = CURRENT_ROLLOUT.set(recorder)
    art_token = _install_art_logger(recorder)
    try:
        yield recorder
    except BaseException as exc:
        _reset(token, art_token)
        await recorder._settle()
        recorder._append(
            RolloutFailed(
                rollout_id=recorder.id,
                error_type=type(exc).__name__,
                error_message=recorder.redact(str(exc)),
                traceback=recorder.redact("".join(traceback.format_exception(exc))),
                duration_s=time.monotonic() - clock,
            )
        )
        await recorder._settle()
        raise
    _reset(token, art_token)
    try:
        finished = RolloutFinished(
            rollout_id=recorder.id,
            result=recorder._json(recorder.result, "agent's result"),
            duration_s=time.monotonic() - clock,
            metrics=recorder.metrics,
            metadata=recorder.metadata,
            logs=[recorder.redact(line) for line in recorder.logs],
        )
    except Exception as exc:  # an unusable result fails the rollout, recorded as such
        await recorder._settle()
        recorder._append(
            RolloutFailed(
                rollout_id=recorder.id,
                error_type=type(exc).__name__,
                error_message=str(exc),
                traceback="".join(traceback.format_exception(exc)),
                duration_s=time.monotonic() - clock,
            )
        )
        await recorder._settle()
        raise
    await recorder._settle()
    recorder._append(finished)
    await recorder._settle()


def _install_art_logger(recorder: Rollout) -> tuple[contextvars.ContextVar, contextvars.Token]:
    """Point ART's own `art.langgraph` at this rollout, so agents written for it are recorded."""
    from art.langgraph import llm_wrapper

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


class ArtLogger:
    """Stands where ART's `FileLogger` stood: `log(name, entry)` records an LLM call event."""

    def __init__(self, recorder: Rollout) -> None:
        self.recorder = recorder

    def log(self, name: str, entry: dict[str, Any]) -> None:
        self.recorder.record_llm_call(
            entry["input"], entry["output"], tools=entry.get("tools"), call_id=name
        )
