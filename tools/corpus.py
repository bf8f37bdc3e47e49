"""A seeded corpus of agent training traffic, for every size measurement (issue 29).

The run of `tools/bench_queries.py` repeats a few short answers, which flatters any
compression (columnar parquet most of all). This module generates a run with the variety
of real agent traffic, as the events and blobs artstore's capture layer records for it,
so that the same run can be written to SQLite, to PostgreSQL and to ART's parquet and
the sizes compared. What it models, and why:

- **Text**: words drawn from a Zipf distribution (exponent 1.05) over a vocabulary of
  `VOCABULARY` (40,000) made-up words of 1 to 4 syllables, the shape of word frequencies
  in natural language: a few words are everywhere, most are rare. Compressors see what
  they see in real text, neither a handful of repeated strings nor random bytes.
- **Runs**: train steps of 25 groups x 8 rollouts (the layout of bench_queries.py, so the
  analysis questions apply unchanged), one scenario per group: a question of 8 to 30 words.
- **Conversations**: 2 to 40 LLM calls per rollout (2 + an exponential of mean 5, capped:
  most agents finish in a few calls, some wander for long). Every call but the last asks
  for one or two of eight tools (JSON arguments of a few Zipf words); the last answers in
  20 to 400 tokens. Each call's input is the whole conversation so far (system prompt,
  question, every answer and tool result), stored as the capture layer stores it: each
  message once as a content-addressed blob, the call naming them by hash.
- **Tool outputs**: 100 bytes to 20 KB, log-uniform (most are short, a few are pages).
  Half of them come from the scenario's own pool of 24 documents (a search returns the
  same pages to the rollouts of one question, as it does in real runs); the rest are
  fresh text.
- **Logprobs**: every completion token carries its logprob and its top-5 alternatives
  (OpenAI's chat-completions shape: `token`, `logprob`, `bytes`, `top_logprobs`), the
  values float32 widened to float64 as vLLM returns them; the chosen token's logprob is
  near 0 (exponential, mean 0.3), the alternatives lower.
- **Failures and retries**: 2% of LLM calls fail (a rate limit or a timeout, recorded
  with its error and no output) and are retried at once with the same input; 3% of
  rollout attempts fail (a tool raises: `rollout.failed` with a traceback) and the group
  tries again with a new rollout id, so a group is 8 finished rollouts plus its failed
  attempts (never more failed than finished ones before each attempt). Rewards are
  recorded for the finished ones.
- **Training**: every group is rewarded (scorer `correct`), sealed and trained at its
  step (`train_step.started` / `completed`), as in bench_queries.py.

Everything comes from one `random.Random(seed)`: the same seed gives the same events,
blobs and ids, byte for byte (`fingerprint()` hashes them; tests/tools/test_corpus.py
checks it). Timestamps are fixed offsets from `BASE`. The generator holds one step's
appends at a time (`steps()` yields them), so 100,000 rollouts never sit in memory.

    python tools/corpus.py --rollouts 1000     # prints the corpus's shape and fingerprint
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import math
import random
import struct
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage, ToolMessage

from artstore.documents import messages as lc
from artstore.events import (
    Event,
    GroupSealed,
    LLMCall,
    RewardsRecorded,
    RolloutFailed,
    RolloutFinished,
    RolloutStarted,
    RunFinished,
    RunStarted,
    TrainStepCompleted,
    TrainStepStarted,
)
from artstore.eventstore import blob_hash
from artstore.eventstore.blobs import canonical_json
from artstore.groups import group_id_for

PROJECT = "corpus"
RUN = "corpus/agent-001"
MODEL = "corpus/agent-001"
SCORER = "correct"
GROUPS_PER_STEP = 25
GROUP_SIZE = 8
ROLLOUTS_PER_STEP = GROUPS_PER_STEP * GROUP_SIZE
BASE = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)

VOCABULARY = 40_000
ZIPF_EXPONENT = 1.05
MAX_CALLS = 40
MEAN_EXTRA_CALLS = 5.0
TOOL_OUTPUT_BYTES = (100, 20_000)
DOCUMENTS_PER_SCENARIO = 24
SHARED_TOOL_OUTPUTS = 0.5
TOP_LOGPROBS = 5
CALL_FAILURE_RATE = 0.02
ROLLOUT_FAILURE_RATE = 0.03
TOOL_NAMES = (
    "search",
    "read_page",
    "calculator",
    "sql_query",
    "list_files",
    "read_file",
    "send_email",
    "lookup_user",
)
SYLLABLES = [c + v for c in "bdfgklmnprstvz" for v in ("a", "e", "i", "o", "u", "ai", "ou")]


@dataclass
class Append:
    """One `store.append_nowait(stream, events, blobs=blobs)`."""

    stream: str
    events: list[Event]
    blobs: dict[str, str] = field(default_factory=dict)


class Words:
    """The Zipf-distributed vocabulary and the run's random source."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.words = [_word(rank) for rank in range(VOCABULARY)]
        weights = [1.0 / (rank + 1) ** ZIPF_EXPONENT for rank in range(VOCABULARY)]
        self.cumulative = list(itertools.accumulate(weights))

    def draw(self, count: int) -> list[str]:
        return self.rng.choices(self.words, cum_weights=self.cumulative, k=count)

    def text(self, count: int) -> str:
        return " ".join(self.draw(count))

    def text_of_bytes(self, size: int) -> str:
        """Lines of 12 Zipf words each, cut at exactly `size` bytes (ASCII)."""
        text = ""
        while len(text) < size:
            words = self.draw(max(12, (size - len(text)) // 4))
            lines = [" ".join(words[i : i + 12]) + "." for i in range(0, len(words), 12)]
            text += "\n".join(lines) + "\n"
        return text[:size]


def _word(rank: int) -> str:
    """Word `rank` of the vocabulary: frequent words are short, as in natural language."""
    syllables = 1 + (rank >= 90) + (rank >= 2_000) + (rank >= 20_000)
    digits = []
    for _ in range(syllables):
        rank, digit = divmod(rank, len(SYLLABLES))
        digits.append(SYLLABLES[digit])
    return "".join(digits)


def _float32(value: float) -> float:
    """`value` rounded to float32 and widened back, as vLLM's logprobs arrive."""
    return struct.unpack("<f", struct.pack("<f", value))[0]


def _logprobs(words: Words, tokens: list[str]) -> list[dict[str, Any]]:
    """OpenAI's per-token entries: the chosen token and its top-5 alternatives."""
    rng = words.rng
    entries = []
    for token in tokens:
        chosen = -_float32(rng.expovariate(1 / 0.3))
        alternatives = [token, *(" " + w for w in words.draw(TOP_LOGPROBS - 1))]
        below = chosen
        top = []
        for alternative in alternatives:
            top.append(
                {"token": alternative, "logprob": below, "bytes": list(alternative.encode())}
            )
            below = _float32(below - rng.expovariate(1 / 1.5))
        entries.append(
            {
                "token": token,
                "logprob": chosen,
                "bytes": list(token.encode()),
                "top_logprobs": top,
            }
        )
    return entries


def _tokens(text: str) -> list[str]:
    """Word-level tokens with their leading space, as BPE vocabularies mostly split text."""
    words = text.split(" ")
    return [words[0], *(" " + w for w in words[1:])] if text else []


@dataclass
class Scenario:
    index: int
    question: str
    answer: str
    documents: list[str]


def _scenario(words: Words, index: int) -> Scenario:
    rng = words.rng
    documents = [words.text_of_bytes(_tool_output_size(rng)) for _ in range(DOCUMENTS_PER_SCENARIO)]
    question = words.text(rng.randint(8, 30)) + "?"
    return Scenario(index, question, words.text(rng.randint(1, 4)), documents)


def _tool_output_size(rng: random.Random) -> int:
    low, high = TOOL_OUTPUT_BYTES
    return int(math.exp(rng.uniform(math.log(low), math.log(high))))


def _tools() -> list[dict[str, Any]]:
    return [
        {
            "type": "function",
            "function": {
                "name": name,
                "description": f"{name.replace('_', ' ')}: returns text",
                "parameters": {
                    "type": "object",
                    "properties": {"query": {"type": "string"}, "limit": {"type": "integer"}},
                    "required": ["query"],
                },
            },
        }
        for name in TOOL_NAMES
    ]


SYSTEM = SystemMessage(
    "You are a research agent. Use the tools to find what the question asks, read what "
    "they return, and answer in a few sentences. Cite the pages you used."
)


@dataclass
class _Call:
    """What one LLM call of a conversation produced."""

    output: AIMessage | None
    error: tuple[str, str] | None
    prompt_tokens: int
    completion_tokens: int
    latency_s: float


def _answer(words: Words, scenario: Scenario, last: bool, prompt: int) -> _Call:
    """The model's answer: tool calls until the last call, then text."""
    rng = words.rng
    if last:
        content = scenario.answer + ". " + words.text(rng.randint(20, 400))
        tool_calls: list[dict[str, Any]] = []
        tokens = _tokens(content)
    else:
        content = ""
        tool_calls = [
            {
                "name": rng.choice(TOOL_NAMES),
                "args": {"query": words.text(rng.randint(1, 6)), "limit": rng.randint(1, 20)},
                "id": f"call_{uuid.UUID(int=rng.getrandbits(128)).hex[:24]}",
                "type": "tool_call",
            }
            for _ in range(1 if rng.random() < 0.8 else 2)
        ]
        tokens = _tokens(json.dumps([{"name": c["name"], "args": c["args"]} for c in tool_calls]))
    completion = len(tokens) + 1  # and the end-of-turn token
    output = AIMessage(
        content=content,
        tool_calls=tool_calls,
        response_metadata={
            "finish_reason": "stop" if last else "tool_calls",
            "model_name": MODEL,
            "logprobs": {"content": _logprobs(words, tokens), "refusal": None},
        },
        usage_metadata={
            "input_tokens": prompt,
            "output_tokens": completion,
            "total_tokens": prompt + completion,
        },
    )
    latency = round(0.05 + completion * rng.uniform(0.008, 0.03), 6)
    return _Call(output, None, prompt, completion, latency)


def _failure(rng: random.Random, prompt: int) -> _Call:
    kind = rng.choice(
        [
            ("RateLimitError", "Error code: 429 - rate limit reached for requests"),
            ("APITimeoutError", "Request timed out."),
        ]
    )
    return _Call(None, kind, prompt, 0, round(rng.uniform(0.5, 30.0), 6))


def _tool_result(words: Words, scenario: Scenario, call: dict[str, Any]) -> ToolMessage:
    rng = words.rng
    if rng.random() < SHARED_TOOL_OUTPUTS:
        text = rng.choice(scenario.documents)
    else:
        text = words.text_of_bytes(_tool_output_size(rng))
    return ToolMessage(text, tool_call_id=call["id"], name=call["name"])


class _Blobs:
    """The blobs of one append: each message's text once, by hash."""

    def __init__(self) -> None:
        self.texts: dict[str, str] = {}
        self.hashes: dict[int, str] = {}  # id(message) -> hash (messages live in `history`)

    def of(self, message: BaseMessage) -> str:
        found = self.hashes.get(id(message))
        if found is None:
            text = lc.dump_message(message)
            found = blob_hash(text)
            self.texts[found] = text
            self.hashes[id(message)] = found
        return found


@dataclass
class _Attempt:
    rollout_id: str
    group_id: str
    step: int
    scenario: Scenario
    started: datetime
    tools: str


def _conversation(words: Words, attempt: _Attempt, fails: bool) -> Append:
    """The events of one rollout attempt: started, its calls, finished or failed."""
    rng = words.rng
    blobs = _Blobs()
    events: list[Event] = [_started(attempt)]
    history: list[BaseMessage] = [SYSTEM, HumanMessage(attempt.scenario.question)]
    calls = min(MAX_CALLS, 2 + int(rng.expovariate(1 / MEAN_EXTRA_CALLS)))
    stop_at = rng.randrange(1, calls) if fails else None
    at, turn, index, prompt = 0.0, 0, 0, 180
    totals = {"num_llm_calls": 0, "prompt_tokens": 0, "completion_tokens": 0}
    latency_total = 0.0
    while turn < calls and turn != stop_at:
        prompt += rng.randint(20, 60)
        failed = rng.random() < CALL_FAILURE_RATE
        call = (
            _failure(rng, prompt)
            if failed
            else _answer(words, attempt.scenario, turn == calls - 1, prompt)
        )
        events.append(_llm_call(rng, attempt, blobs, history, call, index, at))
        at += call.latency_s + 0.05
        index += 1
        totals["num_llm_calls"] += 1
        totals["prompt_tokens"] += call.prompt_tokens
        totals["completion_tokens"] += call.completion_tokens
        latency_total += call.latency_s
        if call.output is None:
            continue  # retried at once with the same input
        turn += 1
        prompt += call.completion_tokens
        history.append(call.output)
        for requested in call.output.tool_calls:
            result = _tool_result(words, attempt.scenario, requested)
            prompt += len(result.content) // 5
            history.append(result)
    if stop_at is not None:
        events.append(_failed(rng, attempt, at))
    else:
        metrics = {**totals, "llm_latency_s": latency_total}
        events.append(_finished(attempt, history[-1], at, metrics))
    return Append(f"rollout-{attempt.rollout_id}", events, blobs.texts)


def _started(attempt: _Attempt) -> RolloutStarted:
    return RolloutStarted(
        rollout_id=attempt.rollout_id,
        run=RUN,
        group_id=attempt.group_id,
        scenario={"question": attempt.scenario.question, "answer": attempt.scenario.answer},
        scenario_index=attempt.scenario.index,
        model=MODEL,
        policy_step=attempt.step,
        started_at=attempt.started,
    )


def _llm_call(
    rng: random.Random,
    attempt: _Attempt,
    blobs: _Blobs,
    history: list[BaseMessage],
    call: _Call,
    index: int,
    at: float,
) -> LLMCall:
    output = call.output
    return LLMCall(
        call_id=str(uuid.UUID(int=rng.getrandbits(128))),
        index=index,
        input=[blobs.of(m) for m in history],
        output=None if output is None else blobs.of(output),
        tools=attempt.tools,
        model=MODEL,
        prompt_tokens=call.prompt_tokens,
        completion_tokens=None if output is None else call.completion_tokens,
        latency_s=call.latency_s,
        finish_reason=None if output is None else output.response_metadata["finish_reason"],
        tool_calls=[] if output is None else lc.tool_calls_of(output),
        num_logprobs=0 if output is None else lc.count_logprobs(output),
        error_type=None if call.error is None else call.error[0],
        error_message=None if call.error is None else call.error[1],
        started_at=attempt.started + timedelta(seconds=at),
    )


def _failed(rng: random.Random, attempt: _Attempt, at: float) -> RolloutFailed:
    tool = rng.choice(TOOL_NAMES)
    return RolloutFailed(
        rollout_id=attempt.rollout_id,
        error_type="ToolError",
        error_message=f"{tool} failed: upstream returned 502",
        traceback=(
            "Traceback (most recent call last):\n"
            '  File "agent.py", line 88, in run_tool\n'
            f"    return await TOOLS[{tool!r}](**args)\n"
            f"ToolError: {tool} failed: upstream returned 502\n"
        ),
        duration_s=at,
    )


def _finished(
    attempt: _Attempt, last: BaseMessage, at: float, metrics: dict[str, Any]
) -> RolloutFinished:
    return RolloutFinished(
        rollout_id=attempt.rollout_id,
        result={"answer": last.content},
        duration_s=at,
        metrics=metrics,
    )


class Corpus:
    """A run of `rollouts` policy rollouts, generated step by step from `seed`.

    `groups`: groups per train step (25, as bench_queries.py; tests take fewer).
    """

    def __init__(self, rollouts: int, seed: int = 29, groups: int = GROUPS_PER_STEP) -> None:
        per_step = groups * GROUP_SIZE
        if groups <= 0 or rollouts <= 0 or rollouts % per_step:
            raise ValueError(f"rollouts must be a positive multiple of {per_step}")
        self.rollouts = rollouts
        self.seed = seed
        self.groups = groups

    @property
    def num_steps(self) -> int:
        return self.rollouts // (self.groups * GROUP_SIZE)

    def steps(self) -> Iterator[list[Append]]:
        """Each step's appends in order; the first holds `run.started`, the last `run.finished`."""
        words = Words(random.Random(self.seed))
        scenarios = [_scenario(words, index) for index in range(self.groups)]
        tools_text = canonical_json(_tools())
        tools = blob_hash(tools_text)
        for step in range(self.num_steps):
            appends = [self._run_started(scenarios, tools, tools_text)] if step == 0 else []
            appends += self._step(words, step, scenarios, tools)
            if step == self.num_steps - 1:
                appends.append(Append(f"run-{RUN}", [RunFinished(run=RUN)]))
            yield appends

    def appends(self) -> Iterator[Append]:
        for step in self.steps():
            yield from step

    def _run_started(self, scenarios: list[Scenario], tools: str, tools_text: str) -> Append:
        started = RunStarted(
            run=RUN,
            project=PROJECT,
            model=MODEL,
            base_model="Qwen/Qwen2.5-7B-Instruct",
            config={"groups_per_step": self.groups, "group_size": GROUP_SIZE},
            scenarios=[{"question": s.question, "answer": s.answer} for s in scenarios],
            scorer=SCORER,
            trainer="corpus-host:1",
        )
        return Append(f"run-{RUN}", [started], {tools: tools_text})

    def _step(self, words: Words, step: int, scenarios: list[Scenario], tools: str) -> list[Append]:
        rng = words.rng
        appends: list[Append] = []
        group_ids = []
        for scenario in scenarios:
            group_id = group_id_for(RUN, step, scenario.index)
            group_ids.append(group_id)
            finished: list[str] = []
            failed: list[str] = []
            while len(finished) < GROUP_SIZE:
                attempt = _Attempt(
                    rollout_id=str(uuid.UUID(int=rng.getrandbits(128))),
                    group_id=group_id,
                    step=step,
                    scenario=scenario,
                    started=BASE
                    + timedelta(seconds=step * 3600 + scenario.index * 60 + len(failed + finished)),
                    tools=tools,
                )
                # No more failed attempts than finished ones: a group always fills.
                fails = not failed[len(finished) :] and rng.random() < ROLLOUT_FAILURE_RATE
                appends.append(_conversation(words, attempt, fails))
                (failed if fails else finished).append(attempt.rollout_id)
            appends.append(_group(rng, step, scenario, group_id, finished, failed, self.num_steps))
        train = dict(run=RUN, model=MODEL, group_ids=group_ids, scorer=SCORER)
        appends.append(
            Append(
                f"train-{RUN}",
                [
                    TrainStepStarted(step=step, trainer="corpus-host:1", **train),
                    TrainStepCompleted(
                        step=step + 1,
                        metrics={"loss": rng.uniform(0.1, 1.0), "grad_norm": rng.uniform(0.5, 3.0)},
                        duration_s=rng.uniform(20, 40),
                        **train,
                    ),
                ],
            )
        )
        return appends


def _group(
    rng: random.Random,
    step: int,
    scenario: Scenario,
    group_id: str,
    finished: list[str],
    failed: list[str],
    steps: int,
) -> Append:
    """The group's rewards (improving with the steps) and its seal."""
    centre = 0.2 + 0.6 * step / max(steps - 1, 1)
    rewards = {rid: min(1.0, max(0.0, rng.gauss(centre, 0.25))) for rid in finished}
    return Append(
        f"group-{group_id}",
        [
            RewardsRecorded(group_id=group_id, scorer=SCORER, rewards=rewards),
            GroupSealed(
                group_id=group_id,
                run=RUN,
                epoch=step,
                batch=step,
                scenario_index=scenario.index,
                rollout_ids=finished,
                failed_rollout_ids=failed,
            ),
        ],
    )


def fingerprint(appends: Iterator[Append]) -> tuple[str, dict[str, int]]:
    """A SHA-256 of every append's stream, events (JSON) and blobs, and the corpus's counts."""
    digest = hashlib.sha256()
    counts = {"appends": 0, "events": 0, "llm_calls": 0, "blobs": 0, "blob_bytes": 0}
    for append in appends:
        counts["appends"] += 1
        digest.update(append.stream.encode())
        for event in append.events:
            counts["events"] += 1
            counts["llm_calls"] += event.type == "llm.call"
            digest.update(event.type.encode())
            digest.update(event.model_dump_json().encode())
        for key, text in sorted(append.blobs.items()):
            counts["blobs"] += 1
            counts["blob_bytes"] += len(text.encode())
            digest.update(key.encode())
            digest.update(text.encode())
    return digest.hexdigest(), counts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rollouts", type=int, default=ROLLOUTS_PER_STEP)
    parser.add_argument("--seed", type=int, default=29)
    args = parser.parse_args(argv)
    digest, counts = fingerprint(Corpus(args.rollouts, args.seed).appends())
    print(f"{args.rollouts:,} rollouts, seed {args.seed}: {counts}")
    print(f"fingerprint {digest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
