"""A run whose memory is its rollouts' own: each carries one large tool output of its own.

`record_heavy_run(store, groups)` appends a trained run of `groups` groups of GROUP_SIZE
policy rollouts, each of two LLM calls (a search, then the answer after a tool result of
`TOOL_OUTPUT_CHARS` characters no other rollout shares), rewarded with a spread in every
group (so DPO pairs and KTO labels exist), sealed, and trained one group per train step
(so the parquet export writes a file per group), and freezes every rollout as the dataset
`DATASET`. An export that holds the whole run holds every tool output: at 64 rollouts of
512 KiB, tens of MiB more than one holding a group at a time.
"""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage

from artstore.datasets import Selection, create_dataset
from artstore.documents import messages as lc
from artstore.events import (
    GroupSealed,
    LLMCall,
    RewardsRecorded,
    RolloutFinished,
    RolloutStarted,
    RunStarted,
    TrainStepCompleted,
    TrainStepStarted,
)
from artstore.eventstore import blob_hash

RUN = "heavy"
MODEL = "tests/heavy"
SCORER = "correct"
DATASET = "heavy-set"
GROUP_SIZE = 4
TOOL_OUTPUT_CHARS = 1024 * 1024
BASE = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def _blob(message: object, blobs: dict[str, str]) -> str:
    body = lc.dump_message(message)
    blobs[blob_hash(body)] = body
    return blob_hash(body)


def _rollout_events(rng: random.Random, rollout_id: str, group: int) -> tuple[list, dict]:
    blobs: dict[str, str] = {}
    started = BASE + timedelta(minutes=group)
    question = [SystemMessage("Answer with the tools."), HumanMessage(f"question {group}")]
    search = AIMessage(
        "",
        tool_calls=[{"name": "search", "args": {"q": "x"}, "id": f"call-{rollout_id}"}],
        response_metadata={"finish_reason": "tool_calls"},
    )
    result = ToolMessage(
        rng.randbytes(TOOL_OUTPUT_CHARS // 2).hex(), tool_call_id=f"call-{rollout_id}"
    )
    answer = AIMessage(f"answer of {rollout_id}", response_metadata={"finish_reason": "stop"})
    calls = [([*question], search, "tool_calls"), ([*question, search, result], answer, "stop")]
    events: list = [
        RolloutStarted(
            rollout_id=rollout_id,
            run=RUN,
            group_id=f"g{group}",
            scenario={"question": f"question {group}"},
            scenario_index=group,
            model=MODEL,
            policy_step=group,
            started_at=started,
        )
    ]
    for index, (inputs, output, finish) in enumerate(calls):
        events.append(
            LLMCall(
                call_id=f"{rollout_id}-c{index}",
                index=index,
                input=[_blob(m, blobs) for m in inputs],
                output=_blob(output, blobs),
                model=MODEL,
                prompt_tokens=100,
                completion_tokens=10,
                latency_s=0.5,
                finish_reason=finish,
                started_at=started + timedelta(seconds=index),
            )
        )
    events.append(RolloutFinished(rollout_id=rollout_id, result={"answer": "x"}, duration_s=2.0))
    return events, blobs


async def record_heavy_run(store, groups: int, seed: int = 7) -> None:
    """Append the run of `groups` groups (see the module's docstring) and its dataset."""
    rng = random.Random(seed)
    started = RunStarted(
        run=RUN,
        project="tests",
        model=MODEL,
        config={},
        scenarios=[{"question": f"question {g}"} for g in range(groups)],
        scorer=SCORER,
        trainer="test:1",
    )
    await store.append(f"run-{RUN}", [started])
    for group in range(groups):
        ids = [f"g{group}r{n}" for n in range(GROUP_SIZE)]
        for rollout_id in ids:
            events, blobs = _rollout_events(rng, rollout_id, group)
            await store.append(f"rollout-{rollout_id}", events, blobs=blobs)
        rewards = {rid: n / GROUP_SIZE for n, rid in enumerate(ids)}  # a spread in each group
        sealed = GroupSealed(
            group_id=f"g{group}",
            run=RUN,
            epoch=0,
            batch=group,
            scenario_index=group,
            rollout_ids=ids,
        )
        await store.append(
            f"group-g{group}",
            [RewardsRecorded(group_id=f"g{group}", scorer=SCORER, rewards=rewards), sealed],
        )
        train = dict(run=RUN, model=MODEL, group_ids=[f"g{group}"], scorer=SCORER)
        await store.append(
            f"train-{RUN}",
            [
                TrainStepStarted(step=group, trainer="test:1", **train),
                TrainStepCompleted(step=group + 1, **train),
            ],
        )
    await create_dataset(store, DATASET, Selection(run=RUN))
