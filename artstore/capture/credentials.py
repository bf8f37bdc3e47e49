"""The credentials this process sends over HTTP, learned before each request goes out.

Once a store is opened to write (or a rollout starts), every request an httpx client of
this process sends (the `openai` and `anthropic` clients, ART's `model.openai_client()`,
LangChain's `ChatOpenAI`, LiteLLM, a hand-made `httpx` call) is looked at before it is
sent, inside a rollout or not, and the credentials it carries are learned
(`artstore.redaction.learn`): from then on every Redactor of the process replaces them.
Whatever the agent does with a key afterwards (a tool result that quotes it, an exception
or a log line that holds it, a model that repeats it), anything artstore builds from that
is built later, and redacted.

What counts as a credential in a request:

- the `Authorization` and `Proxy-Authorization` headers: the credential after the scheme
  (`Bearer sk-...`), the whole value when it has no scheme, and for `Basic` also the
  password it encodes;
- any other header whose name says key, token, secret, password or auth (`api-key`,
  `x-api-key`, `x-goog-api-key`, `x-amz-security-token`, ...), `Idempotency-Key` aside;
- the values of the `Cookie` header;
- the URL's password and the values of its key-like query parameters (`?key=`,
  `api_key=`, `token=`, ...).

Only httpx is hooked (the capture of LLM calls hooks it too): a key sent only through
another HTTP library (`requests`, `aiohttp`), or sent before the store was opened, is not
seen this way (`artstore.redaction` lists the other ways artstore learns keys).
"""

from __future__ import annotations

import base64
import binascii
import logging
import re
import threading
from typing import Any

import httpx

from artstore.redaction import learn, secrets_in_url

logger = logging.getLogger(__name__)

_CREDENTIAL_HEADER = re.compile(rb"key|token|secret|passw|auth|cookie", re.I)
_NOT_A_CREDENTIAL = frozenset({"idempotency-key"})  # the openai SDK's retry marker

_installed = False
_install_lock = threading.Lock()


def credentials_of(request: httpx.Request) -> set[str]:
    """The credentials `request` carries (see the module docstring)."""
    url = request.url
    found = secrets_in_url(str(url)) if url.userinfo or url.query else set()
    encoding = request.headers.encoding
    for raw_name, raw_value in request.headers.raw:  # undecoded: most headers are no concern
        if not _CREDENTIAL_HEADER.search(raw_name):
            continue
        lowered, value = raw_name.decode(encoding).lower(), raw_value.decode(encoding)
        if lowered in _NOT_A_CREDENTIAL:
            continue
        if lowered in ("authorization", "proxy-authorization"):
            found |= _in_authorization(value)
        elif lowered == "cookie":
            found |= {part.partition("=")[2].strip() for part in value.split(";")}
        else:
            found.add(value.strip())
    return found


def _in_authorization(value: str) -> set[str]:
    scheme, _, credential = value.strip().partition(" ")
    credential = credential.strip()
    if not credential:
        return {scheme}  # a bare key, as some APIs take it
    found = {credential}
    if scheme.lower() == "basic":
        try:
            decoded = base64.b64decode(credential, validate=True).decode()
        except (binascii.Error, UnicodeDecodeError):
            return found
        found.add(decoded.partition(":")[2])  # user:password
    return found


def _learn_from(request: httpx.Request) -> None:
    try:
        learn(credentials_of(request))
    except Exception as exc:  # never the agent's problem; its type only: it may hold a key
        logger.warning("the credentials of a request could not be read (%s)", type(exc).__name__)


def install() -> None:
    """Look at every request httpx clients send from now on (once, idempotently)."""
    global _installed
    if _installed:
        return
    with _install_lock:
        if _installed:
            return
        original_send = httpx.Client.send
        original_async_send = httpx.AsyncClient.send

        def send(self: httpx.Client, request: httpx.Request, **kwargs: Any) -> httpx.Response:
            _learn_from(request)
            return original_send(self, request, **kwargs)

        async def async_send(
            self: httpx.AsyncClient, request: httpx.Request, **kwargs: Any
        ) -> httpx.Response:
            _learn_from(request)
            return await original_async_send(self, request, **kwargs)

        httpx.Client.send = send  # type: ignore[method-assign]
        httpx.AsyncClient.send = async_send  # type: ignore[method-assign]
        _installed = True
