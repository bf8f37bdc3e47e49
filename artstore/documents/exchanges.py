"""OpenAI-compatible HTTP calls as stored, and rebuilt as the client and ART built them.

An HTTP call (`source="http"` in an `llm.call` event) is kept as the documents that went
over the wire, parsed and re-serialised with key order and every float kept:

- the request body, split so that a growing conversation costs linear storage: each
  element of `messages` is a blob (`input`), `tools` is a blob, and the rest of the body
  is a blob whose `messages` / `tools` values are those hashes, keys in their order;
- the response: `{"json": body}`, `{"sse": [[event name or null, data], ...]}` for a
  stream (each `data:` parsed when it is JSON, e.g. `"[DONE]"` is kept as a string), or
  `{"text": body}` when the body is not JSON.

From those, `chat_completion` rebuilds the `ChatCompletion` the agent got: as the openai
SDK builds it from the body (`construct_type`, no validation), then post-processed as
ART's `model.openai_client()` does where the call went through it; a stream is assembled
by ART's own `art.openai.consume_chat_completion_stream` rules (logprobs included), which
is what an ART agent that streams keeps. `response_body` gives the bytes back for ART's
`build_exchange`. `redact_response` removes secrets that a response spells over several
tokens or stream chunks (see `artstore.redaction`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from artstore.art_api import art_module
from artstore.art_versions import art_client_postprocess
from artstore.eventstore.blobs import blob_json

if TYPE_CHECKING:
    from openai.types.chat import ChatCompletion

    from artstore.redaction import Redactor

#: URL path endings of the APIs recorded, by the name ART gives them.
ENDPOINTS = {
    "/chat/completions": "chat_completions",
    "/completions": "completions",
    "/responses": "responses",
    "/messages": "messages",
}
#: The `data:` or `event:` that ends a stream of each API.
_TERMINAL = {
    "chat_completions": "[DONE]",
    "completions": "[DONE]",
    "responses": "response.completed",
    "messages": "message_stop",
}


def endpoint_for_url(url: str) -> str | None:
    """The API a request URL calls, or None for anything else."""
    path = urlsplit(url).path.rstrip("/")
    return next((name for suffix, name in ENDPOINTS.items() if path.endswith(suffix)), None)


# --- requests ---------------------------------------------------------------------------------


def split_request(
    request: dict[str, Any], blob: Callable[[Any], str]
) -> tuple[list[str], str | None, str]:
    """(message hashes, tools hash, request hash): the body stored in blobs by `blob`."""
    rest = dict(request)
    inputs: list[str] = []
    tools = None
    if isinstance(rest.get("messages"), list):
        inputs = [blob(message) for message in rest["messages"]]
        rest["messages"] = inputs
    if isinstance(rest.get("tools"), list):
        tools = blob(rest["tools"])
        rest["tools"] = tools
    return inputs, tools, blob(rest)


def join_request(
    rest: dict[str, Any], inputs: list[str], tools: str | None, documents: dict[str, Any]
) -> dict[str, Any]:
    """The request body `split_request` stored, keys in their order."""
    request = dict(rest)
    if isinstance(request.get("messages"), list) and request["messages"] == inputs:
        request["messages"] = [documents[digest] for digest in inputs]
    if tools is not None and request.get("tools") == tools:
        request["tools"] = documents[tools]
    return request


# --- responses --------------------------------------------------------------------------------


def parse_sse(body: bytes) -> list[list[Any]]:
    """`[[event name or None, data], ...]` of a server-sent-events body (complete events)."""
    text = body.decode("utf-8", "surrogateescape").replace("\r\n", "\n").replace("\r", "\n")
    blocks = text.split("\n\n")
    if not text.endswith("\n\n"):
        blocks.pop()  # an event is complete only once its blank line arrived
    events: list[list[Any]] = []
    for block in blocks:
        name, lines = None, []
        for line in block.split("\n"):
            field, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            if field == "event":
                name = value
            elif field == "data":
                lines.append(value)
        if not lines:
            continue
        raw = "\n".join(lines)
        try:
            data = json.loads(raw)
        except ValueError:
            data = raw
        events.append([name, data])
    return events


def stream_complete(endpoint: str, events: list[list[Any]]) -> bool:
    """True when a stream's events include its API's final one."""
    terminal = _TERMINAL.get(endpoint)
    return any(
        data == terminal
        or name == terminal
        or (isinstance(data, dict) and data.get("type") == terminal)
        for name, data in events
    )


def sse_terminates(endpoint: str, tail: bytes) -> bool:
    """Cheap check of the newest bytes of a stream for its API's final event."""
    terminal = _TERMINAL.get(endpoint)
    return terminal is not None and terminal.encode() in tail


def response_document(body: bytes, *, stream: bool) -> dict[str, Any]:
    """The stored form of a response body."""
    if stream:
        return {"sse": parse_sse(body)}
    try:
        return {"json": json.loads(body)}
    except ValueError:
        return {"text": body.decode("utf-8", "surrogateescape")}


def response_body(document: dict[str, Any]) -> bytes:
    """The bytes of a stored response, parsed by any client as the original was."""
    if "json" in document:
        return blob_json(document["json"]).encode()
    if "text" in document:
        return document["text"].encode("utf-8", "surrogateescape")
    out = []
    for name, data in document["sse"]:
        if name is not None:
            out.append(f"event: {name}\n")
        out.append(f"data: {data if isinstance(data, str) else blob_json(data)}\n\n")
    return "".join(out).encode("utf-8", "surrogateescape")


def response_id(document: dict[str, Any]) -> str | None:
    """The id the API gave its response (`chatcmpl-...`, `resp_...`, `msg_...`)."""
    if "json" in document and isinstance(document["json"], dict):
        found = document["json"].get("id")
        return found if isinstance(found, str) else None
    for _, data in document.get("sse", []):
        if isinstance(data, dict):
            found = data.get("id") or (data.get("response") or data.get("message") or {}).get("id")
            if isinstance(found, str) and found:
                return found
    return None


# --- chat completions, as the agent got them --------------------------------------------------


class _Chunks:
    """The stored chunks as the stream object ART's stream consumer iterates."""

    def __init__(self, chunks: list[Any], require_policy_spans: bool) -> None:
        self._chunks = chunks
        self._art_require_policy_spans = require_policy_spans

    def __iter__(self) -> Iterator[Any]:
        return iter(self._chunks)

    def close(self) -> None:
        pass


def chat_completion(
    document: dict[str, Any], *, art_client: str | None = None, request_model: Any = None
) -> ChatCompletion:
    """The `ChatCompletion` an agent got for this response (see the module docstring)."""
    from openai._models import construct_type
    from openai.types.chat import ChatCompletion, ChatCompletionChunk

    if "sse" in document:
        chunks = []
        for _, data in document["sse"]:
            if isinstance(data, str) and data.startswith("[DONE]"):
                break
            if isinstance(data, dict):
                chunks.append(construct_type(type_=ChatCompletionChunk, value=data))
        stream = _Chunks(chunks, require_policy_spans=art_client == "require")
        return art_module("openai").consume_sync_chat_completion_stream(stream)
    completion = construct_type(type_=ChatCompletion, value=document["json"])
    if art_client is not None:
        art_client_postprocess(completion, art_client, request_model)
    return completion  # type: ignore[return-value]


def call_summary(document: dict[str, Any]) -> dict[str, Any]:
    """What an `llm.call` event copies for SQL: tokens, model, and the first choice.

    Read from the stored chat completion's JSON (a stream's chunks are summed up the way
    the client assembles them), without building the `ChatCompletion`: that costs more
    than the rest of recording a call.
    """
    if "json" in document and isinstance(document["json"], dict):
        body = document["json"]
        usage = body.get("usage") if isinstance(body.get("usage"), dict) else {}
        choices = [c for c in body.get("choices") or [] if isinstance(c, dict)]
        first = next((c for c in choices if c.get("index", 0) == 0), None)
        message = (first or {}).get("message") or {}
        logprobs = (first or {}).get("logprobs") or {}
        calls = [
            (c.get("id"), function.get("name"), function.get("arguments"))
            for c in message.get("tool_calls") or []
            if isinstance(c, dict) and isinstance(function := c.get("function") or {}, dict)
        ]
        count = sum(len(logprobs.get(key) or []) for key in ("content", "refusal"))
        return _summary(body.get("model"), usage, first, calls, count)
    model, usage, finish, count = None, {}, None, 0
    streamed: dict[int, list[str]] = {}  # tool calls by their index, assembled
    for _, data in document.get("sse", []):
        if not isinstance(data, dict):
            continue
        model = model or data.get("model")
        if isinstance(data.get("usage"), dict):
            usage = data["usage"]
        for choice in data.get("choices") or []:
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            finish = choice.get("finish_reason") or finish
            for key, found in (choice.get("logprobs") or {}).items():
                if key in ("content", "refusal") and isinstance(found, list):
                    count += len(found)
            for call in (choice.get("delta") or {}).get("tool_calls") or []:
                function = call.get("function") or {}
                index = call.get("index") if isinstance(call.get("index"), int) else 0
                known = streamed.setdefault(index, ["", "", ""])
                known[0] += call.get("id") or ""
                known[1] += function.get("name") or ""
                known[2] += function.get("arguments") or ""
    first = {"finish_reason": finish} if finish or streamed or count else None
    listed = [tuple(streamed[index]) for index in sorted(streamed)]
    return _summary(model, usage, first, listed, count)


def _summary(
    model: Any,
    usage: dict[str, Any],
    first: dict[str, Any] | None,
    calls: list[tuple[Any, ...]],
    num_logprobs: int,
) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "model": model if isinstance(model, str) and model else None,
        "prompt_tokens": usage.get("prompt_tokens"),
        "completion_tokens": usage.get("completion_tokens"),
    }
    if first is not None:
        fields |= {
            "finish_reason": first.get("finish_reason"),
            "tool_calls": [
                {"id": i, "name": n, "args": parse_arguments(arguments)}
                for i, n, arguments in calls
            ],
            "num_logprobs": num_logprobs,
        }
    return fields


def call_summary_of_choice(choice: Any) -> list[dict[str, Any]]:
    """`[{"id", "name", "args"}]` of the tool calls a `Choice` asked for."""
    return [
        {"id": call.id, "name": function.name, "args": parse_arguments(function.arguments)}
        for call in choice.message.tool_calls or []
        if (function := getattr(call, "function", None)) is not None
    ]


def parse_arguments(text: Any) -> Any:
    """Tool-call arguments as JSON when they are JSON text, else as they are."""
    try:
        return json.loads(text)
    except (TypeError, ValueError):
        return text


# --- secrets ----------------------------------------------------------------------------------


def redact_response(
    document: dict[str, Any], redactor: Redactor, *, prompt_held_secret: bool
) -> dict[str, Any]:
    """`document` without the secrets it spells over tokens or stream chunks.

    Whole strings are redacted where the blob is written; this handles what only joined
    pieces spell: logprob tokens, streamed deltas, tool-call arguments streamed in parts.
    The inference server's token ids of a choice that held a secret are dropped (they
    encode the secret), and so are the prompt's token ids when the prompt held one.
    """
    if not redactor:
        return document
    if "json" in document and isinstance(document["json"], dict):
        body = document["json"]
        for choice in body.get("choices") or []:
            if isinstance(choice, dict) and _redact_choice(choice, redactor):
                choice.pop("token_ids", None)
        if prompt_held_secret:
            _drop_prompt_ids(body)
    elif "sse" in document:
        _redact_stream(document["sse"], redactor)
        if prompt_held_secret:
            for _, data in document["sse"]:
                if isinstance(data, dict):
                    _drop_prompt_ids(data)
    return document


def redact_choice(choice: dict[str, Any], redactor: Redactor, *, prompt_held_secret: bool) -> bool:
    """A dumped `Choice` (of a trajectory a loop built) without the secrets its tokens
    spell, nor the server's token ids that spell them; True if it held a secret."""
    held = bool(redactor) and _redact_choice(choice, redactor)
    if held:
        choice.pop("token_ids", None)
    if prompt_held_secret:
        choice.pop("prompt_token_ids", None)
    return held


def redact_exchanges(exchanges: dict[str, Any], redactor: Redactor) -> None:
    """ART's dumped `Trajectory.exchanges`, each response as `redact_response` leaves it."""
    if not redactor:
        return
    for captured in exchanges.values():
        for exchange in captured if isinstance(captured, list) else []:
            if not isinstance(exchange, dict) or not isinstance(exchange.get("response"), dict):
                continue
            request = blob_json(exchange.get("request"))
            held = redactor(request) != request
            redact_response({"json": exchange["response"]}, redactor, prompt_held_secret=held)


def _drop_prompt_ids(body: dict[str, Any]) -> None:
    body.pop("prompt_token_ids", None)
    for choice in body.get("choices") or []:
        if isinstance(choice, dict):
            choice.pop("prompt_token_ids", None)


def _redact_choice(choice: dict[str, Any], redactor: Redactor) -> bool:
    """Redact a whole choice's logprob tokens; True if it held a secret anywhere."""
    held = redactor(blob_json(choice.get("message") or choice.get("text") or "")) != blob_json(
        choice.get("message") or choice.get("text") or ""
    )
    logprobs = choice.get("logprobs")
    if isinstance(logprobs, dict):
        for key in ("content", "refusal"):
            entries = logprobs.get(key)
            if isinstance(entries, list):
                rewritten = redactor.token_logprobs(entries)
                if rewritten is not None:
                    logprobs[key] = rewritten
                    held = True
    return held


def _redact_stream(events: list[list[Any]], redactor: Redactor) -> None:
    """Redact what a chat stream spells across chunks, choice by choice."""
    texts: dict[tuple[Any, ...], list[tuple[dict[str, Any], str]]] = {}
    entries: dict[tuple[Any, ...], list[tuple[list[Any], int]]] = {}
    choices: dict[Any, list[dict[str, Any]]] = {}
    for _, data in events:
        if not isinstance(data, dict):
            continue
        for choice in data.get("choices") or []:
            if not isinstance(choice, dict):
                continue
            index = choice.get("index")
            choices.setdefault(index, []).append(choice)
            delta = choice.get("delta") if isinstance(choice.get("delta"), dict) else {}
            for key, value in delta.items():
                if isinstance(value, str):
                    texts.setdefault((index, key), []).append((delta, key))
            for call in delta.get("tool_calls") or []:
                function = call.get("function") if isinstance(call, dict) else None
                if isinstance(function, dict) and isinstance(function.get("arguments"), str):
                    key = (index, "tool_calls", call.get("index"))
                    texts.setdefault(key, []).append((function, "arguments"))
            logprobs = choice.get("logprobs")
            if isinstance(logprobs, dict):
                for key in ("content", "refusal"):
                    found = logprobs.get(key)
                    if isinstance(found, list):
                        place = entries.setdefault((index, key), [])
                        place.extend((found, position) for position in range(len(found)))
    held: set[Any] = set()
    for (index, *_), places in texts.items():
        rewritten = redactor.pieces([holder[key] for holder, key in places])
        if rewritten is not None:
            held.add(index)
            for (holder, key), text in zip(places, rewritten, strict=True):
                holder[key] = text
    for (index, _), places in entries.items():
        rewritten_entries = redactor.token_logprobs([found[i] for found, i in places])
        if rewritten_entries is not None:
            held.add(index)
            for (found, i), entry in zip(places, rewritten_entries, strict=True):
                found[i] = entry
    for index in held:
        for choice in choices[index]:
            choice.pop("token_ids", None)
