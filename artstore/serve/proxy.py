"""Relaying an agent's OpenAI-compatible calls to the upstream server, recording each one.

A POST to an API that in-process capture records (`/chat/completions`, `/completions`,
`/responses`, `/messages`) made with a rollout's token becomes an `llm.call` of that
rollout, built by `artstore.capture.http.ProxiedCall`: the same event, redaction and
completion rules as a call made inside `store.rollout(...)`. A response that is not a
stream is returned once its record is committed. A stream is relayed chunk by chunk as it
arrives; its final event is held back until the call's record is committed, so an agent
that saw its stream end has its call stored. A client that leaves mid-stream leaves the
call recorded as incomplete (`IncompleteStreamError`); an upstream error status is relayed
as it came and recorded as a failed call; an upstream that cannot be reached is a 502,
recorded as a failed call too. Anything else (`GET /models`, other paths) is relayed and
not recorded.

The agent's own `Authorization` goes upstream unchanged (else the server's upstream key);
httpx's credential hook learns it before it is sent (`artstore.capture.credentials`), so
every record and log line is cleaned of it, as in-process.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

import httpx
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from artstore.capture.http import ProxiedCall, serve_recorded
from artstore.documents.exchanges import endpoint_for_url, response_body
from artstore.serve.errors import Refused, error_response
from artstore.serve.limits import read_body

if TYPE_CHECKING:
    from artstore.capture.replay import RecordedCall
    from artstore.serve.rollouts import Served

# Not relayed: hop-by-hop headers, and what httpx and Starlette set themselves.
_DROPPED = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
        "content-encoding",
        "accept-encoding",
        "x-artstore-rollout-token",
    }
)


class Proxy:
    """Relays requests to `upstream` (a base URL such as `http://host:8000/v1`)."""

    def __init__(self, upstream: str, *, api_key: str | None, max_body_bytes: int) -> None:
        self.upstream = upstream.rstrip("/")
        self.api_key = api_key
        self.max_body_bytes = max_body_bytes
        # No timeout: a long generation is the upstream's business, as for a direct call.
        self.client = httpx.AsyncClient(timeout=None, limits=httpx.Limits(max_connections=None))

    async def close(self) -> None:
        await self.client.aclose()

    async def relay(self, request: Request, path: str, served: Served | None) -> Response:
        body = await read_body(request, self.max_body_bytes)
        endpoint = endpoint_for_url("/" + path) if request.method == "POST" else None
        if endpoint is not None and served is None:
            raise Refused(
                401,
                "missing_rollout_token",
                "a call is recorded in a rollout: use the base URL the rollout's start "
                "returned (`/r/<rollout token>/v1`) or the X-Artstore-Rollout-Token header",
            )
        call = _call_for(served, endpoint, body) if endpoint is not None else None
        if served is not None and served.ending:
            raise Refused(409, "rollout_ended", f"rollout {served.recorder.id} has ended")
        if call is not None and endpoint is not None:
            recorded = serve_recorded(call.rollout, endpoint, call.request)
            if recorded is not None:  # the rollout resumes one that recorded this answer
                return await _answer_from_record(*recorded)
        outgoing = self.client.build_request(
            request.method,
            self.upstream + "/" + path.lstrip("/"),
            params=request.query_params.multi_items(),
            headers=self._headers(request),
            content=body,
        )
        if call is not None:
            _open(call)
        try:
            upstream = await self.client.send(outgoing, stream=True)
        except httpx.HTTPError as exc:
            if call is not None:
                call.finish(exc)
                await _stored(call)
            message = f"the upstream server could not be reached: {type(exc).__name__}"
            return error_response(502, "upstream_unreachable", message)
        if call is not None:
            call.status = upstream.status_code
        headers = {k: v for k, v in upstream.headers.items() if k.lower() not in _DROPPED}
        if call is not None and call.stream and _is_stream(upstream):
            return StreamingResponse(
                _relay_stream(upstream, call), status_code=upstream.status_code, headers=headers
            )
        try:
            content = await upstream.aread()
        except httpx.HTTPError as exc:
            if call is not None:
                call.finish(exc)
                await _stored(call)
            return error_response(502, "upstream_failed", f"the upstream failed: {exc}")
        finally:
            await upstream.aclose()
        if call is not None:
            call.add(content)
            call.finish()
            await _stored(call)
        return Response(content, status_code=upstream.status_code, headers=headers)

    def _headers(self, request: Request) -> dict[str, str]:
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _DROPPED}
        headers["accept-encoding"] = "identity"  # the bytes recorded are the bytes relayed
        if "authorization" not in headers and self.api_key:
            headers["authorization"] = f"Bearer {self.api_key}"
        return headers


def _call_for(served: Served | None, endpoint: str, body: bytes) -> ProxiedCall | None:
    if served is None:
        return None
    try:
        parsed = json.loads(body)
    except ValueError:
        return None  # not a call the upstream will answer: relayed, its error unrecorded
    if not isinstance(parsed, dict):
        return None
    return ProxiedCall(served.recorder, endpoint, parsed)


def _open(call: ProxiedCall) -> None:
    """The call is under way: ending its rollout now records it as incomplete."""
    with call.rollout.numbering:
        call.rollout.open_calls.add(call)


async def _answer_from_record(recorded: RecordedCall, stored: asyncio.Future | None) -> Response:
    """The answer the earlier attempt got, as it got it (a stream as a stream), once its
    copy in this rollout is committed."""
    if stored is None:
        raise Refused(503, "not_recorded", "the call could not be recorded; it was not served")
    try:
        await asyncio.shield(stored)
    except Exception as exc:
        message = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise Refused(503, "not_recorded", f"the call could not be recorded: {message}") from None
    headers = {"x-artstore-replayed-from": recorded.event.call_id}
    document = recorded.response
    if "sse" in document:
        chunks = [response_body({"sse": [event]}) for event in document["sse"]]
        return StreamingResponse(iter(chunks), media_type="text/event-stream", headers=headers)
    media_type = "application/json" if "json" in document else "text/plain"
    return Response(response_body(document), media_type=media_type, headers=headers)


def _is_stream(response: httpx.Response) -> bool:
    return response.headers.get("content-type", "").startswith("text/event-stream")


async def _stored(call: ProxiedCall) -> None:
    """Wait for the call's record to be committed; a 503 for the agent when it was not."""
    if call.stored is None:
        raise Refused(503, "not_recorded", "the call could not be recorded; it was not relayed")
    try:
        await asyncio.shield(call.stored)
    except Exception as exc:
        message = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise Refused(503, "not_recorded", f"the call could not be recorded: {message}") from None


async def _relay_stream(upstream: httpx.Response, call: ProxiedCall) -> AsyncIterator[bytes]:
    """The upstream's chunks as they arrive; the final one once the record is committed."""
    error: BaseException | None = None
    try:
        async for chunk in upstream.aiter_bytes():
            call.add(chunk)
            if call.done and call.stored is not None:
                with contextlib.suppress(Exception):  # the agent gets its stream all the same
                    await asyncio.shield(call.stored)
            yield chunk
    except httpx.HTTPError as exc:
        error = exc
        raise
    finally:
        call.finish(error)  # nothing when the final event recorded it already
        await upstream.aclose()
