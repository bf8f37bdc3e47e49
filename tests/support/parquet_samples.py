"""Trajectory groups for the parquet tests, and the sample files ART wrote from them.

ART writes format 1 (0.5.18) or format 2 (>= 0.5.20) depending on the installed version, and
each venv has one ART: the tests write the installed ART's format themselves, and read the
other one from `tests/data/`, written by the other ART from these same groups with
`tests/data/make_parquet_samples.py`. A test checks on each ART that the committed sample of
its own format is what its writer makes of these groups.

`sample_groups()` has what format 2 keeps and format 1 drops: Choice objects with logprobs
(one with tool calls), tools, an additional history with its own tools, policy versions, a
reward of 0.0 (left out of format 2's JSON as a default), non-ASCII text, a group exception,
group metadata, metrics and logs. `exchanges_groups()` (ART >= 0.5.20 only) holds
trajectories captured as raw exchanges.
"""

from __future__ import annotations

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import art
from openai.types.chat import ChatCompletionMessage, ChatCompletionTokenLogprob
from openai.types.chat.chat_completion import Choice, ChoiceLogprobs
from openai.types.chat.chat_completion_message_tool_call import (
    ChatCompletionMessageToolCall,
    Function,
)

from artstore.art_versions import history_class

DATA = Path(__file__).parents[1] / "data"
#: Written by ART 0.5.18 (format 1) and ART 0.5.23 (format 2) from `sample_groups()`.
SAMPLES = {1: DATA / "art-0.5.18-format-1.parquet", 2: DATA / "art-0.5.23-format-2.parquet"}
#: Written by ART 0.5.23 from `exchanges_groups()`.
EXCHANGES_SAMPLE = DATA / "art-0.5.23-format-2-exchanges.parquet"

SEARCH = [{"type": "function", "function": {"name": "search", "parameters": {"type": "object"}}}]
SUMMARIZE = [{"type": "function", "function": {"name": "summarize", "description": "sum up"}}]


def choice(content: str | None, *tokens: float, calls: list[tuple[str, str]] = ()) -> Choice:
    """An assistant Choice whose tokens carry the given logprobs."""
    tool_calls = [
        ChatCompletionMessageToolCall(
            id=f"call-{i}", type="function", function=Function(name=name, arguments=arguments)
        )
        for i, (name, arguments) in enumerate(calls)
    ]
    return Choice(
        index=0,
        finish_reason="tool_calls" if calls else "stop",
        message=ChatCompletionMessage(
            role="assistant", content=content, tool_calls=tool_calls or None
        ),
        logprobs=ChoiceLogprobs(
            content=[
                ChatCompletionTokenLogprob(
                    token=f"t{i}", logprob=logprob, bytes=list(f"t{i}".encode()), top_logprobs=[]
                )
                for i, logprob in enumerate(tokens)
            ]
        ),
    )


def sample_groups() -> list[art.TrajectoryGroup]:
    """Two groups of two trajectories (see the module's docstring)."""
    history = history_class()
    system = {"role": "system", "content": "Answer with a number."}
    searched = art.Trajectory(
        messages_and_choices=[
            system,
            {"role": "user", "content": "What is 2 + 2?"},
            choice(None, -0.5, calls=[("search", '{"q": "2 + 2"}')]),
            {"role": "tool", "content": "4", "tool_call_id": "call-0"},
            choice("The answer is 4.", -0.25, -0.125, -1.5),
        ],
        tools=SEARCH,
        additional_histories=[
            history(
                messages_and_choices=[
                    {"role": "user", "content": "Summarize: the answer is 4."},
                    choice("4.", -0.0625),
                ],
                tools=SUMMARIZE,
            )
        ],
        reward=1.0,
        initial_policy_version=3,
        final_policy_version=4,
        metrics={"turns": 2, "correct": True},
        metadata={"scenario": "s0", "seed": 7},
        logs=["searched once"],
    )
    guessed = art.Trajectory(
        messages_and_choices=[
            system,
            {"role": "user", "content": "What is 2 + 2?"},
            choice("5", -2.0),
        ],
        tools=SEARCH,
        reward=0.0,
        initial_policy_version=3,
        final_policy_version=3,
        metrics={"turns": 1, "correct": False},
        metadata={"scenario": "s0", "seed": 8},
    )
    floats = [
        art.Trajectory(
            messages_and_choices=[
                {"role": "user", "content": f"Ünïcode ✓ question {i}: 0.1 + 0.2?"},
                choice(answer, -0.1, -0.2),
            ],
            reward=reward,
            metrics={"error": 5.551115123125783e-17 * i},
            metadata={"scenario": "s1"},
        )
        for i, (answer, reward) in enumerate(
            [("0.30000000000000004", 0.1), ("0.3", 0.7000000000000001)]
        )
    ]
    return [
        art.TrajectoryGroup(
            [searched, guessed],
            metadata={"scenario": "s0", "epoch": 1},
            metrics={"accuracy": 0.5},
            logs=["group 0"],
        ),
        art.TrajectoryGroup([*floats, ValueError("the tool broke")], metadata={"scenario": "s1"}),
    ]


def exchanges_groups() -> list[art.TrajectoryGroup]:
    """One group of two trajectories captured by ART as raw exchanges (ART >= 0.5.20)."""
    from art.trajectories import ChatCompletionsExchange, TrajectoryExchanges
    from openai.types.chat import ChatCompletion

    def exchange(question: str, answer: str, logprob: float) -> Any:
        response = ChatCompletion(
            id=f"chatcmpl-{answer}",
            object="chat.completion",
            created=1767225600,
            model="agent",
            choices=[choice(answer, logprob)],
            usage={"prompt_tokens": 12, "completion_tokens": 1, "total_tokens": 13},
        )
        return ChatCompletionsExchange(
            request={
                "model": "agent",
                "messages": [{"role": "user", "content": question}],
                "logprobs": True,
                "temperature": 1.0,
            },
            response=response,
            start_time=datetime(2026, 1, 1, 0, 0, 0, tzinfo=UTC),
            end_time=datetime(2026, 1, 1, 0, 0, 1, 250000, tzinfo=UTC),
        )

    return [
        art.TrajectoryGroup(
            [
                art.Trajectory(
                    exchanges=TrajectoryExchanges(
                        chat_completions=[exchange("What is 3 + 3?", answer, logprob)]
                    ),
                    reward=reward,
                    metrics={"correct": reward == 1.0},
                    metadata={"scenario": "s2"},
                )
                for answer, logprob, reward in (("6", -0.25, 1.0), ("7", -1.75, 0.0))
            ],
            metadata={"scenario": "s2"},
        )
    ]


def write_samples(out: Path) -> list[Path]:
    """Write the samples of the installed ART's format under `out` (ART's own writer)."""
    from art.utils.trajectory_logging import write_trajectory_groups_parquet

    from artstore.art_versions import has_exchanges, parquet_format_version

    written = [out / SAMPLES[parquet_format_version()].name]
    write_trajectory_groups_parquet(sample_groups(), written[0])
    if has_exchanges():
        written.append(out / EXCHANGES_SAMPLE.name)
        write_trajectory_groups_parquet(exchanges_groups(), written[1])
    return written
