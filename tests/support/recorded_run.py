"""A small recorded run, appended as the real events, for tests that read what a run leaves.

`record_run(store)` writes one training run of two steps through `store.append`, the way
the capture and training layers do, with every number chosen so that the expected
values of the views and queries can be worked out by hand (the tests do so in comments):

step 0 (policy step 0), groups g0 and g1, scorer "correct":
  g0  r0a  policy      3 LLM calls: search -> (1.0 s) -> search + calculator -> (2.25 s) -> answer
      r0b  policy      1 LLM call requesting calculator, then the rollout ends; started in +02:00
      r0v  validation  1 LLM call, no logprobs
  g1  r1a  policy      1 LLM call
      r1b  policy      failed after 1 LLM call requesting search
  rewards "correct": r0a 1.0, r0b 0.0, r0v 0.5, r1a 0.5; "judge": r0a 0.8, r0b 0.4, r0v 0.6, r1a 0.3
  train step 0 -> 1 on g0 and g1 (completed, checkpoint pushed)
  then g0 is re-scored by "correct": r0a 1.0, r0b 0.25, r0v 0.5 (rescored)
step 1 (policy step 1), group g2: r2a, r2b rewarded 1.0 and 1.0 (no spread); the train step
  fails and the run finishes as failed.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage, ToolMessage

from artstore.documents import messages as lc
from artstore.events import (
    CheckpointPushed,
    GroupSealed,
    LLMCall,
    RewardsRecorded,
    RolloutFailed,
    RolloutFinished,
    RolloutStarted,
    RunFinished,
    RunStarted,
    TrainStepCompleted,
    TrainStepFailed,
    TrainStepStarted,
)
from artstore.eventstore import blob_hash
from artstore.eventstore.blobs import canonical_json

RUN = "arith-001"
PROJECT = "arith"
MODEL = "arith/agent-001"
BASE_MODEL = "Qwen/Qwen2.5-0.5B-Instruct"
VALIDATION_MODEL = "gpt-4o-mini"
BASE = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)
PLUS_TWO = timezone(timedelta(hours=2))

SYSTEM = SystemMessage("You answer arithmetic questions. Use the tools.")
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": f"the {name} tool",
            "parameters": {"type": "object", "properties": {arg: {"type": "string"}}},
        },
    }
    for name, arg in (("search", "q"), ("calculator", "expr"))
]


@dataclass(frozen=True)
class Call:
    """One LLM call of a rollout, as the test wants it recorded."""

    call_id: str
    at_s: float  # seconds after BASE
    latency_s: float
    prompt_tokens: int
    completion_tokens: int
    tools: tuple[tuple[str, dict[str, Any]], ...] = ()  # (name, args) requested
    content: str = ""
    logprobs: bool = True
    zone: timezone = UTC


@dataclass(frozen=True)
class Rollout:
    rollout_id: str
    group_id: str
    scenario_index: int
    policy_step: int | None
    calls: tuple[Call, ...]
    duration_s: float
    role: str = "policy"
    failed: bool = False
    zone: timezone = UTC


SCENARIOS = [
    {"question": "What is 2+2?", "answer": "4"},
    {"question": "What is 3*3?", "answer": "9"},
    {"question": "What is 10-7?", "answer": "3"},
]

ROLLOUTS = (
    Rollout(
        "r0a",
        "g0",
        0,
        0,
        (
            Call("c0a0", 0.0, 0.5, 100, 20, (("search", {"q": "2+2"}),)),
            Call(
                "c0a1",
                1.5,
                0.25,
                150,
                30,
                (("search", {"q": "sum of 2 and 2"}), ("calculator", {"expr": "2+2"})),
            ),
            Call("c0a2", 4.0, 0.5, 200, 10, content="4"),
        ),
        duration_s=4.5,
    ),
    Rollout(
        "r0b",
        "g0",
        0,
        0,
        (Call("c0b0", 0.125, 1.0, 100, 40, (("calculator", {"expr": "2*2"}),), zone=PLUS_TWO),),
        duration_s=2.0,
        zone=PLUS_TWO,
    ),
    Rollout(
        "r0v",
        "g0",
        0,
        None,
        (Call("c0v0", 0.25, 0.75, 90, 5, content="4", logprobs=False),),
        duration_s=1.0,
        role="validation",
    ),
    Rollout("r1a", "g1", 1, 0, (Call("c1a0", 10.0, 2.0, 120, 60, content="9"),), duration_s=3.0),
    Rollout(
        "r1b",
        "g1",
        1,
        0,
        (Call("c1b0", 10.5, 0.3, 110, 15, (("search", {"q": "3*3"}),)),),
        duration_s=0.5,
        failed=True,
    ),
    Rollout("r2a", "g2", 2, 1, (Call("c2a0", 60.0, 0.5, 80, 8, content="3"),), duration_s=1.0),
    Rollout("r2b", "g2", 2, 1, (Call("c2b0", 61.0, 0.5, 80, 12, content="3"),), duration_s=1.5),
)


def _ai_message(call: Call, model: str) -> AIMessage:
    tool_calls = [
        {"name": name, "args": args, "id": f"{call.call_id}-{n}", "type": "tool_call"}
        for n, (name, args) in enumerate(call.tools)
    ]
    metadata: dict[str, Any] = {
        "finish_reason": "tool_calls" if call.tools else "stop",
        "model_name": model,
    }
    if call.logprobs:
        metadata["logprobs"] = {
            "content": [
                {
                    "token": token,
                    "logprob": -0.25,
                    "bytes": list(token.encode()),
                    "top_logprobs": [],
                }
                for token in (call.content or "call").split()
            ]
        }
    return AIMessage(
        content=call.content,
        tool_calls=tool_calls,
        response_metadata=metadata,
        usage_metadata={
            "input_tokens": call.prompt_tokens,
            "output_tokens": call.completion_tokens,
            "total_tokens": call.prompt_tokens + call.completion_tokens,
        },
    )


def _blob(body: str, blobs: dict[str, str]) -> str:
    digest = blob_hash(body)
    blobs[digest] = body
    return digest


async def _record_rollout(store, rollout: Rollout) -> None:
    """The events the capture layer writes for one rollout, with the times chosen here."""
    started = (BASE + timedelta(seconds=rollout.calls[0].at_s)).astimezone(rollout.zone)
    model = MODEL if rollout.role == "policy" else VALIDATION_MODEL
    events: list = [
        RolloutStarted(
            rollout_id=rollout.rollout_id,
            run=RUN,
            group_id=rollout.group_id,
            scenario=SCENARIOS[rollout.scenario_index],
            scenario_index=rollout.scenario_index,
            model=model,
            role=rollout.role,
            policy_step=rollout.policy_step,
            started_at=started,
        )
    ]
    blobs: dict[str, str] = {}
    tools = _blob(canonical_json(TOOLS), blobs)
    question = SCENARIOS[rollout.scenario_index]["question"]
    history: list[BaseMessage] = [SYSTEM, HumanMessage(question)]
    for index, call in enumerate(rollout.calls):
        output = _ai_message(call, model)
        prompt_tokens, completion_tokens = lc.token_usage(output)
        events.append(
            LLMCall(
                call_id=call.call_id,
                index=index,
                input=[_blob(lc.dump_message(m), blobs) for m in history],
                output=_blob(lc.dump_message(output), blobs),
                tools=tools,
                model=output.response_metadata["model_name"],
                prompt_tokens=prompt_tokens,
                completion_tokens=completion_tokens,
                latency_s=call.latency_s,
                finish_reason=output.response_metadata["finish_reason"],
                tool_calls=lc.tool_calls_of(output),
                num_logprobs=lc.count_logprobs(output),
                started_at=(BASE + timedelta(seconds=call.at_s)).astimezone(call.zone),
            )
        )
        history.append(output)
        history.extend(
            ToolMessage(f"result of {tool_call['name']}", tool_call_id=tool_call["id"])
            for tool_call in output.tool_calls
        )
    if rollout.failed:
        events.append(
            RolloutFailed(
                rollout_id=rollout.rollout_id,
                error_type="ToolError",
                error_message="the search tool timed out",
                traceback="Traceback (most recent call last): ...",
                duration_s=rollout.duration_s,
            )
        )
    else:
        events.append(
            RolloutFinished(
                rollout_id=rollout.rollout_id,
                result={"answer": rollout.calls[-1].content},
                duration_s=rollout.duration_s,
            )
        )
    await store.append(f"rollout-{rollout.rollout_id}", events, blobs=blobs)


def _rollouts(group_id: str, role: str = "policy", failed: bool | None = None) -> list[str]:
    return [
        r.rollout_id
        for r in ROLLOUTS
        if r.group_id == group_id and r.role == role and (failed is None or r.failed == failed)
    ]


def _sealed(group_id: str, batch: int) -> GroupSealed:
    (scenario_index,) = {r.scenario_index for r in ROLLOUTS if r.group_id == group_id}
    return GroupSealed(
        group_id=group_id,
        run=RUN,
        epoch=0,
        batch=batch,
        scenario_index=scenario_index,
        rollout_ids=_rollouts(group_id),
        validation_rollout_ids=_rollouts(group_id, "validation"),
        failed_rollout_ids=_rollouts(group_id, failed=True),
    )


async def record_run(store) -> None:
    """Append the run described in the module's docstring to `store`."""
    await store.append(
        f"run-{RUN}",
        [
            RunStarted(
                run=RUN,
                project=PROJECT,
                model=MODEL,
                base_model=BASE_MODEL,
                config={"group_size": 2, "batch_size": 2, "learning_rate": 1e-5},
                scenarios=SCENARIOS,
                validation_model=VALIDATION_MODEL,
                scorer="correct",
                trainer="trainer-host:4242",
            )
        ],
    )
    for rollout in ROLLOUTS:
        if rollout.group_id != "g2":
            await _record_rollout(store, rollout)
    for group_id, correct, judge in (
        ("g0", {"r0a": 1.0, "r0b": 0.0, "r0v": 0.5}, {"r0a": 0.8, "r0b": 0.4, "r0v": 0.6}),
        ("g1", {"r1a": 0.5}, {"r1a": 0.3}),
    ):
        await store.append(
            f"group-{group_id}",
            [
                RewardsRecorded(group_id=group_id, scorer="correct", rewards=correct),
                RewardsRecorded(
                    group_id=group_id,
                    scorer="judge",
                    rewards=judge,
                    metrics={rollout_id: {"confidence": 0.9} for rollout_id in judge},
                ),
                _sealed(group_id, batch=0),
            ],
        )
    trainer = "trainer-host:4242"
    await store.append(
        f"train-{RUN}",
        [
            TrainStepStarted(
                run=RUN,
                model=MODEL,
                step=0,
                group_ids=["g0", "g1"],
                scorer="correct",
                trainer=trainer,
            )
        ],
    )
    await store.append(
        f"train-{RUN}",
        [
            TrainStepCompleted(
                run=RUN,
                model=MODEL,
                step=1,
                group_ids=["g0", "g1"],
                scorer="correct",
                metrics={"loss": 0.25, "reward_mean": 0.5, "num_groups_trainable": 1.0},
                duration_s=12.5,
                checkpoint=".art/arith/models/agent-001/checkpoints/0001",
            ),
            CheckpointPushed(
                run=RUN, model=MODEL, step=1, destination="s3://bucket/agent-001/0001"
            ),
        ],
    )
    # A better reward function arrives: g0 is re-scored by "correct" (appended, not replaced).
    await store.append(
        "group-g0",
        [
            RewardsRecorded(
                group_id="g0",
                scorer="correct",
                rewards={"r0a": 1.0, "r0b": 0.25, "r0v": 0.5},
                rescored=True,
            )
        ],
    )
    for rollout in ROLLOUTS:
        if rollout.group_id == "g2":
            await _record_rollout(store, rollout)
    await store.append(
        "group-g2",
        [
            RewardsRecorded(group_id="g2", scorer="correct", rewards={"r2a": 1.0, "r2b": 1.0}),
            _sealed("g2", batch=1),
        ],
    )
    await store.append(
        f"train-{RUN}",
        [
            TrainStepStarted(
                run=RUN, model=MODEL, step=1, group_ids=["g2"], scorer="correct", trainer=trainer
            ),
            TrainStepFailed(
                run=RUN,
                model=MODEL,
                step=1,
                group_ids=["g2"],
                error_type="RuntimeError",
                error_message="CUDA out of memory",
            ),
        ],
    )
    await store.append(
        f"run-{RUN}",
        [RunFinished(run=RUN, status="failed", error="RuntimeError: CUDA out of memory")],
    )
