"""Every OpenAI-compatible call an agent makes inside a rollout, recorded from its bytes.

Inside `async with store.rollout(...)`, a POST to `.../chat/completions` (and to ART's
other captured APIs: `/completions`, `/responses`, `/messages`) made through httpx, which
is what the `openai` clients use (`AsyncOpenAI`, `OpenAI`, ART's `model.openai_client()`,
LangChain's `ChatOpenAI`), becomes an `llm.call` event of the rollout (`source="http"`):
the request as sent, the response as received (streamed or not), latency, and failures
(an HTTP error status, a timeout, a dropped connection, a stream closed early: the error,
and whatever of the response had arrived; the exception still reaches the agent,
unchanged). The agent is not changed.

Why at the HTTP layer rather than by wrapping the openai SDK's `create`:

- the request and response bytes are what the model received and returned: key order,
  every character and every float, streams included, whatever the client (the SDK's
  `with_raw_response`, ART's proxy, LangChain, a hand-made `httpx` call);
- ART >= 0.5.20 captures `Trajectory.exchanges` the same way (hooks on
  `httpx.Client.send` / `AsyncClient.send` and the response's byte iterators), so a call
  ART captured is rebuilt by ART's own `build_exchange` from the very bytes ART parsed.
  artstore installs ART's hooks first and its own around them: when artstore sees a
  response complete, ART has already put it in its trajectory, and artstore takes ART's
  start and end times from there (the event's `art_exchange` says ART captured it).

Only httpx is hooked: a call made with `aiohttp` or `requests` (which ART's own capture
also hooks) is not recorded.

The hooks are installed once, lazily (at the first rollout), and record only while a
rollout is current in the calling context (a context variable: concurrent rollouts never
mix calls; `asyncio.to_thread` and LangGraph's threads copy the context). They never
change a request or a response, and a failure to record never reaches the agent: it is
raised by the rollout's block when it exits (the rollout is then recorded as failed).

No request is recorded twice, and none is left out: ART's `init_chat_model` logs each
call after it was sent, and that record names the HTTP one it supersedes (the same
response id, or for a response LangChain streamed, which keeps no id, the same answer:
`artstore.capture.matching`). artstore's own `init_chat_model` records its calls itself,
inside `attempts()`: there only the requests that failed (the openai SDK retries some)
are recorded from HTTP, and the chat model's record of a failed call supersedes the last
of them. Inside ART's own capture, calls are recorded from HTTP whatever made them (a
LangChain record then supersedes the HTTP one in `v_llm_calls`, and the HTTP one still
gives the exchange). Outside any rollout, inside ART's PipelineTrainer's rollout function
(`artstore.capture.group`), calls are recorded for the group's trajectories.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import json
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from datetime import UTC, datetime
from typing import Any

import httpx

from artstore import art_versions
from artstore.capture import credentials, matching
from artstore.capture import replay as replays
from artstore.capture.replay import RecordedCall
from artstore.capture.targets import CallTarget, current_target
from artstore.documents import exchanges as docs
from artstore.errors import NoRolloutError
from artstore.events import LLMCall, ReplayDiverged, new_id
from artstore.eventstore.blobs import blob_hash, blob_json

logger = logging.getLogger(__name__)

_RECORDING: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "artstore_http_recording", default=True
)
#: Set by ART's `model.openai_client()` around its calls (ART >= 0.5.20): its policy-span mode.
_ART_CLIENT: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "artstore_art_client", default=None
)
#: Set by `attempts()`: the HTTP records of the chat-model call in progress, collected.
_ATTEMPTS: contextvars.ContextVar[list[LLMCall] | None] = contextvars.ContextVar(
    "artstore_http_attempts", default=None
)
_CAPTURE = "_artstore_capture"  # the attribute of a response being recorded
_MAX_ERROR_BODY = 2000  # characters of an error response kept in the error message

_installed = False
_install_lock = threading.Lock()


@contextlib.contextmanager
def unrecorded() -> Iterator[None]:
    """Calls made inside are not recorded from HTTP (they are recorded another way, or not).

    Use this around an LLM call that is not the agent's (a judge, a summariser) made
    inside a rollout's block. A call that ART's own capture takes (inside
    `art.trajectory(...)`) is recorded all the same, if it succeeded: the rollout's
    trajectory is then ART's exchanges, and must hold it as ART's does.
    """
    token = _RECORDING.set(False)
    try:
        yield
    finally:
        _RECORDING.reset(token)


@contextlib.contextmanager
def attempts() -> Iterator[list[LLMCall]]:
    """A call that records itself, made inside: the HTTP requests it sends, as records.

    For a chat model that records each of its calls itself (artstore's `init_chat_model`)
    while its client may send several requests for one call (the openai SDK retries a
    failed request). Inside, as in `unrecorded()`, a successful request is recorded from
    HTTP only where ART's own capture takes it; a failed one is always recorded (each is
    a request the server received). The list holds these records, in order: the chat
    model's own record supersedes the last one when that is the same outcome
    (`Rollout.record_llm_call(..., attempts=...)`), so each request is one row.
    """
    found: list[LLMCall] = []
    token, collecting = _RECORDING.set(False), _ATTEMPTS.set(found)
    try:
        yield found
    finally:
        _ATTEMPTS.reset(collecting)
        _RECORDING.reset(token)


def install() -> None:
    """Hook httpx (once, idempotently): the capture described in the module docstring."""
    global _installed
    if _installed:
        return
    with _install_lock:
        if _installed:
            return
        credentials.install()  # the keys of every request learned before it is sent
        art_versions.install_art_capture()  # ART's hooks first: ours go around them
        art_versions.mark_art_client_calls(_ART_CLIENT)
        _hook_httpx()
        _installed = True


def _hook_httpx() -> None:
    _hook_send()
    _hook_response()


def _hook_send() -> None:
    """httpx's clients send through a capture: a request, its response or its error."""
    original_send = httpx.Client.send
    original_async_send = httpx.AsyncClient.send

    def send(self: httpx.Client, request: httpx.Request, **kwargs: Any) -> httpx.Response:
        served = _replayed(request)
        if served is not None:
            return original_send(_answering(served), request, **kwargs)
        capture = _begin(request)
        if capture is None:
            return original_send(self, request, **kwargs)
        try:
            response = original_send(self, request, **kwargs)
        except BaseException as exc:
            capture.finish(exc)
            raise
        capture.received(response, streaming=bool(kwargs.get("stream")))
        return response

    async def async_send(
        self: httpx.AsyncClient, request: httpx.Request, **kwargs: Any
    ) -> httpx.Response:
        served = _replayed(request)
        if served is not None:
            return await original_async_send(_answering_async(served), request, **kwargs)
        capture = _begin(request)
        if capture is None:
            return await original_async_send(self, request, **kwargs)
        try:
            response = await original_async_send(self, request, **kwargs)
        except BaseException as exc:
            capture.finish(exc)
            raise
        capture.received(response, streaming=bool(kwargs.get("stream")))
        return response

    httpx.Client.send = send  # type: ignore[method-assign]
    httpx.AsyncClient.send = async_send  # type: ignore[method-assign]


# A served answer goes through the `send` beneath artstore's hook, as a sent request does,
# on a client whose transport hands back the record: ART's own capture (hooked there, on
# ART >= 0.5.20) puts it in `Trajectory.exchanges`, and httpx reads it unless streamed.
def _answering(served: httpx.Response) -> httpx.Client:
    return httpx.Client(transport=httpx.MockTransport(lambda _: served))


def _answering_async(served: httpx.Response) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.MockTransport(lambda _: served))


def _hook_response() -> None:
    """A streamed response's bytes go to its capture as they are read; closing ends it."""
    original_iter = httpx.Response.iter_bytes
    original_aiter = httpx.Response.aiter_bytes
    original_close = httpx.Response.close
    original_aclose = httpx.Response.aclose

    def iter_bytes(self: httpx.Response, chunk_size: int | None = None) -> Iterator[bytes]:
        capture: _Capture | None = getattr(self, _CAPTURE, None)
        if capture is None or capture.done:
            yield from original_iter(self, chunk_size)
            return
        error: BaseException | None = None
        try:
            for chunk in original_iter(self, chunk_size):
                capture.add(chunk)
                yield chunk
        except GeneratorExit:
            raise
        except BaseException as exc:
            error = exc
            raise
        finally:
            capture.finish(error)

    async def aiter_bytes(
        self: httpx.Response, chunk_size: int | None = None
    ) -> AsyncIterator[bytes]:
        capture: _Capture | None = getattr(self, _CAPTURE, None)
        if capture is None or capture.done:
            async for chunk in original_aiter(self, chunk_size):
                yield chunk
            return
        error: BaseException | None = None
        try:
            async for chunk in original_aiter(self, chunk_size):
                capture.add(chunk)
                yield chunk
        except GeneratorExit:
            raise
        except BaseException as exc:
            error = exc
            raise
        finally:
            capture.finish(error)

    def close(self: httpx.Response) -> None:
        original_close(self)
        capture: _Capture | None = getattr(self, _CAPTURE, None)
        if capture is not None:
            capture.finish()

    async def aclose(self: httpx.Response) -> None:
        await original_aclose(self)
        capture: _Capture | None = getattr(self, _CAPTURE, None)
        if capture is not None:
            capture.finish()

    httpx.Response.iter_bytes = iter_bytes  # type: ignore[method-assign]
    httpx.Response.aiter_bytes = aiter_bytes  # type: ignore[method-assign]
    httpx.Response.close = close  # type: ignore[method-assign]
    httpx.Response.aclose = aclose  # type: ignore[method-assign]


def _replayed(request: httpx.Request) -> httpx.Response | None:
    """The earlier attempt's answer to `request`, when the current rollout resumes one and
    this is the request it recorded at this position (`artstore.capture.replay`), else None:
    send it."""
    target = current_target()
    if target is None or target.replay is None or target.closed or not _RECORDING.get():
        return None
    try:
        return _serve(target, request)
    except Exception as exc:  # never the agent's problem; the rollout's block raises it
        target.capture_failed(exc)
        return None


def _serve(target: CallTarget, request: httpx.Request) -> httpx.Response | None:
    replay = target.replay
    if request.method != "POST" or replay is None or replay.live:
        return None
    endpoint = docs.endpoint_for_url(str(request.url))
    if endpoint is None:
        return None
    try:
        body = json.loads(request.content)
    except (httpx.RequestNotRead, ValueError):
        return None
    if not isinstance(body, dict):
        return None
    served = serve_recorded(target, endpoint, body)
    return replays.response_for(request, served[0]) if served is not None else None


def serve_recorded(
    target: CallTarget, endpoint: str, body: dict[str, Any]
) -> tuple[RecordedCall, asyncio.Future | None] | None:
    """The recorded call to answer `body` with, when `target` resumes an earlier attempt
    and this is the request that attempt recorded at this position, with the append of
    its copy (queued here); else None: send the request (a divergence is recorded)."""
    replay = target.replay
    if replay is None or replay.live:
        return None
    started_at = datetime.now(UTC)
    found = replay.take(replays.stored_form(body, target.redact), target.id)
    if isinstance(found, ReplayDiverged):
        target.submit_event(found)
        return None
    if found is None or found.event.endpoint != endpoint:
        return None
    event = replays.replayed_event(found, started_at)
    if art_versions.art_capture_target() is not None:  # ART captures it as it is served
        event = event.model_copy(update={"art_exchange": True})
    keys = []
    if event.stream and endpoint == "chat_completions":
        keys = matching.keys(None, matching.answer_key_of_response(body, found.response))
    keys = matching.keys(docs.response_id(found.response), None) + keys
    return found, target.submit_call(lambda: (event, {}, keys), _current_task())


def _begin(request: httpx.Request) -> _Capture | None:
    """A capture for `request` when it is an LLM call of the current rollout (or of the
    group being rolled out, `artstore.capture.group`), else None."""
    rollout = current_target()
    try:
        return _capture_for(rollout, request)
    except Exception as exc:  # never the agent's problem; the rollout's block raises it
        if rollout is not None:
            rollout.capture_failed(exc)
        return None


def _capture_for(rollout: CallTarget | None, request: httpx.Request) -> _Capture | None:
    if rollout is None or rollout.closed or request.method != "POST":
        return None
    endpoint = docs.endpoint_for_url(str(request.url))
    if endpoint is None:
        return None
    if (
        not _RECORDING.get()
        and _ATTEMPTS.get() is None
        and art_versions.art_capture_target() is None
    ):
        return None  # recorded another way, or not at all (unless ART captures it: see below)
    try:
        body = json.loads(request.content)
    except (httpx.RequestNotRead, ValueError):
        return None  # a streamed or non-JSON request body: not an API call we know
    if not isinstance(body, dict):
        return None
    capture = _Capture(rollout, endpoint, body)
    with rollout.numbering:  # open until its response is whole (`finish`)
        rollout.open_calls.add(capture)
    return capture


def _current_task() -> asyncio.Task | None:
    """The asyncio task running here, None in a thread without an event loop."""
    try:
        return asyncio.current_task()
    except RuntimeError:
        return None


class _Capture:
    """One call on its way: the request, and the response bytes as they arrive."""

    def __init__(self, rollout: CallTarget, endpoint: str, request: dict[str, Any]) -> None:
        self.rollout = rollout
        self.origin = _current_task()
        self.endpoint = endpoint
        self.request = request
        self.stream = request.get("stream") is True
        self.art_target = art_versions.art_capture_target()
        self.art_client = _ART_CLIENT.get() if endpoint == "chat_completions" else None
        self.recording = _RECORDING.get()  # False: `unrecorded()` or `attempts()`
        self.attempts = _ATTEMPTS.get()
        self.started_at = datetime.now(UTC)
        self.clock = time.perf_counter()
        self.status: int | None = None
        self.body = bytearray()
        self.done = False
        self.stored: asyncio.Future | None = None  # the record's append, once queued
        self._lock = threading.Lock()

    def received(self, response: httpx.Response, *, streaming: bool) -> None:
        """The response's head arrived (and, unless streamed, its whole body)."""
        try:
            self._received(response, streaming=streaming)
        except Exception as exc:  # never the agent's problem; the rollout's block raises it
            self.done = True
            self.rollout.capture_failed(exc)

    def _received(self, response: httpx.Response, *, streaming: bool) -> None:
        self.status = response.status_code
        if not streaming or response.is_stream_consumed:
            with contextlib.suppress(httpx.ResponseNotRead):
                self.add(response.content)
                self.finish()
                return
        setattr(response, _CAPTURE, self)  # the body is recorded as it is read
        with self.rollout.numbering:
            self.rollout.open_calls.add(self)

    def add(self, chunk: bytes) -> None:
        if self.done:
            return
        try:
            self._add(chunk)
        except Exception as exc:  # never the agent's problem; the rollout's block raises it
            self.done = True
            self.rollout.capture_failed(exc)

    def _add(self, chunk: bytes) -> None:
        start = max(0, len(self.body) - 32)
        self.body.extend(chunk)
        if (
            self.stream
            and self.status is not None
            and 200 <= self.status < 300
            and docs.sse_terminates(self.endpoint, bytes(self.body[start:]))
            and docs.stream_complete(self.endpoint, docs.parse_sse(bytes(self.body)))
        ):
            self.finish()  # as ART does: the call ends with its stream's final event

    def finish(self, error: BaseException | None = None) -> None:
        """Record the call (once): its response, or why it failed."""
        with self._lock:
            if self.done:
                return
            self.done = True
        with self.rollout.numbering:
            self.rollout.open_calls.discard(self)
        finished_at = datetime.now(UTC)
        latency_s = time.perf_counter() - self.clock
        body, self.body = bytes(self.body), bytearray()
        if not self.recording and not self._kept(self._failure(body, error) is not None):
            return
        try:
            self.stored = self.rollout.submit_call(
                lambda: self._event(body, error, finished_at, latency_s), self.origin
            )
        except NoRolloutError:
            logger.warning(
                "an LLM call to %s ended after its rollout %s had ended: not recorded",
                self.endpoint,
                self.rollout.id,
            )
        except Exception as exc:
            self.rollout.capture_failed(exc)

    def _kept(self, failed: bool) -> bool:
        """Whether a call made in `unrecorded()` or `attempts()` is recorded from HTTP."""
        if failed:  # ART keeps no exchange of a failed call
            return self.attempts is not None
        return self.art_target is not None

    # --- the event ------------------------------------------------------------------------

    def _event(
        self,
        body: bytes,
        error: BaseException | None,
        finished_at: datetime,
        latency_s: float,
    ) -> tuple[LLMCall, dict[str, str], list[str]]:
        redact = self.rollout.redact
        blobs: dict[str, str] = {}
        redacted: list[bool] = []

        def blob(value: Any) -> str:
            text = blob_json(value)
            stored = redact(text)
            redacted.append(stored != text)
            digest = blob_hash(stored)
            blobs[digest] = stored
            return digest

        inputs, tools, request = docs.split_request(self.request, blob)
        prompt_held_secret = any(redacted)
        model = self.request.get("model")
        fields: dict[str, Any] = {
            "call_id": new_id(),
            "index": 0,  # numbered when submitted
            "input": inputs,
            "tools": tools,
            "request": request,
            "source": "http",
            "endpoint": self.endpoint,
            "stream": self.stream,
            "model": model if isinstance(model, str) else None,
            "started_at": self.started_at,
            "finished_at": finished_at,
            "latency_s": latency_s,
            "art_client": self.art_client,
        }
        failure = self._failure(body, error)
        if failure is None:
            keys = self._answered(fields, body, blob, prompt_held_secret)
        else:
            keys = []
            fields["error_type"], message = failure
            fields["error_message"] = redact(message)
            if body:  # what arrived: the error the server sent, or the stream so far
                ok = self.status is not None and 200 <= self.status < 300
                document = docs.response_document(body, stream=self.stream and ok)
                fields["output"] = blob(
                    docs.redact_response(document, redact, prompt_held_secret=prompt_held_secret)
                )
        event = LLMCall(**fields)
        if self.attempts is not None:
            self.attempts.append(event)
        return event, blobs, keys

    def _answered(
        self,
        fields: dict[str, Any],
        body: bytes,
        blob: Callable[[Any], str],
        prompt_held_secret: bool,
    ) -> list[str]:
        """The fields of a call that succeeded (added to `fields`); its keys (`_keys`)."""
        redact = self.rollout.redact
        document = docs.response_document(body, stream=self.stream)
        response_id = docs.response_id(document)
        keys = self._keys(response_id, document)  # of the answer as LangChain got it
        document = docs.redact_response(document, redact, prompt_held_secret=prompt_held_secret)
        fields["output"] = blob(document)
        if self.endpoint == "chat_completions":
            summary = docs.call_summary(document)
            if summary.get("tool_calls"):  # arguments as the model wrote them: secrets out
                summary["tool_calls"] = json.loads(redact(blob_json(summary["tool_calls"])))
            fields |= {k: v for k, v in summary.items() if v is not None or k != "model"}
        fields |= self._art_exchange(response_id)
        return keys

    def _keys(self, response_id: str | None, document: dict[str, Any]) -> list[str]:
        """What a LangChain record of this call finds it by (`artstore.capture.matching`).

        LangChain keeps the response id of a response it got whole; of a streamed one, it
        keeps only the answer.
        """
        if self.attempts is not None:
            return []  # the chat model that made it knows it: `attempts()`
        answer = None
        if self.stream and self.endpoint == "chat_completions":
            answer = matching.answer_key_of_response(self.request, document)
        return matching.keys(response_id, answer)

    def _failure(self, body: bytes, error: BaseException | None) -> tuple[str, str] | None:
        """(error type, message) of a call that failed, or None."""
        if error is not None:
            return type(error).__name__, str(error) or repr(error)
        if self.status is None or not 200 <= self.status < 300:
            text = body.decode("utf-8", "replace")[:_MAX_ERROR_BODY]
            return "HTTPStatusError", f"HTTP {self.status}: {text}"
        if self.stream:
            events = docs.parse_sse(body)
            if not docs.stream_complete(self.endpoint, events):
                return (
                    "IncompleteStreamError",
                    f"the response stream was closed after {len(events)} events, "
                    "before its final one",
                )
        return None

    def _art_exchange(self, response_id: str | None) -> dict[str, Any]:
        """Whether ART's own capture took this call, with ART's start and end times."""
        if self.art_target is None:
            return {}
        exchange = self.rollout.claim_art_exchange(self.art_target, self.endpoint, response_id)
        if exchange is None:
            return {}
        return {
            "art_exchange": True,
            "started_at": exchange.start_time,
            "finished_at": exchange.end_time,
            "latency_s": (exchange.end_time - exchange.start_time).total_seconds(),
        }


class ProxiedCall(_Capture):
    """A call relayed by a proxy for a rollout (`artstore serve`), recorded as this module
    records a call made in-process: the same event, redaction and rules of completion.

    The proxy gives it the response's status (`status`), each chunk of the body as it
    relays it (`add`: a stream's record is queued as soon as its final event arrives),
    and `finish(error)` when the exchange ends; `stored` is then the record's append.
    """

    def __init__(self, target: CallTarget, endpoint: str, request: dict[str, Any]) -> None:
        super().__init__(target, endpoint, request)
        self.origin = None
        self.art_target = None  # no ART capture runs in the proxy's process for this call
        self.art_client = None
        self.recording, self.attempts = True, None
