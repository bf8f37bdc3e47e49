"""A run appended as the real events in a random interleaving, for tests of projections
and re-scoring that want many groups cheaply (no agent, no inference server).

`record_interleaved(store, seed)` appends a run of `groups` sealed groups of `size` policy
rollouts each, rewarded by "reward" (and re-scored by "judge" and "reward"), trained in
two steps: every stream in its order, the streams interleaved at random, in transactions
of random sizes (the writer's group commit takes what was queued together). Latencies and
rewards are floats whose sums depend on the order they are added in. Each rollout has 1
to 5 LLM calls, and sometimes a call recorded again that supersedes the first. Each
group has a scenario of its own, `{"question": "q<group number>"}`.
"""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from typing import Any

from langchain_core.messages import AIMessage, HumanMessage

from artstore.documents import messages as lc
from artstore.events import (
    GroupSealed,
    LangGraphCheckpoint,
    LangGraphThreadDeleted,
    LangGraphWrites,
    LLMCall,
    RewardsRecorded,
    RolloutFinished,
    RolloutStarted,
    RunStarted,
    TrainStepCompleted,
    TrainStepStarted,
)
from artstore.eventstore import blob_hash

RUN = "mixed"
MODEL = "tests/mixed"
BASE = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def _blob(message: Any, blobs: dict[str, str]) -> str:
    body = lc.dump_message(message)
    digest = blob_hash(body)
    blobs[digest] = body
    return digest


def _rollout_appends(
    rng: random.Random, rollout_id: str, group_id: str, scenario: int, index: int
) -> list[tuple[str, list, dict[str, str]]]:
    """The appends of one rollout, one per event as the recorder makes them: its start,
    1 to 5 calls with latencies whose sum depends on the order of the additions (one
    call recorded again, superseding the first), and its end."""
    stream = f"rollout-{rollout_id}"
    started = BASE + timedelta(seconds=index)
    appends: list[tuple[str, list, dict[str, str]]] = [
        (
            stream,
            [
                RolloutStarted(
                    rollout_id=rollout_id,
                    run=RUN,
                    group_id=group_id,
                    scenario={"question": f"q{scenario}"},
                    scenario_index=scenario,
                    model="mixed",
                    role="policy",
                    policy_step=0,
                    started_at=started,
                )
            ],
            {},
        )
    ]
    question = HumanMessage(f"question {index}")
    call_ids = [f"{rollout_id}-c{n}" for n in range(rng.randint(1, 5))]
    for n, call_id in enumerate(call_ids):
        blobs: dict[str, str] = {}
        output = AIMessage(f"answer {n} of {rollout_id}")
        supersedes = call_ids[0] if n == 1 and rng.random() < 0.5 else None
        call = LLMCall(
            call_id=call_id,
            index=0 if supersedes else n,
            input=[_blob(question, blobs)],
            output=_blob(output, blobs),
            model="mixed",
            prompt_tokens=rng.randint(1, 500),
            completion_tokens=rng.randint(1, 500),
            latency_s=rng.random() * rng.choice((0.001, 1.0, 1000.0)),
            finish_reason="stop",
            started_at=started + timedelta(seconds=n),
            supersedes=supersedes,
        )
        appends.append((stream, [call], blobs))
    appends.append(
        (stream, [RolloutFinished(rollout_id=rollout_id, result={"n": index}, duration_s=1.5)], {})
    )
    return appends


def _run(rng: random.Random, groups: int, size: int):
    """The run's appends: per stream in order, with what each must wait for."""
    streams: dict[str, list[tuple[str, list, dict[str, str]]]] = {}
    group_ids = [f"g{g}" for g in range(groups)]
    members = {g: [f"{g}r{n}" for n in range(size)] for g in group_ids}
    for number, (g, rollout_ids) in enumerate(members.items()):
        for n, rollout_id in enumerate(rollout_ids):
            streams[rollout_id] = _rollout_appends(rng, rollout_id, g, number, n)

    def rewards(g: str, scorer: str, rescored: bool = False) -> RewardsRecorded:
        return RewardsRecorded(
            group_id=g,
            scorer=scorer,
            rewards={r: rng.random() * rng.choice((0.1, 1.0, 3.0)) for r in members[g]},
            rescored=rescored,
        )

    for number, g in enumerate(group_ids):
        sealed = GroupSealed(
            group_id=g, run=RUN, epoch=0, batch=0, scenario_index=number, rollout_ids=members[g]
        )
        streams[f"group-{g}"] = [
            (f"group-{g}", [rewards(g, "reward"), sealed], {}),
            (f"group-{g}", [rewards(g, "judge", rescored=True)], {}),
            (f"group-{g}", [rewards(g, "reward", rescored=True)], {}),
        ]
    steps = []
    half = len(group_ids) // 2
    for step, chunk in enumerate((group_ids[:half], group_ids[half:])):
        started = TrainStepStarted(
            run=RUN, model=MODEL, step=step, group_ids=chunk, scorer="reward", trainer="t"
        )
        completed = TrainStepCompleted(
            run=RUN, model=MODEL, step=step + 1, group_ids=chunk, scorer="reward"
        )
        steps += [(f"train-{RUN}", [started], {}), (f"train-{RUN}", [completed], {})]
    streams[f"train-{RUN}"] = steps
    return streams, members


def _thread_appends(thread_id: str, deleted: bool) -> list[tuple[str, list, dict[str, str]]]:
    """A LangGraph thread's checkpoints and writes (`artstore.langgraph.checkpointer`): a
    regular write sent twice (the first one stays), an error write replaced, a channel
    written again at a version it had; `deleted`: deleted, then used again."""
    stream = f"langgraph-{thread_id}"

    def checkpoint(n: int, versions: dict[str, int]) -> LangGraphCheckpoint:
        return LangGraphCheckpoint(
            thread_id=thread_id,
            checkpoint_id=f"c{n}",
            parent_checkpoint_id=f"c{n - 1}" if n else None,
            checkpoint={"json": {"id": f"c{n}", "channel_versions": versions}},
            metadata={"json": {"step": n}},
            versions=versions,
            values={channel: ["msgpack", f"v{n}"] for channel in versions},
        )

    def writes(n: int, task: str, index: int, value: str) -> LangGraphWrites:
        return LangGraphWrites(
            thread_id=thread_id,
            checkpoint_id=f"c{n}",
            task_id=task,
            writes=[[index, "messages", ["msgpack", value]]],
        )

    appends = [
        [checkpoint(0, {"messages": 1})],
        [writes(0, "a", 0, "first"), writes(0, "a", -1, "error")],
        [writes(0, "a", 0, "second"), writes(0, "a", -1, "error again")],
        [checkpoint(1, {"messages": 2, "tools": 1})],
        [checkpoint(1, {"messages": 2})],
    ]
    if deleted:
        appends += [[LangGraphThreadDeleted(thread_id=thread_id)], [checkpoint(0, {"x": 1})]]
    return [(stream, events, {}) for events in appends]


def _interleaved(rng: random.Random, streams: dict, members: dict) -> list:
    """The appends in a random order that keeps each stream's order; a group's seal
    comes after its rollouts ended, a train step after its groups' first rewards."""
    pending = {stream: list(appends) for stream, appends in streams.items()}
    done: dict[str, int] = {stream: 0 for stream in streams}

    def ready(stream: str) -> bool:
        if stream.startswith("group-") and done[stream] == 0:
            group = stream.removeprefix("group-")
            return all(not pending[r] for r in members[group])
        if stream.startswith("train-"):
            return all(done[f"group-{g}"] >= 1 for g in members)
        return True

    order = []
    while any(pending.values()):
        stream = rng.choice([s for s, appends in pending.items() if appends and ready(s)])
        order.append(pending[stream].pop(0))
        done[stream] += 1
    return order


async def record_interleaved(
    store: Any, seed: int, *, groups: int = 6, size: int = 4, checkpoints: bool = False
) -> list[str]:
    """Append the run in a random interleaving, in transactions of random sizes; returns
    its group ids in the run's order. `checkpoints`: two LangGraph threads' checkpoints
    too, interleaved with the run."""
    rng = random.Random(seed)
    streams, members = _run(rng, groups, size)
    if checkpoints:
        for thread_id, deleted in (("kept", False), ("deleted", True)):
            streams[f"langgraph-{thread_id}"] = _thread_appends(thread_id, deleted)
    await store.append(
        f"run-{RUN}",
        [
            RunStarted(
                run=RUN,
                project="tests",
                model="mixed",
                base_model="base",
                config={"group_size": size},
                scenarios=[{"question": f"q{n}"} for n in range(groups)],
                scorer="reward",
                trainer="t",
            )
        ],
    )
    order = _interleaved(rng, streams, members)
    while order:
        taken = order[: rng.randint(1, 25)]
        order = order[len(taken) :]
        futures = [store.append_nowait(s, events, blobs=blobs) for s, events, blobs in taken]
        for future in futures:
            await future
    return list(members)
