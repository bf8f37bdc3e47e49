"""Reading a request's body within the server's limit (413 past it, nothing read on)."""

from __future__ import annotations

import json
from typing import Any

from starlette.requests import Request

from artstore.serve.errors import Refused

DEFAULT_MAX_BODY_BYTES = 32 * 1024 * 1024  # a long conversation with images fits


async def read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise _too_large(limit)
    body = bytearray()
    async for chunk in request.stream():
        body.extend(chunk)
        if len(body) > limit:
            raise _too_large(limit)
    return bytes(body)


async def read_json_object(request: Request, limit: int) -> dict[str, Any]:
    """The body as a JSON object (an empty body is `{}`); 400 for anything else."""
    body = await read_body(request, limit)
    if not body.strip():
        return {}
    try:
        value = json.loads(body)
    except ValueError as exc:
        raise Refused(400, "invalid_json", f"the body is not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise Refused(400, "invalid_json", "the body must be a JSON object")
    return value


def _too_large(limit: int) -> Refused:
    return Refused(413, "body_too_large", f"the request body is over {limit} bytes")
