"""A local OpenAI-compatible chat-completions server for the test-suite and `artstore demo`.

Why it exists: artstore must be exercised end to end with the real `langchain-openai` client,
a real LangGraph graph and ART's own LangGraph wrapper, with no GPU and no network. ART's vLLM
server always returns token logprobs (only choices with logprobs are trainable) and ART's
wrapper never asks for them, so this server returns `choices[i].logprobs` on every response.

Like vLLM, it returns token ids when asked (ART >= 0.5.20's `model.openai_client()` asks for
them, and trains exchange trajectories only on inference-provided ids): with
`"return_token_ids": true` in the body, the response carries `prompt_token_ids` (the prompt
rendered with a ChatML-like template and tokenized, so a conversation's next prompt starts
with this prompt and this completion's ids) and each choice its `token_ids`, one per logprob
entry; streamed, the first chunk carries `prompt_token_ids` and each chunk its choice's
`token_ids`. With `"return_tokens_as_token_ids": true` a logprob entry's `token` is
`token_id:N` (its `bytes` still spell the text). Ids are `token_id(text)`: deterministic.

Why a thread: `http.server.ThreadingHTTPServer` runs in a daemon thread, so the server works
the same from plain sync code and from inside a running asyncio loop (it never needs the
caller's loop to make progress).

What it answers is decided by a pluggable, deterministic *policy*
(`policy(request_body, sample_index) -> ScriptedReply`); `tool_calling_policy` is the default.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import os
import re
import secrets
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any, Self

if TYPE_CHECKING:
    from langchain_openai import ChatOpenAI

__all__ = [
    "FINAL_ANSWER_TEMPLATES",
    "LocalInferenceServer",
    "Policy",
    "ScriptedReply",
    "render_prompt",
    "synthesize_from_schema",
    "token_id",
    "token_logprobs",
    "tokenize",
    "tool_calling_policy",
]

JSON = dict[str, Any]


@dataclass(frozen=True)
class ScriptedReply:
    """What the policy answers for one choice: text, tool calls `(name, args)`, or both.

    `logprobs` overrides the logprob of the content's first tokens, in order (for example
    `float("-inf")`, which is sent as JSON `-Infinity`, as Python's `json` writes it).
    """

    content: str | None = None
    tool_calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    logprobs: Sequence[float] | None = None


Policy = Callable[[JSON, int], "ScriptedReply | str"]
"""`policy(request_body, sample_index)`; `sample_index` counts earlier identical prompts.

`sample_index` is 0 the first time the server sees a given prompt (messages with ids stripped,
tools, tool_choice, response_format), 1 the second time, and so on. N rollouts of one scenario
therefore get indices 0..N-1 (in whatever order they arrive), which lets a policy vary its
answer across a group and so give rewards some spread. A plain `str` return means content.
"""


# --------------------------------------------------------------------------------------------
# Tokens and logprobs
# --------------------------------------------------------------------------------------------

_TOKEN_RE = re.compile(r"\s*\w+|\s*[^\w\s]|\s+")


def tokenize(text: str) -> list[str]:
    """Split text into word/punctuation tokens (leading spaces kept) that join back to `text`."""
    return _TOKEN_RE.findall(text)


def _token_logprob(token: str, position: int) -> float:
    """A deterministic logprob in (-4.0001, -0.0001], derived from a hash of token and position."""
    digest = hashlib.sha256(f"{position}:{token}".encode()).digest()
    return -round(0.0001 + 4.0 * int.from_bytes(digest[:4], "big") / 2**32, 6)


def token_id(token: str) -> int:
    """A deterministic id for a token's text (the server's vocabulary is every string)."""
    return 1000 + int.from_bytes(hashlib.sha256(token.encode()).digest()[:4], "big") % 150_000


def token_logprobs(text: str, start: int = 0) -> list[JSON]:
    """OpenAI `ChatCompletionTokenLogprob` dicts for `text`, positions counted from `start`."""
    return [
        {
            "token": token,
            "logprob": _token_logprob(token, start + i),
            "bytes": list(token.encode("utf-8")),
            "top_logprobs": [],
        }
        for i, token in enumerate(tokenize(text))
    ]


# --------------------------------------------------------------------------------------------
# Reading a request
# --------------------------------------------------------------------------------------------


def _text(content: Any) -> str:
    """Text of a message content, which may be a string or a list of content parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(
            part.get("text", "") if isinstance(part, dict) else str(part) for part in content
        ).strip()
    return str(content)


def _last_user_text(messages: Sequence[JSON]) -> str:
    for message in reversed(messages):
        if message.get("role") == "user":
            return _text(message.get("content"))
    return ""


def _current_turn(messages: Sequence[JSON]) -> list[JSON]:
    """Messages after the last user message: the agent's work on the current question."""
    for i in range(len(messages) - 1, -1, -1):
        if messages[i].get("role") == "user":
            return list(messages[i + 1 :])
    return list(messages)


def _function_tools(request: JSON) -> list[JSON]:
    """The `function` part of each offered tool, in order."""
    return [
        tool["function"]
        for tool in request.get("tools") or []
        if isinstance(tool, dict) and isinstance(tool.get("function"), dict)
    ]


_CHATML_START, _CHATML_END = "<|im_start|>", "<|im_end|>\n"


def _message_text(message: JSON) -> list[str]:
    """The texts a message renders to: its content, then each tool call as the model writes it."""
    texts = [_text(message.get("content"))] if message.get("content") else []
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {} if isinstance(call, dict) else {}
        try:
            arguments = json.loads(function.get("arguments") or "{}")
        except (TypeError, ValueError):
            arguments = function.get("arguments")
        texts.append(json.dumps({"name": function.get("name"), "arguments": arguments}))
    return texts


def render_prompt(request: JSON) -> list[str]:
    """The prompt as pieces of a ChatML-like template, ending with the generation prompt.

    Each piece is tokenized on its own, so the tokens of a conversation's next prompt
    start with this prompt's tokens followed by the completion's (as with a real template).
    """
    pieces: list[str] = []
    if request.get("tools"):
        pieces += [_CHATML_START, "system\n", "<tools>", json.dumps(request["tools"]), _CHATML_END]
    for message in request.get("messages") or []:
        if isinstance(message, dict):
            role = str(message.get("role") or "user")
            pieces += [_CHATML_START, f"{role}\n", *_message_text(message), _CHATML_END]
    return [*pieces, _CHATML_START, "assistant\n"]


def _prompt_token_ids(request: JSON) -> list[int]:
    return [token_id(token) for piece in render_prompt(request) for token in tokenize(piece)]


def _prompt_key(request: JSON) -> str:
    """A hash of what the model is asked, ignoring ids, so that repeated prompts are counted."""

    def strip(message: JSON) -> JSON:
        calls = [
            ((c.get("function") or {}).get("name"), (c.get("function") or {}).get("arguments"))
            for c in message.get("tool_calls") or []
        ]
        return {
            "role": message.get("role"),
            "content": message.get("content"),
            "name": message.get("name"),
            "tool_calls": calls,
        }

    payload = {
        "model": request.get("model"),
        "messages": [strip(m) for m in request.get("messages") or [] if isinstance(m, dict)],
        "tools": request.get("tools"),
        "tool_choice": request.get("tool_choice"),
        "response_format": request.get("response_format"),
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()


# --------------------------------------------------------------------------------------------
# JSON Schema -> a value that satisfies it
# --------------------------------------------------------------------------------------------

_FORMAT_EXAMPLES = {
    "date-time": "2024-01-01T00:00:00Z",
    "date": "2024-01-01",
    "time": "00:00:00",
    "email": "user@example.com",
    "uri": "https://example.com/",
    "url": "https://example.com/",
    "uuid": "00000000-0000-4000-8000-000000000000",
}


def _hash_int(*parts: str) -> int:
    return int.from_bytes(hashlib.sha256("\x1f".join(parts).encode()).digest()[:8], "big")


def synthesize_from_schema(schema: JSON, *, text: str = "") -> Any:
    """Build a deterministic value satisfying a practical subset of JSON Schema.

    Why: tool arguments and structured outputs must validate against the caller's pydantic
    model. Objects get their required properties; strings come from the words of `text`
    (the last user message); integers/numbers from a hash of the property path; booleans
    are True; enums take their first value; `$ref`, `anyOf`/`oneOf` (first non-null) and
    `allOf` are followed.
    """
    words = re.findall(r"\w+", text)
    phrase = " ".join(words[:8]) or "example"
    root = schema

    def resolve(ref: str) -> JSON:
        node: Any = root
        for part in ref.removeprefix("#/").split("/"):
            node = node.get(part, {}) if isinstance(node, dict) else {}
        return node if isinstance(node, dict) else {}

    def number_bounds(node: JSON) -> tuple[float, float]:
        lo = node.get("minimum", node.get("exclusiveMinimum", -1) + 1)
        hi = node.get("maximum", node.get("exclusiveMaximum", lo + 101) - 1)
        return lo, max(lo, hi)

    def value(node: JSON, path: str, depth: int) -> Any:
        if depth > 12 or not isinstance(node, dict):
            return None
        if "$ref" in node:
            merged = {**resolve(node["$ref"]), **{k: v for k, v in node.items() if k != "$ref"}}
            return value(merged, path, depth + 1)
        if "const" in node:
            return node["const"]
        if node.get("enum"):
            return node["enum"][0]
        for key in ("anyOf", "oneOf"):
            if node.get(key):
                options = [o for o in node[key] if o.get("type") != "null"] or node[key]
                return value(options[0], path, depth + 1)
        if node.get("allOf"):
            merged: JSON = {"type": "object", "properties": {}, "required": []}
            for part in node["allOf"]:
                part = resolve(part["$ref"]) if "$ref" in part else part
                merged["properties"].update(part.get("properties", {}))
                merged["required"] += part.get("required", [])
            return value(merged, path, depth + 1)

        kind = node.get("type")
        if isinstance(kind, list):
            kind = next((k for k in kind if k != "null"), "null")
        if kind is None:
            kind = "object" if "properties" in node else "array" if "items" in node else "string"

        if kind == "object":
            properties = node.get("properties") or {}
            return {
                name: value(properties.get(name, {}), f"{path}.{name}", depth + 1)
                for name in node.get("required") or []
            }
        if kind == "array":
            count = max(1, node.get("minItems", 0))
            count = min(count, node.get("maxItems", count))
            return [value(node.get("items") or {}, f"{path}[{i}]", depth + 1) for i in range(count)]
        if kind == "integer":
            lo, hi = number_bounds(node)
            lo, hi = int(lo), int(hi)
            return lo + _hash_int(path, text) % (hi - lo + 1)
        if kind == "number":
            lo, hi = number_bounds(node)
            return round(lo + (hi - lo) * (_hash_int(path, text) % 1000) / 1000, 3)
        if kind == "boolean":
            return True
        if kind == "null":
            return None
        # string
        result = _FORMAT_EXAMPLES.get(node.get("format", ""), phrase)
        if "maxLength" in node:
            result = result[: node["maxLength"]]
        return result.ljust(node.get("minLength", 0), "x")

    return value(schema, "$", 0)


# --------------------------------------------------------------------------------------------
# The default policy
# --------------------------------------------------------------------------------------------

FINAL_ANSWER_TEMPLATES: tuple[str, ...] = (
    "Final answer: {evidence}",
    "Final answer: I believe it is {evidence}.",
    "Final answer: I could not find it.",
)
"""Final answers cycle through these by `sample_index`, so a group of rollouts differs."""


def _final_answer(messages: Sequence[JSON], sample_index: int) -> str:
    turn = _current_turn(messages)
    results = [_text(m.get("content")) for m in turn if m.get("role") == "tool"]
    evidence = "; ".join(r for r in results if r) or _last_user_text(messages) or "nothing"
    template = FINAL_ANSWER_TEMPLATES[sample_index % len(FINAL_ANSWER_TEMPLATES)]
    return template.format(evidence=evidence)


def tool_calling_policy(
    request: JSON, sample_index: int = 0, *, max_tool_calls: int = 2
) -> ScriptedReply:
    """Call the offered tools one at a time, then answer; honour structured-output requests.

    In order:
    1. `response_format` json_schema -> JSON content built from the schema (LangChain's default
       `with_structured_output`); json_object -> `{"answer": ...}`.
    2. `tool_choice` naming a function -> call it (LangChain `function_calling` structured
       output); `"required"` -> call the first not-yet-called (else first) tool.
    3. Tools offered, `tool_choice` not `"none"`, fewer than `max_tool_calls` calls made since
       the last user message -> call the first tool not called yet in this turn.
    4. Otherwise a final text answer quoting this turn's tool results, varied by
       `sample_index` (see `FINAL_ANSWER_TEMPLATES`).

    Arguments come from `synthesize_from_schema` with the last user message as text.
    Use `functools.partial(tool_calling_policy, max_tool_calls=3)` to change the budget.
    """
    messages: list[JSON] = [m for m in request.get("messages") or [] if isinstance(m, dict)]
    user_text = _last_user_text(messages)
    tools = _function_tools(request)
    by_name = {tool.get("name"): tool for tool in tools}

    def call(tool: JSON) -> ScriptedReply:
        arguments = synthesize_from_schema(tool.get("parameters") or {}, text=user_text)
        return ScriptedReply(tool_calls=[(tool["name"], arguments)])

    response_format = request.get("response_format") or {}
    if response_format.get("type") == "json_schema":
        schema = (response_format.get("json_schema") or {}).get("schema") or {}
        return ScriptedReply(content=json.dumps(synthesize_from_schema(schema, text=user_text)))
    if response_format.get("type") == "json_object":
        return ScriptedReply(content=json.dumps({"answer": _final_answer(messages, sample_index)}))

    turn = _current_turn(messages)
    called = [
        (c.get("function") or {}).get("name")
        for m in turn
        if m.get("role") == "assistant"
        for c in m.get("tool_calls") or []
    ]
    uncalled = [tool for tool in tools if tool.get("name") not in called]

    tool_choice = request.get("tool_choice")
    if isinstance(tool_choice, dict):
        forced = by_name.get((tool_choice.get("function") or {}).get("name"))
        if forced is not None:
            return call(forced)
    if tool_choice in ("required", "any") and tools:
        return call((uncalled or tools)[0])
    if tools and tool_choice != "none" and len(called) < max_tool_calls and uncalled:
        return call(uncalled[0])
    return ScriptedReply(content=_final_answer(messages, sample_index))


# --------------------------------------------------------------------------------------------
# Building responses
# --------------------------------------------------------------------------------------------


@dataclass
class _Generated:
    """One choice, ready to be sent whole or as stream chunks."""

    content: str | None
    content_logprobs: list[JSON]
    tool_calls: list[JSON]
    tool_call_logprobs: list[list[JSON]]

    @property
    def finish_reason(self) -> str:
        return "tool_calls" if self.tool_calls else "stop"

    @property
    def logprobs(self) -> list[JSON]:
        return self.content_logprobs + [e for entries in self.tool_call_logprobs for e in entries]


def _generate(reply: ScriptedReply) -> _Generated:
    """Turn a reply into message parts and logprobs over content then each tool call's JSON."""
    content_logprobs = token_logprobs(reply.content or "")
    for entry, value in zip(content_logprobs, reply.logprobs or (), strict=False):
        entry["logprob"] = value
    position = len(content_logprobs)
    tool_calls, tool_call_logprobs = [], []
    for name, args in reply.tool_calls:
        arguments = json.dumps(args)
        tool_calls.append(
            {
                "id": f"call_{uuid.uuid4().hex[:24]}",
                "type": "function",
                "function": {"name": name, "arguments": arguments},
            }
        )
        # What a Hermes-style model would emit for this call.
        entries = token_logprobs(json.dumps({"name": name, "arguments": args}), position)
        position += len(entries)
        tool_call_logprobs.append(entries)
    return _Generated(reply.content, content_logprobs, tool_calls, tool_call_logprobs)


def _token_ids(entries: list[JSON]) -> list[int]:
    return [token_id(bytes(entry["bytes"]).decode()) for entry in entries]


def _as_token_ids(entries: list[JSON]) -> list[JSON]:
    """vLLM's `return_tokens_as_token_ids`: each token written `token_id:N`."""
    return [{**entry, "token": f"token_id:{token_id(entry['token'])}"} for entry in entries]


def _error(message: str, kind: str, code: str | None = None) -> JSON:
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


# --------------------------------------------------------------------------------------------
# The server
# --------------------------------------------------------------------------------------------


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256  # many concurrent rollouts must not hit the listen backlog
    owner: LocalInferenceServer

    def handle_error(self, request: Any, client_address: Any) -> None:
        """Stay quiet when a client hangs up early (timeouts, cancelled rollouts)."""
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    """HTTP/1.0: one request per connection, so a stopped server leaves nothing serving."""

    server: _HTTPServer
    server_version = "artstore-local-inference/1"

    def log_message(self, format: str, *args: Any) -> None:  # quiet: tests read JSON, not logs
        pass

    def _send_json(self, status: int, payload: JSON) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _authorized(self) -> bool:
        expected = f"Bearer {self.server.owner.api_key}".encode()
        given = (self.headers.get("Authorization") or "").encode()
        if hmac.compare_digest(given, expected):
            return True
        # Never echo what was sent: it may be someone's real key.
        self._send_json(
            401, _error("Incorrect API key provided.", "invalid_request_error", "invalid_api_key")
        )
        return False

    def _path(self) -> str:
        return self.path.split("?", 1)[0].rstrip("/")

    def do_GET(self) -> None:
        if self._path() not in ("/v1/models", "/models"):
            self._send_json(404, _error(f"Unknown path {self._path()}", "not_found_error"))
            return
        if self._authorized():
            self._send_json(200, self.server.owner._models_payload())

    def do_POST(self) -> None:
        if self._path() not in ("/v1/chat/completions", "/chat/completions"):
            self._send_json(404, _error(f"Unknown path {self._path()}", "not_found_error"))
            return
        if not self._authorized():
            return
        try:
            length = int(self.headers.get("Content-Length") or 0)
            request = json.loads(self.rfile.read(length) or b"null")
        except (ValueError, UnicodeDecodeError) as exc:
            self._send_json(400, _error(f"Invalid JSON body: {exc}", "invalid_request_error"))
            return
        if not isinstance(request, dict) or not isinstance(request.get("messages"), list):
            self._send_json(400, _error("'messages' must be a list", "invalid_request_error"))
            return
        self.server.owner._handle_chat(self, request)

    def send_sse(self, events: Iterator[JSON]) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.end_headers()
        for event in events:
            self.wfile.write(f"data: {json.dumps(event)}\n\n".encode())
            if self.server.owner.chunk_interval_s > 0:
                self.wfile.flush()
                time.sleep(self.server.owner.chunk_interval_s)
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()


class LocalInferenceServer:
    """An OpenAI-compatible `/v1/chat/completions` + `/v1/models` server on 127.0.0.1.

    Every response carries tool calls (when the policy makes them) and token logprobs, like
    ART's vLLM server. Use it as `with LocalInferenceServer() as server:` or `async with`,
    then point a client at `server.base_url` with `server.api_key`.

    Args:
        policy: `policy(request_body, sample_index) -> ScriptedReply | str`.
        api_key: the key it expects as `Authorization: Bearer ...`; a random fake secret by
            default, so tests can check that it never reaches stored events.
        models: ids listed by `/v1/models` (the first is `chat_model()`'s default).
        latency_s: seconds to wait before answering each chat request.
        chunk_interval_s: seconds to wait between the chunks of a streamed answer.
        fail_when: `fail_when(request_body) -> bool`; True answers HTTP 500 (error-path tests).
        request_log: a file to which each authenticated chat request is appended, as one
            JSON line (`pid`, `messages`: how many, `stream`), before it is answered; a
            process killed mid-run leaves the requests it received there.
        host, port: where to listen; port 0 picks a free port.
    """

    def __init__(
        self,
        policy: Policy | None = None,
        *,
        api_key: str | None = None,
        models: Sequence[str] = ("test-model",),
        latency_s: float = 0.0,
        chunk_interval_s: float = 0.0,
        fail_when: Callable[[JSON], bool] | None = None,
        request_log: str | os.PathLike[str] | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        self.policy: Policy = policy or tool_calling_policy
        self.api_key = api_key or "sk-local-" + secrets.token_hex(16)
        self.models = list(models)
        self.latency_s = latency_s
        self.chunk_interval_s = chunk_interval_s
        self.fail_when = fail_when
        self.request_log = request_log
        self.host = host
        self._requested_port = port
        self._lock = threading.Lock()
        self._requests: list[JSON] = []
        self._prompt_counts: Counter[str] = Counter()
        self._httpd: _HTTPServer | None = None
        self._thread: threading.Thread | None = None

    def __repr__(self) -> str:  # no api_key here: reprs end up in logs
        state = self.base_url if self._httpd else "stopped"
        return f"LocalInferenceServer({state})"

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> Self:
        """Bind and serve in a daemon thread; returns self. Starting twice is a no-op."""
        if self._httpd is not None:
            return self
        httpd = _HTTPServer((self.host, self._requested_port), _Handler)
        httpd.owner = self
        self._httpd = httpd
        self._thread = threading.Thread(
            target=httpd.serve_forever,
            kwargs={"poll_interval": 0.05},
            name=f"LocalInferenceServer:{httpd.server_address[1]}",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and close the socket. Stopping twice is a no-op."""
        httpd, thread = self._httpd, self._thread
        self._httpd = self._thread = None
        if httpd is not None:
            httpd.shutdown()
            httpd.server_close()
        if thread is not None:
            thread.join(timeout=5)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    async def __aenter__(self) -> Self:
        return self.start()

    async def __aexit__(self, *exc_info: object) -> None:
        await asyncio.to_thread(self.stop)  # shutdown() waits for the serve loop: not on ours

    # -- what callers read -------------------------------------------------------------------

    @property
    def port(self) -> int:
        if self._httpd is None:
            raise RuntimeError("LocalInferenceServer is not started")
        return int(self._httpd.server_address[1])

    @property
    def base_url(self) -> str:
        """E.g. `http://127.0.0.1:PORT/v1`, what OpenAI clients take as `base_url`."""
        return f"http://{self.host}:{self.port}/v1"

    @property
    def requests(self) -> list[JSON]:
        """A snapshot of the authenticated chat-completion request bodies, in arrival order."""
        with self._lock:
            return list(self._requests)

    def chat_model(self, model: str | None = None, **kwargs: Any) -> ChatOpenAI:
        """A `langchain_openai.ChatOpenAI` pointed at this server; kwargs override or add."""
        from langchain_openai import ChatOpenAI

        settings: dict[str, Any] = {"base_url": self.base_url, "api_key": self.api_key}
        return ChatOpenAI(model=model or self.models[0], **{**settings, **kwargs})

    # -- request handling (runs on the handler threads) ---------------------------------------

    def _models_payload(self) -> JSON:
        created = int(time.time())
        return {
            "object": "list",
            "data": [
                {"id": m, "object": "model", "created": created, "owned_by": "artstore"}
                for m in self.models
            ],
        }

    def _log_request(self, request: JSON) -> None:
        """One line, written with one `write` on an O_APPEND file and synced, so that
        requests from several processes never interleave and a kill loses none."""
        messages = request.get("messages")
        line = {
            "pid": os.getpid(),
            "messages": len(messages) if isinstance(messages, list) else 0,
            "stream": bool(request.get("stream")),
        }
        assert self.request_log is not None
        descriptor = os.open(self.request_log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            os.write(descriptor, (json.dumps(line) + "\n").encode())
            os.fsync(descriptor)
        finally:
            os.close(descriptor)

    def _handle_chat(self, handler: _Handler, request: JSON) -> None:
        n = max(1, int(request.get("n") or 1))
        with self._lock:
            self._requests.append(request)
            key = _prompt_key(request)
            sample_index = self._prompt_counts[key]
            self._prompt_counts[key] += n
            if self.request_log is not None:
                self._log_request(request)
        if self.latency_s > 0:
            time.sleep(self.latency_s)
        try:
            if self.fail_when is not None and self.fail_when(request):
                handler._send_json(500, _error("Injected failure (fail_when).", "server_error"))
                return
            replies = [self.policy(request, sample_index + i) for i in range(n)]
        except Exception as exc:
            handler._send_json(500, _error(f"Policy failed: {exc!r}", "server_error"))
            return
        generated = [_generate(ScriptedReply(r) if isinstance(r, str) else r) for r in replies]

        with_ids = request.get("return_token_ids") is True
        as_ids = request.get("return_tokens_as_token_ids") is True
        completion_tokens = sum(len(g.logprobs) for g in generated)
        prompt_ids = _prompt_token_ids(request)
        prompt_tokens = len(prompt_ids)
        usage = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        }
        header = {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "created": int(time.time()),
            "model": request.get("model") or self.models[0],
            "system_fingerprint": "artstore-local",
        }
        ids = _TokenIds(prompt_ids if with_ids else None, as_ids)
        if request.get("stream"):
            include_usage = bool((request.get("stream_options") or {}).get("include_usage"))
            chunks = _stream_chunks(header, generated, usage if include_usage else None, ids)
            handler.send_sse(chunks)
            return
        handler._send_json(
            200,
            {
                **header,
                "object": "chat.completion",
                "choices": [_choice(i, g, ids) for i, g in enumerate(generated)],
                "usage": usage,
                **({"prompt_token_ids": prompt_ids} if with_ids else {}),
            },
        )


@dataclass(frozen=True)
class _TokenIds:
    """What the request asked for: the prompt's token ids (None: not asked), ids as tokens."""

    prompt: list[int] | None
    as_tokens: bool

    def entries(self, entries: list[JSON]) -> list[JSON]:
        return _as_token_ids(entries) if self.as_tokens else entries


def _choice(index: int, generated: _Generated, ids: _TokenIds) -> JSON:
    message: JSON = {"role": "assistant", "content": generated.content, "refusal": None}
    if generated.tool_calls:
        message["tool_calls"] = generated.tool_calls
    choice: JSON = {
        "index": index,
        "message": message,
        "finish_reason": generated.finish_reason,
        "logprobs": {"content": ids.entries(generated.logprobs), "refusal": None},
    }
    if ids.prompt is not None:
        choice["token_ids"] = _token_ids(generated.logprobs)
    return choice


def _stream_chunks(
    header: JSON, generated: list[_Generated], usage: JSON | None, ids: _TokenIds
) -> Iterator[JSON]:
    """OpenAI `chat.completion.chunk` events: role, content tokens, tool calls, finish, usage."""
    base = {**header, "object": "chat.completion.chunk"}
    first = True

    def chunk(index: int, delta: JSON, logprobs: list[JSON] | None = None, finish=None) -> JSON:
        nonlocal first
        choice: JSON = {
            "index": index,
            "delta": delta,
            "logprobs": {"content": ids.entries(logprobs), "refusal": None} if logprobs else None,
            "finish_reason": finish,
        }
        if ids.prompt is not None:
            choice["token_ids"] = _token_ids(logprobs or [])
        event = {**base, "choices": [choice]}
        if first and ids.prompt is not None:
            event["prompt_token_ids"] = ids.prompt
        first = False
        return event

    for index, g in enumerate(generated):
        yield chunk(index, {"role": "assistant", "content": ""})
        for entry in g.content_logprobs:
            yield chunk(index, {"content": entry["token"]}, [entry])
        for i, (call, entries) in enumerate(zip(g.tool_calls, g.tool_call_logprobs, strict=True)):
            yield chunk(index, {"tool_calls": [{"index": i, **call}]}, entries)
        yield chunk(index, {}, finish=g.finish_reason)
    if usage is not None:
        yield {**base, "choices": [], "usage": usage}
