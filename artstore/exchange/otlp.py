"""OpenTelemetry GenAI traces out (OTLP JSON or OTLP/HTTP) and in (OTLP JSON).

A rollout is a trace; its id is derived from the rollout id (exporting twice gives the same
traces, span ids included). In it, built with `opentelemetry-sdk` and encoded by its OTLP
exporter's encoder:

- `invoke_agent {model}` (the root): `gen_ai.operation.name` = invoke_agent,
  `gen_ai.agent.name`, `gen_ai.conversation.id` (the rollout id), the rollout's `artstore.*`
  attributes (`artstore.rollout.id`, `artstore.run`, `artstore.group.id`, `artstore.role`,
  `artstore.policy_step`, `artstore.scenario` as JSON, `artstore.reward` by the run's
  scorer), and each reward as a `gen_ai.evaluation.result` event (`gen_ai.evaluation.name`:
  the scorer, `gen_ai.evaluation.score.value`, `artstore.reward.rescored`); status ERROR
  with an `exception` event for a failed rollout;
- `chat {model}` per LLM call (per assistant turn of each history): `gen_ai.provider.name`
  (openai: ART serves an OpenAI-compatible API), `gen_ai.request.model`,
  `gen_ai.response.model`, `gen_ai.usage.input_tokens` and `output_tokens`,
  `gen_ai.response.finish_reasons`, `gen_ai.input.messages` and `gen_ai.output.messages`
  (the conventions' JSON: role and parts), `gen_ai.tool.definitions`; the output's
  `artstore.output.logprobs` (double array), `artstore.output.tokens` (string array) and
  `artstore.output.token_ids` (int array, where tokens are vLLM's `token_id:N`), which the
  conventions have no place for; `artstore.history` (0: the main history);
- `execute_tool {name}` per tool result: `gen_ai.tool.name`, `gen_ai.tool.call.id`,
  `gen_ai.tool.type`, `gen_ai.tool.call.arguments`, `gen_ai.tool.call.result`.

Each span also has OpenInference's `openinference.span.kind` (AGENT, LLM, TOOL), so
Phoenix shows them by kind. Times come from the recorded LLM calls where they match the
trajectory's turns, else are spread over the rollout's duration.

`follow_otlp` sends a run's rollouts as they end (finish or fail), each once, until
stopped (`artstore export RUN --otlp-endpoint URL --follow`), reading the event log through
`artstore.exchange.following`.

The file is OTLP JSON lines: one `ExportTraceServiceRequest` per line (as the collector's
file exporter writes), a chunk of rollouts per line; ids in hex, enums as integers.

Import reads such a file (or one JSON document), from artstore or from an instrumented
agent (OpenTelemetry GenAI or OpenInference attribute names): a trace is a rollout, its LLM
spans in time order its turns, `gen_ai.evaluation.result` events its rewards.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import json
import re
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from artstore.errors import ExchangeFormatError, ExportTargetError, NotFoundError
from artstore.exchange.files import existing_file, written_in_place
from artstore.exchange.following import POLL_S, ended_rollouts
from artstore.exchange.importer import ImportPlan, derived_id, file_sha256
from artstore.exchange.jsonl import FORMAT, is_choice, plan_of_lines, read_text_lines
from artstore.exchange.source import (
    ExportSummary,
    RolloutDetails,
    chunks,
    load_rollouts,
    load_run,
    run_scorer,
)

if TYPE_CHECKING:
    from artstore.store import Store

_TOKEN_ID = re.compile(r"token_id:(\d+)")
_LLM_OPERATIONS = {"chat", "text_completion", "generate_content"}


def trace_id_of(rollout_id: str) -> int:
    return int(hashlib.sha256(f"trace\x00{rollout_id}".encode()).hexdigest()[:32], 16) or 1


def _span_id(rollout_id: str, *where: Any) -> int:
    key = "\x00".join(map(str, (rollout_id, *where)))
    return int(hashlib.sha256(f"span\x00{key}".encode()).hexdigest()[:16], 16) or 1


# --- export -------------------------------------------------------------------------------


async def export_otlp(
    store: Store,
    run: str,
    out: str | Path | None,
    *,
    endpoint: str | None = None,
    force: bool = False,
    progress: Callable[[int, int], None] | None = None,
) -> ExportSummary:
    """Write `run`'s rollouts as OTLP JSON lines to `out`, or send them to `endpoint`
    (OTLP/HTTP, e.g. http://localhost:6006/v1/traces), a chunk of rollouts at a time."""
    if out is not None and str(out) != "-" and existing_file(Path(out)) is not None and not force:
        raise FileExistsError(f"{out} exists; nothing was written (--force overwrites it)")
    outline = await load_run(store, run)
    total = sum(len(group.rollout_ids) for group in outline.groups)
    summary = ExportSummary(
        run=run, path=str(out or endpoint), running_rollouts=outline.skipped_running
    )
    tracing = _Tracing(run)
    sender = _sender(endpoint) if endpoint else None
    with _lines(out) as write:
        for chunk in chunks(outline.groups):
            ids = [rid for group in chunk for rid in group.rollout_ids]
            details = await load_rollouts(store, ids, outline.info.scorer)
            for group in chunk:
                for rid in group.rollout_ids:
                    tracing.rollout(rid, group.group_id, details[rid], outline.info.scorer)
                    summary.trajectories += 1
                    summary.failed_rollouts += details[rid].failed is not None
                summary.groups += group.group_id is not None
            spans = tracing.take()
            if sender is not None:
                sender(spans)
            if write is not None:
                write(_otlp_json(spans))
            if progress is not None:
                progress(summary.trajectories, total)
    if out is not None and str(out) != "-":
        summary.files.append(str(out))
    return summary


@dataclass
class FollowSummary:
    """What `follow_otlp` sent, and how far it read the log."""

    run: str
    endpoint: str
    rollouts: int = 0
    failed_rollouts: int = 0
    # Every rollout of the run whose end event lies at or below it was sent: `after=` it
    # (`--after`) resumes without sending them again.
    position: int = 0


async def follow_otlp(
    store: Store,
    run: str,
    endpoint: str,
    *,
    after: int | None = None,
    stop: asyncio.Event | None = None,
    sent: Callable[[FollowSummary, int], None] | None = None,
    poll_s: float = POLL_S,
) -> FollowSummary:
    """Send `run`'s rollouts to `endpoint` (OTLP/HTTP) as they end, each once, until `stop`
    is set: first those that have ended (none with `after`: only those that end after that
    position), then each as it finishes or fails (`artstore.exchange.following`).

    `sent(summary, count)` is called after each batch of `count` rollouts went out.
    The spans are those of `export_otlp`, with the rewards recorded by the time the rollout
    is sent (a group's rewards usually come after its last rollout ended)."""
    tracing = _Tracing(run)
    send = _sender(endpoint)
    summary = FollowSummary(run=run, endpoint=endpoint, position=after or 0)
    following = ended_rollouts(store, run, after=after, stop=stop, poll_s=poll_s)
    async with contextlib.aclosing(following):  # a send that fails stops listening too
        async for batch in following:
            await _send_batch(store, run, batch.rollouts, tracing, send, summary)
            summary.position = max(summary.position, batch.position)
            if sent is not None and batch.rollouts:
                sent(summary, len(batch.rollouts))
    return summary


async def _send_batch(
    store: Store,
    run: str,
    rollouts: dict[str, str | None],
    tracing: _Tracing,
    send: Callable[[list[Any]], None],
    summary: FollowSummary,
) -> None:
    """The spans of `rollouts` (id -> group id), sent in one request."""
    if not rollouts:
        return
    scorer = await run_scorer(store, run)
    details = await load_rollouts(store, list(rollouts), scorer)
    for rid, group_id in rollouts.items():
        tracing.rollout(rid, group_id, details[rid], scorer)
    await asyncio.to_thread(send, tracing.take())  # meanwhile the loop still hears signals
    summary.rollouts += len(rollouts)
    summary.failed_rollouts += sum(details[rid].failed is not None for rid in rollouts)


def _lines(out: str | Path | None) -> Any:
    @contextlib.contextmanager
    def opened() -> Iterator[Callable[[str], None] | None]:
        if out is None:
            yield None
            return
        if str(out) == "-":
            yield lambda line: sys.stdout.write(line + "\n")
            sys.stdout.flush()
            return
        with written_in_place(Path(out)) as partial, open(partial, "w", encoding="utf-8") as f:
            yield lambda line: f.write(line + "\n")

    return opened()


def _sender(endpoint: str) -> Callable[[list[Any]], None]:
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace.export import SpanExportResult

    exporter = OTLPSpanExporter(endpoint=endpoint, timeout=30)

    def send(spans: list[Any]) -> None:
        if exporter.export(spans) is not SpanExportResult.SUCCESS:
            raise ExportTargetError(f"{endpoint}: the OTLP/HTTP endpoint refused the spans")

    return send


def _otlp_json(spans: list[Any]) -> str:
    from google.protobuf.json_format import MessageToDict
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

    document = MessageToDict(encode_spans(spans), use_integers_for_enums=True)
    for resource in document.get("resourceSpans", []):
        for scope in resource.get("scopeSpans", []):
            for span in scope.get("spans", []):
                for key in ("traceId", "spanId", "parentSpanId"):
                    if key in span:  # OTLP JSON writes ids in hex, not base64
                        span[key] = base64.b64decode(span[key]).hex()
                for link in span.get("links", []):
                    for key in ("traceId", "spanId"):
                        link[key] = base64.b64decode(link[key]).hex()
    return json.dumps(document, separators=(",", ":"))


class _Tracing:
    """A tracer whose ids are set before each span starts (derived from the rollout)."""

    def __init__(self, run: str) -> None:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
            InMemorySpanExporter,
        )
        from opentelemetry.sdk.trace.id_generator import IdGenerator

        class Derived(IdGenerator):
            trace_id = 1
            span_id = 1

            def generate_trace_id(self) -> int:
                return self.trace_id

            def generate_span_id(self) -> int:
                return self.span_id

        self.ids = Derived()
        self.collected = InMemorySpanExporter()
        resource = Resource.create({"service.name": "artstore", "artstore.run": run})
        self.provider = TracerProvider(resource=resource, id_generator=self.ids)
        self.provider.add_span_processor(SimpleSpanProcessor(self.collected))
        self.tracer = self.provider.get_tracer("artstore.exchange.otlp")

    def take(self) -> list[Any]:
        spans = list(self.collected.get_finished_spans())
        self.collected.clear()
        return spans

    def span(self, name: str, rid: str, key: tuple, parent: Any, start: int, **kw: Any) -> Any:
        from opentelemetry import trace

        self.ids.trace_id = trace_id_of(rid)
        self.ids.span_id = _span_id(rid, *key)
        context = trace.set_span_in_context(parent) if parent is not None else None
        return self.tracer.start_span(name, context=context, start_time=start, **kw)

    def rollout(self, rid: str, group_id: str | None, d: RolloutDetails, scorer: str) -> None:
        from opentelemetry.trace import SpanKind, Status, StatusCode

        started = d.started
        end = d.finished or d.failed
        start_ns = _ns(started.started_at)
        end_ns = start_ns + int(max(getattr(end, "duration_s", 0.0) or 0.0, 0.0) * 1e9)
        root = self.span(
            f"invoke_agent {started.model}",
            rid,
            ("agent",),
            None,
            start_ns,
            kind=SpanKind.INTERNAL,
            attributes=_agent_attributes(rid, group_id, d, scorer),
        )
        turns = list(_turns(d))
        calls = d.calls if len(d.calls) == sum(1 for t in turns if t[0] == "chat") else []
        self._children(rid, root, turns, calls, start_ns, max(end_ns, start_ns + len(turns)))
        for row in d.rewards:
            root.add_event(
                "gen_ai.evaluation.result",
                attributes={
                    "gen_ai.evaluation.name": row.scorer,
                    "gen_ai.evaluation.score.value": float(row.reward),
                    "artstore.reward.rescored": bool(row.rescored),
                    "artstore.reward.position": int(row.position),
                },
                timestamp=end_ns,
            )
        if d.failed is not None:
            root.add_event(
                "exception",
                attributes={
                    "exception.type": d.failed.error_type,
                    "exception.message": d.failed.error_message,
                    "exception.stacktrace": d.failed.traceback,
                },
                timestamp=end_ns,
            )
            root.set_status(Status(StatusCode.ERROR, d.failed.error_message))
        root.end(end_time=max(end_ns, start_ns + len(turns)))

    def _children(
        self, rid: str, root: Any, turns: list, calls: list, start_ns: int, end_ns: int
    ) -> None:
        from opentelemetry.trace import SpanKind

        step = (end_ns - start_ns) // max(len(turns), 1)
        chat = 0
        for index, (kind, name, attributes) in enumerate(turns):
            begin, finish = start_ns + index * step, start_ns + (index + 1) * step
            if kind == "chat" and calls:
                call = calls[chat]
                begin = _ns(call.started_at)
                finish = begin + int((call.latency_s or 0.0) * 1e9)
                attributes = {**attributes, **_call_attributes(call)}
            chat += kind == "chat"
            span = self.span(
                f"{'chat' if kind == 'chat' else 'execute_tool'} {name}",
                rid,
                (kind, index),
                root,
                begin,
                kind=SpanKind.CLIENT if kind == "chat" else SpanKind.INTERNAL,
                attributes=attributes,
            )
            span.end(end_time=max(finish, begin))


def _ns(moment: Any) -> int:
    return int(moment.timestamp() * 1e9)


def _agent_attributes(rid: str, group_id: str | None, d: RolloutDetails, scorer: str) -> dict:
    started = d.started
    attributes: dict[str, Any] = {
        "gen_ai.operation.name": "invoke_agent",
        "gen_ai.agent.name": started.model,
        "gen_ai.conversation.id": rid,
        "openinference.span.kind": "AGENT",
        "artstore.rollout.id": rid,
        "artstore.role": started.role,
        "artstore.status": "failed" if d.failed else "finished",
        "artstore.scenario": json.dumps(started.scenario),
    }
    if started.run:
        attributes["artstore.run"] = started.run
    if group_id:
        attributes["artstore.group.id"] = group_id
    if started.scenario_index is not None:
        attributes["artstore.scenario_index"] = started.scenario_index
    if started.policy_step is not None:
        attributes["artstore.policy_step"] = started.policy_step
    if d.trajectory.reward is not None and d.rewards:
        attributes["artstore.reward"] = float(d.trajectory.reward)
        attributes["artstore.scorer"] = scorer
    return attributes


def _call_attributes(call: Any) -> dict[str, Any]:
    found: dict[str, Any] = {}
    if call.model:
        found["gen_ai.request.model"] = found["gen_ai.response.model"] = call.model
    if call.prompt_tokens is not None:
        found["gen_ai.usage.input_tokens"] = call.prompt_tokens
    if call.completion_tokens is not None:
        found["gen_ai.usage.output_tokens"] = call.completion_tokens
    if call.finish_reason:
        found["gen_ai.response.finish_reasons"] = [call.finish_reason]
    return found


def _turns(d: RolloutDetails) -> Iterator[tuple[str, str, dict[str, Any]]]:
    """(kind, name, attributes) of each LLM call and tool result, history by history."""
    trajectory = d.trajectory
    histories = [trajectory, *trajectory.additional_histories]
    for number, history in enumerate(histories):
        items = [_plain(item) for item in history.messages_and_choices]
        tools = history.tools
        asked: dict[str, tuple[str, str]] = {}
        for index, item in enumerate(items):
            message = item["message"] if is_choice(item) else item
            if message.get("role") == "assistant":
                for call in message.get("tool_calls") or []:
                    asked[call.get("id")] = _name_and_arguments(call)
                yield "chat", d.started.model, _chat_attributes(items, index, tools, number, d)
            elif message.get("role") == "tool" and message.get("tool_call_id") in asked:
                name, arguments = asked[message["tool_call_id"]]
                yield (
                    "tool",
                    name or "tool",
                    {
                        "gen_ai.operation.name": "execute_tool",
                        "gen_ai.tool.name": name or "",
                        "gen_ai.tool.type": "function",
                        "gen_ai.tool.call.id": message["tool_call_id"],
                        "gen_ai.tool.call.arguments": arguments or "",
                        "gen_ai.tool.call.result": _text(message.get("content")),
                        "openinference.span.kind": "TOOL",
                        "tool.name": name or "",
                    },
                )


def _name_and_arguments(call: dict[str, Any]) -> tuple[str | None, str | None]:
    """A tool call's name and JSON arguments, in OpenAI's shape or LangChain's (name, args)."""
    if "function" in call:
        function = call.get("function") or {}
        return function.get("name"), function.get("arguments")
    return call.get("name"), json.dumps(call.get("args") or {})


def _plain(item: Any) -> dict[str, Any]:
    if isinstance(item, dict):
        return item
    return item.model_dump(mode="python")


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text") or "" for p in content if isinstance(p, dict))
    return ""


def _chat_attributes(
    items: list[dict], index: int, tools: Any, history: int, d: RolloutDetails
) -> dict[str, Any]:
    item = items[index]
    output = item["message"] if is_choice(item) else item
    finish = item.get("finish_reason") if is_choice(item) else None
    model = d.started.model
    attributes: dict[str, Any] = {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "openai",
        "gen_ai.request.model": model,
        "gen_ai.input.messages": json.dumps(
            [_genai_message(m["message"] if is_choice(m) else m) for m in items[:index]]
        ),
        "gen_ai.output.messages": json.dumps(
            [{**_genai_message(output), "finish_reason": finish or "stop"}]
        ),
        "openinference.span.kind": "LLM",
        "llm.model_name": model,
        "artstore.history": history,
    }
    if finish:
        attributes["gen_ai.response.finish_reasons"] = [finish]
    if tools:
        attributes["gen_ai.tool.definitions"] = json.dumps(tools)
    tokens = ((item.get("logprobs") or {}).get("content") or []) if is_choice(item) else []
    if tokens:
        # A logprob of -inf is kept: an OTLP double holds it (JSON writes "-Infinity").
        attributes["artstore.output.logprobs"] = [float(t["logprob"]) for t in tokens]
        attributes["artstore.output.tokens"] = [t["token"] for t in tokens]
        ids = [_TOKEN_ID.fullmatch(t["token"] or "") for t in tokens]
        if all(ids):
            attributes["artstore.output.token_ids"] = [int(m[1]) for m in ids if m]
    return attributes


def _genai_message(message: dict[str, Any]) -> dict[str, Any]:
    """An OpenAI chat message in the GenAI conventions' JSON: role and parts."""
    role = message.get("role") or "user"
    parts: list[dict[str, Any]] = []
    if role == "tool":
        return {
            "role": "tool",
            "parts": [
                {
                    "type": "tool_call_response",
                    "id": message.get("tool_call_id"),
                    "response": _text(message.get("content")),
                }
            ],
        }
    text = _text(message.get("content"))
    if text:
        parts.append({"type": "text", "content": text})
    for call in message.get("tool_calls") or []:
        name, text = _name_and_arguments(call)
        try:
            arguments = json.loads(text or "{}")
        except ValueError:
            arguments = text
        parts.append(
            {"type": "tool_call", "id": call.get("id"), "name": name, "arguments": arguments}
        )
    return {"role": role, "parts": parts}


# --- import -------------------------------------------------------------------------------


def _value(value: dict[str, Any]) -> Any:
    """An OTLP JSON AnyValue as Python."""
    for key in ("stringValue", "boolValue", "bytesValue"):
        if key in value:
            return value[key]
    if "intValue" in value:
        return int(value["intValue"])
    if "doubleValue" in value:
        return float(value["doubleValue"])
    if "arrayValue" in value:
        return [_value(v) for v in value["arrayValue"].get("values", [])]
    if "kvlistValue" in value:
        return {kv["key"]: _value(kv.get("value", {})) for kv in value["kvlistValue"]["values"]}
    return None


def _attributes(items: list[dict[str, Any]]) -> dict[str, Any]:
    return {item["key"]: _value(item.get("value") or {}) for item in items or []}


def _spans(path: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    documents = (
        [(str(path), json.loads(path.read_text(encoding="utf-8")))]
        if path.suffix == ".json"
        else read_text_lines(path)
    )
    for where, document in documents:
        if not isinstance(document, dict) or "resourceSpans" not in document:
            raise ExchangeFormatError(
                f"{where}: not OTLP JSON (no resourceSpans; an ExportTraceServiceRequest "
                "per line is expected)"
            )
        for resource in document["resourceSpans"]:
            for scope in resource.get("scopeSpans") or []:
                for span in scope.get("spans") or []:
                    yield where, span


def _gen_ai_parts(message: dict[str, Any]) -> list[dict[str, Any]]:
    """A GenAI-convention message as OpenAI chat messages (a tool response each its own)."""
    role = message.get("role") or "user"
    texts, calls, answers = [], [], []
    for part in message.get("parts") or []:
        kind = part.get("type")
        if kind == "text":
            texts.append(part.get("content") or "")
        elif kind == "tool_call":
            arguments = part.get("arguments")
            calls.append(
                {
                    "id": part.get("id") or "",
                    "type": "function",
                    "function": {
                        "name": part.get("name") or "",
                        "arguments": arguments
                        if isinstance(arguments, str)
                        else json.dumps(arguments or {}),
                    },
                }
            )
        elif kind == "tool_call_response":
            response = part.get("response")
            answers.append(
                {
                    "role": "tool",
                    "tool_call_id": part.get("id") or "",
                    "content": response if isinstance(response, str) else json.dumps(response),
                }
            )
    if answers:
        return answers
    found: dict[str, Any] = {"role": role, "content": "".join(texts)}
    if calls:
        found["tool_calls"] = calls
    return [found]


def _openinference(attributes: dict[str, Any], prefix: str) -> list[dict[str, Any]]:
    """OpenInference's flattened `llm.input_messages.N.message.*` as OpenAI chat messages."""
    found: dict[int, dict[str, Any]] = {}
    pattern = re.compile(rf"{re.escape(prefix)}\.(\d+)\.message\.(.+)")
    for key, value in attributes.items():
        match = pattern.fullmatch(key)
        if not match:
            continue
        message = found.setdefault(int(match[1]), {})
        field = match[2]
        call = re.fullmatch(
            r"tool_calls\.(\d+)\.tool_call\.(id|function\.name|function\.arguments)", field
        )
        if call:
            calls = message.setdefault("_calls", {}).setdefault(int(call[1]), {})
            calls[call[2]] = value
        elif field in ("role", "content", "tool_call_id"):
            message[field] = value
    messages = []
    for _, message in sorted(found.items()):
        calls = message.pop("_calls", {})
        message.setdefault("role", "user")
        message.setdefault("content", "")
        if calls:
            message["tool_calls"] = [
                {
                    "id": c.get("id") or "",
                    "type": "function",
                    "function": {
                        "name": c.get("function.name") or "",
                        "arguments": c.get("function.arguments") or "{}",
                    },
                }
                for _, c in sorted(calls.items())
            ]
        messages.append(message)
    return messages


def _llm_turn(attributes: dict[str, Any]) -> tuple[list[dict], dict] | None:
    """The input messages and the output item (a Choice with logprobs where given) of an
    LLM span, or None for a span of another kind."""
    operation = attributes.get("gen_ai.operation.name")
    if operation in _LLM_OPERATIONS:
        inputs = [
            m
            for message in json.loads(attributes.get("gen_ai.input.messages") or "[]")
            for m in _gen_ai_parts(message)
        ]
        outputs = json.loads(attributes.get("gen_ai.output.messages") or "[]")
        output = _gen_ai_parts(outputs[0])[0] if outputs else {"role": "assistant", "content": ""}
    elif attributes.get("openinference.span.kind") == "LLM":
        inputs = _openinference(attributes, "llm.input_messages")
        outputs = _openinference(attributes, "llm.output_messages")
        output = outputs[0] if outputs else {"role": "assistant", "content": ""}
    else:
        return None
    output = {**output, "role": "assistant"}
    logprobs = attributes.get("artstore.output.logprobs")
    if not logprobs:
        return inputs, output
    tokens = attributes.get("artstore.output.tokens") or [
        f"token_id:{i}" for i in attributes.get("artstore.output.token_ids") or []
    ]
    reasons = attributes.get("gen_ai.response.finish_reasons") or ["stop"]
    choice = {
        "finish_reason": reasons[0],
        "index": 0,
        "logprobs": {
            "content": [
                {
                    "token": tokens[i] if i < len(tokens) else "",
                    "logprob": logprob,
                    "bytes": None,
                    "top_logprobs": [],
                }
                for i, logprob in enumerate(logprobs)
            ],
            "refusal": None,
        },
        "message": {
            "role": "assistant",
            "content": output.get("content"),
            "tool_calls": output.get("tool_calls"),
            "refusal": None,
        },
    }
    return inputs, choice


def _same(a: Any, b: Any) -> bool:
    def key(item: Any) -> tuple:
        message = item["message"] if is_choice(item) else item
        calls = [c.get("id") for c in message.get("tool_calls") or []]
        return (message.get("role"), _text(message.get("content")), calls)

    return key(a) == key(b)


def _histories(turns: list[tuple[list[dict], dict]]) -> list[list[Any]]:
    """LLM turns in time order as histories: a turn whose input continues a history (that
    history's items are its input's first ones) extends it, any other starts one."""
    histories: list[list[Any]] = []
    for inputs, output in turns:
        for history in histories:
            if len(history) <= len(inputs) and all(
                _same(a, b) for a, b in zip(history, inputs, strict=False)
            ):
                history.extend(inputs[len(history) :])
                history.append(output)
                break
        else:
            histories.append([*inputs, output])
    return histories


def _trace_line(trace: list[tuple[str, dict[str, Any]]], digest: str, run: str) -> dict[str, Any]:
    """One trace (its spans) as a line of artstore's JSONL export."""
    spans = sorted(trace, key=lambda s: int(s[1].get("startTimeUnixNano") or 0))
    ids = {span.get("spanId") for _, span in spans}
    root = next((s for _, s in spans if s.get("parentSpanId") not in ids), spans[0][1])
    attributes = _attributes(root.get("attributes"))
    turns = [t for _, s in spans if (t := _llm_turn(_attributes(s.get("attributes"))))]
    histories = _histories(turns) or [[]]
    rewards = [
        {
            "scorer": str(event_attributes.get("gen_ai.evaluation.name") or "imported"),
            "reward": float(event_attributes["gen_ai.evaluation.score.value"]),
            "rescored": bool(event_attributes.get("artstore.reward.rescored")),
            "position": int(event_attributes.get("artstore.reward.position") or 0),
        }
        for _, span in spans
        for event in span.get("events") or []
        if event.get("name") == "gen_ai.evaluation.result"
        and "gen_ai.evaluation.score.value"
        in (event_attributes := _attributes(event.get("attributes")))
    ]
    failed = (root.get("status") or {}).get("code") == 2
    model = str(attributes.get("gen_ai.agent.name") or "agent")
    rollout_id = str(
        attributes.get("artstore.rollout.id") or derived_id("otlp", digest, root.get("traceId"))
    )
    group_id = attributes.get("artstore.group.id")
    start = int(root.get("startTimeUnixNano") or 0)
    end = int(root.get("endTimeUnixNano") or start)
    return {
        "format": FORMAT,
        "run": {"name": run, "model": model},
        "rollout_id": rollout_id,
        "group": {"group_id": str(group_id), "sealed": False} if group_id else None,
        "model": model,
        "role": attributes.get("artstore.role")
        if attributes.get("artstore.role") in ("policy", "validation")
        else "policy",
        "policy_step": attributes.get("artstore.policy_step"),
        "scenario_index": attributes.get("artstore.scenario_index"),
        "started_at": (
            datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=start // 1000)
        ).isoformat(),
        "duration_s": max(end - start, 0) / 1e9,
        "status": "failed" if failed else "finished",
        "error": {
            "type": "Error",
            "message": (root.get("status") or {}).get("message") or "",
            "traceback": "",
        }
        if failed
        else None,
        "metadata": {"otlp_trace_id": str(root.get("traceId") or "")},
        "rewards": rewards,
        "trajectory": {
            "messages_and_choices": histories[0],
            "additional_histories": [{"messages_and_choices": h} for h in histories[1:]],
        },
    }


def read_otlp(path: str | Path, *, run: str | None = None, scorer: str = "imported") -> ImportPlan:
    """The import plan of an OTLP JSON file: a rollout per trace."""
    path = Path(path)
    if not path.is_file():
        raise NotFoundError(f"{path}: no such file")
    digest = file_sha256(path)
    traces: dict[str, list[tuple[str, dict[str, Any]]]] = {}
    first_run: str | None = None
    try:
        for where, span in _spans(path):
            traces.setdefault(str(span.get("traceId")), []).append((where, span))
            if first_run is None:  # the run artstore exported (on its rollouts' spans)
                first_run = _attributes(span.get("attributes")).get("artstore.run")
        name = run or first_run or path.stem
        lines = [(trace[0][0], _trace_line(trace, digest, name)) for trace in traces.values()]
    except ExchangeFormatError:
        raise
    except (ValueError, KeyError, TypeError, AttributeError, IndexError) as exc:
        raise ExchangeFormatError(
            f"{path}: malformed OTLP JSON ({type(exc).__name__}: {exc})"
        ) from None
    if not lines:
        raise ExchangeFormatError(f"{path}: no spans, nothing to import")
    return plan_of_lines(path, lines, run=None, scorer=scorer, source="otlp")
