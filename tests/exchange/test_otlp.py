"""OpenTelemetry GenAI traces out and in, on SQLite and on PostgreSQL.

- `artstore export RUN --format otlp OUT` writes OTLP JSON lines: a trace per rollout
  (its id derived from the rollout id: the same traces twice), `invoke_agent`, `chat
  {model}` and `execute_tool` spans with the GenAI conventions' attributes, rewards as
  `gen_ai.evaluation.result` events, logprobs as `artstore.output.*`;
- `--otlp-endpoint` sends the same spans over OTLP/HTTP (a receiver in the test decodes
  the protobuf with opentelemetry-proto);
- `artstore import FILE --format otlp` gives back the messages, tool calls, logprobs and
  rewards; spans with OpenInference's attribute names import too; a file that is not OTLP
  JSON imports nothing, with one line.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from openai.types.chat.chat_completion import Choice
from otlp_receiver import receiver
from sqlalchemy import select
from test_export_import import (
    RUN,
    _record,
    cli,
    one_line,
    rows,
)

import artstore
from artstore.exchange.otlp import trace_id_of
from artstore.schema import tables as t

PARIS = '{"city":"Paris"}'
IDS = ["g0-a", "g0-b", "g0-v", "g1-a", "g1-x"]


def spans_of(path: Path) -> list[dict]:
    return [
        span
        for line in path.read_text().splitlines()
        for resource in json.loads(line)["resourceSpans"]
        for scope in resource["scopeSpans"]
        for span in scope["spans"]
    ]


def attributes(span: dict) -> dict:
    def value(v: dict):
        if "arrayValue" in v:
            return [value(x) for x in v["arrayValue"].get("values", [])]
        return next(iter(v.values()))

    return {a["key"]: value(a["value"]) for a in span.get("attributes", [])}


def call_of(call: dict) -> tuple:
    if "function" in call:  # OpenAI's shape; LangChain's has name and args
        return call["id"], call["function"]["name"], json.loads(call["function"]["arguments"])
    return call["id"], call["name"], call["args"]


def plain(messages: list) -> list[tuple]:
    """What a message says: role, text, tool calls (id, name, arguments), the call answered."""
    return [
        (
            m["role"],
            m.get("content") or "",
            [call_of(c) for c in m.get("tool_calls") or []],
            m.get("tool_call_id"),
        )
        for m in messages
    ]


def test_otlp_export_is_genai_traces_sent_alike_and_imports_back(
    database_url: str,
    other_database_url: str,
    tmp_path: Path,
):
    asyncio.run(_record(database_url))
    out = tmp_path / "run.otlp.jsonl"
    for force in ([], ["--force"]):  # exported twice: the same traces, byte for byte
        result = cli("export", RUN, str(out), "--format", "otlp", *force, "--url", database_url)
        assert result.exit_code == 0, result.output
        if not force:
            first = out.read_bytes()
    assert out.read_bytes() == first

    spans = spans_of(out)
    roots = [s for s in spans if "parentSpanId" not in s]
    assert [s["traceId"] for s in roots] == [f"{trace_id_of(rid):032x}" for rid in IDS]
    root = attributes(roots[0])
    assert root["gen_ai.operation.name"] == "invoke_agent"
    assert (root["artstore.rollout.id"], root["artstore.run"]) == ("g0-a", RUN)
    evaluations = {
        (attributes(e)["gen_ai.evaluation.name"], attributes(e)["gen_ai.evaluation.score.value"])
        for e in roots[0]["events"]
        if e["name"] == "gen_ai.evaluation.result"
    }
    assert evaluations == {("correct", 1.0), ("judge", 0.75)}
    assert roots[-1]["status"]["code"] == 2  # g1-x failed
    of_a = [s for s in spans if s["traceId"] == roots[0]["traceId"]]
    names = [s["name"] for s in of_a]
    assert names.count("chat agent") == 3 and names.count("execute_tool search") == 1
    chats = [attributes(s) for s in of_a if s["name"] == "chat agent"]
    answer = next(c for c in chats if "answer of g0-a" in c["gen_ai.output.messages"])
    assert answer["gen_ai.response.finish_reasons"] == ["stop"]
    assert answer["artstore.output.logprobs"] == [-0.5, -0.5, "-Infinity"]
    assert answer["gen_ai.response.model"] == "m"  # from the recorded call
    inputs = json.loads(answer["gen_ai.input.messages"])
    assert [m["role"] for m in inputs] == ["system", "user", "assistant", "tool"]
    assert inputs[2]["parts"][0]["type"] == "tool_call"
    assert inputs[3]["parts"][0] == {
        "type": "tool_call_response",
        "id": "call-1-0",
        "response": "found it",
    }
    tool = attributes(next(s for s in of_a if s["name"] == "execute_tool search"))
    assert (tool["gen_ai.tool.call.id"], tool["gen_ai.tool.call.result"]) == (
        "call-1-0",
        "found it",
    )

    with receiver() as (endpoint, received):
        result = cli("export", RUN, "--otlp-endpoint", endpoint, "--url", database_url)
        assert result.exit_code == 0, result.output
    sent = [(trace, span, name) for trace, span, name, _ in received.spans]
    assert sent == [(s["traceId"], s["spanId"], s["name"]) for s in spans]

    result = cli("import", str(out), "--format", "otlp", "--url", other_database_url)
    assert result.exit_code == 0, result.output
    assert "imported 5 rollouts" in one_line(result.stdout)

    async def compare() -> None:
        async with (
            await artstore.open_store(database_url) as original,
            await artstore.open_store(other_database_url) as copy,
        ):
            before = await original.trajectories(IDS, scorer="correct")
            after = await copy.trajectories(IDS, scorer="correct")
            for rid in IDS:
                assert plain(after[rid].messages()) == plain(before[rid].messages()), rid
                assert len(after[rid].additional_histories) == len(before[rid].additional_histories)
                assert after[rid].reward == before[rid].reward
            answer = after["g0-a"].messages_and_choices[4]
            assert isinstance(answer, Choice)
            assert [c.logprob for c in answer.logprobs.content] == [-0.5, -0.5, float("-inf")]
            query = select(t.rewards.c["rollout_id", "scorer", "reward"]).order_by(
                t.rewards.c.rollout_id, t.rewards.c.scorer, t.rewards.c.reward
            )
            assert await rows(copy, query) == await rows(original, query)

    asyncio.run(compare())


def openinference_trace() -> dict:
    """Spans as Phoenix's OpenInference instrumentors write them."""

    def attribute(key: str, value):
        kind = "intValue" if isinstance(value, int) else "stringValue"
        return {"key": key, "value": {kind: value}}

    llm = {
        "openinference.span.kind": "LLM",
        "llm.model_name": "gpt-x",
        "llm.input_messages.0.message.role": "user",
        "llm.input_messages.0.message.content": "weather in Paris?",
        "llm.output_messages.0.message.role": "assistant",
        "llm.output_messages.0.message.tool_calls.0.tool_call.id": "t1",
        "llm.output_messages.0.message.tool_calls.0.tool_call.function.name": "weather",
        "llm.output_messages.0.message.tool_calls.0.tool_call.function.arguments": PARIS,
    }
    second = {
        "openinference.span.kind": "LLM",
        "llm.input_messages.0.message.role": "user",
        "llm.input_messages.0.message.content": "weather in Paris?",
        "llm.input_messages.1.message.role": "assistant",
        "llm.input_messages.1.message.tool_calls.0.tool_call.id": "t1",
        "llm.input_messages.1.message.tool_calls.0.tool_call.function.name": "weather",
        "llm.input_messages.1.message.tool_calls.0.tool_call.function.arguments": PARIS,
        "llm.input_messages.2.message.role": "tool",
        "llm.input_messages.2.message.tool_call_id": "t1",
        "llm.input_messages.2.message.content": "sunny",
        "llm.output_messages.0.message.role": "assistant",
        "llm.output_messages.0.message.content": "It is sunny.",
    }
    spans = [
        {
            "spanId": "01",
            "name": "agent",
            "startTimeUnixNano": "1000",
            "attributes": [attribute("openinference.span.kind", "AGENT")],
        },
        {
            "spanId": "02",
            "parentSpanId": "01",
            "name": "llm",
            "startTimeUnixNano": "2000",
            "attributes": [attribute(k, v) for k, v in llm.items()],
        },
        {
            "spanId": "03",
            "parentSpanId": "01",
            "name": "llm",
            "startTimeUnixNano": "3000",
            "attributes": [attribute(k, v) for k, v in second.items()],
        },
    ]
    for span in spans:
        span["traceId"] = "ab" * 16
    return {"resourceSpans": [{"scopeSpans": [{"spans": spans}]}]}


def test_openinference_spans_import_and_a_bad_file_imports_nothing(
    database_url: str, tmp_path: Path
):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"spans": []}\n')
    refused = cli("import", str(bad), "--format", "otlp", "--url", database_url)
    assert refused.exit_code == 1
    assert "not OTLP JSON" in one_line(refused.output)

    good = tmp_path / "phoenix.json"
    good.write_text(json.dumps(openinference_trace()))
    result = cli("import", str(good), "--format", "otlp", "--url", database_url)
    assert result.exit_code == 0, result.output

    async def check() -> None:
        async with await artstore.open_store(database_url) as store:
            assert await rows(store, select(t.runs.c.run)) == [("phoenix",)]
            [(rid,)] = await rows(store, select(t.rollouts.c.rollout_id))
            messages = (await store.trajectory(rid)).messages()
            assert [m["role"] for m in messages] == ["user", "assistant", "tool", "assistant"]
            assert messages[1]["tool_calls"][0]["function"]["name"] == "weather"
            assert messages[3]["content"] == "It is sunny."

    asyncio.run(check())
