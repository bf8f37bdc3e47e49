"""Loops of your own on the store: ART's objects in and out, the recording backend, runs.

Real parts on both databases: trajectories built from real OpenAI-client calls to the
local inference server (Choice objects with logprobs), real `art` groups, the recording
backend around CheckOnlyBackend, and the command line on the recorded run.
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import art
import pytest
from openai import AsyncOpenAI
from sqlalchemy import func, select, text
from trained_run import cli
from training_helpers import LOOKUP_TOOL, assert_consistent, rows

import artstore
from artstore.art_versions import has_exchanges, history_class, trainable_model
from artstore.backends import CheckOnlyBackend
from artstore.errors import ConfigurationError, GroupAlreadyConsumedError, InvalidEventError
from artstore.schema import tables as t
from artstore.testing.inference_server import LocalInferenceServer

RUN = "loops/mine"
TOOLS = [LOOKUP_TOOL]
SUMMARY_TOOLS = [{"type": "function", "function": {"name": "Answer", "parameters": {}}}]


@pytest.fixture(autouse=True)
def no_wandb(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.chdir(tmp_path)


@pytest.fixture
async def server():
    async with LocalInferenceServer() as running:
        yield running


async def model_on(server: LocalInferenceServer, store: Any, path: Path, name: str = "agent"):
    backend = artstore.recording_backend(
        store,
        CheckOnlyBackend(
            path=path, inference_base_url=server.base_url, inference_api_key=server.api_key
        ),
        run=RUN,
    )
    model = trainable_model(name=name, project="loops", base_model="test-base")
    await model.register(backend)
    return model, backend


async def agent(client: AsyncOpenAI, question: str, index: int) -> art.Trajectory:
    """ART's OpenAI-client pattern, with everything a trajectory can hold."""
    trajectory = art.Trajectory(
        messages_and_choices=[
            {"role": "system", "content": "Answer briefly.", "name": "rules"},  # key order kept
            {"content": question, "role": "user"},
        ],
        tools=TOOLS,
        reward=0,
        metrics={"turns": 1, "ratio": 0.1 + 0.2, "used_tool": True},
        metadata={"question": question, "index": index, "none": None},
        initial_policy_version=0,
        final_policy_version=1,
    )
    completion = await client.chat.completions.create(
        model="test-model", messages=trajectory.messages(), tools=TOOLS, logprobs=True
    )
    trajectory.messages_and_choices.append(completion.choices[0])
    summary = [{"role": "user", "content": f"Summarise: {question}"}]
    answer = await client.chat.completions.create(
        model="test-model", messages=summary, logprobs=True
    )
    trajectory.additional_histories.append(
        history_class()(messages_and_choices=[*summary, answer.choices[0]], tools=SUMMARY_TOOLS)
    )
    trajectory.log(f"asked {question!r}")
    trajectory.reward = float(index) / 3
    return trajectory


async def a_group(server: LocalInferenceServer, question: str, size: int = 3):
    client = AsyncOpenAI(base_url=server.base_url, api_key=server.api_key)
    return art.TrajectoryGroup(
        [*[await agent(client, question, i) for i in range(size)], ValueError("gave up")],
        metadata={"scenario": question, "k": 2},
        metrics={"group_metric": 1.5},
        logs=["group log"],
    )


def dump(group: art.TrajectoryGroup) -> str:
    """The group as JSON, Choice objects whole, key order as it is."""
    return json.dumps(
        {
            "trajectories": [
                {
                    **t.model_dump(mode="json", exclude={"messages_and_choices"}),
                    "items": [
                        i.model_dump(mode="json") if not isinstance(i, dict) else i
                        for i in t.messages_and_choices
                    ],
                    "start_time": t.start_time.isoformat(),
                }
                for t in group.trajectories
            ],
            "exceptions": [e.model_dump() for e in group.exceptions],
            "metadata": group.metadata,
            "metrics": group.metrics,
            "logs": group.logs,
        }
    )


async def in_thread(*args: str) -> Any:
    """The command line (it runs its own event loop), from an async test."""
    return await asyncio.to_thread(cli, *args)


async def event_count(store: Any) -> int:
    async with store.database.read() as connection:
        return (await connection.execute(select(func.count()).select_from(t.events))).scalar()


async def test_a_recorded_group_comes_back_whole_and_exactly(store, server, tmp_path):
    model, backend = await model_on(server, store, tmp_path / "art")
    group = await a_group(server, "What is fact number 1?")

    group_id = await artstore.record_group(store, group, run=RUN, model=model, batch=0)

    # Stamped: each trajectory and the group say where they are.
    ids = [t.metadata["artstore_rollout_id"] for t in group.trajectories]
    assert group.metadata["artstore_group_id"] == group_id
    assert {t.metadata["artstore_group_id"] for t in group.trajectories} == {group_id}
    (stored,) = await artstore.run_groups(store, RUN)
    assert dump(stored) == dump(group)  # every field, key order, float and logprob
    assert stored == group
    assert [type(i).__name__ for i in stored.trajectories[0].messages_and_choices] == [
        "dict",
        "dict",
        "Choice",
    ]
    assert stored.trajectories[0].messages_and_choices[2].logprobs.content
    assert stored.exceptions[0].message == "gave up"
    # In SQL, by the stamped id.
    async with store.database.read() as connection:
        row = (
            await connection.execute(
                text("SELECT run, group_id, status, reward FROM v_rollouts WHERE rollout_id = :r"),
                {"r": ids[2]},
            )
        ).one()
        messages = (
            await connection.execute(
                text(
                    "SELECT history_index, role, trainable FROM v_trajectory_messages "
                    "WHERE rollout_id = :r ORDER BY history_index, message_index"
                ),
                {"r": ids[2]},
            )
        ).all()
    assert tuple(row) == (RUN, group_id, "finished", pytest.approx(2 / 3))
    assert [tuple(m) for m in messages] == [
        (0, "system", 0),
        (0, "user", 0),
        (0, "assistant", 1),
        (1, "user", 0),
        (1, "assistant", 1),
    ]

    # Recorded again as it is: nothing written. A changed reward: recorded again.
    before = await event_count(store)
    assert await artstore.record_group(store, group, run=RUN, model=model) == group_id
    assert await event_count(store) == before
    group.trajectories[0].reward = 0.75
    await artstore.record_group(store, group, run=RUN, model=model)
    (again,) = await artstore.run_groups(store, RUN)
    assert again.trajectories[0].reward == 0.75
    if has_exchanges():  # ART >= 0.5.20 captures raw exchanges: they are kept whole too
        client = AsyncOpenAI(base_url=server.base_url, api_key=server.api_key)
        captured = []
        for _ in range(2):
            with art.Trajectory() as trajectory:  # ART's own capture of the HTTP exchange
                await client.chat.completions.create(
                    model="test-model", messages=[{"role": "user", "content": "hi"}], logprobs=True
                )
            trajectory.reward = 0.5
            captured.append(trajectory)
        exchanged = art.TrajectoryGroup(captured)
        await artstore.record_group(store, exchanged, run="loops/exchanges", model=model)
        (stored,) = await artstore.run_groups(store, "loops/exchanges")
        assert stored == exchanged and stored.trajectories[0].exchanges.chat_completions
    await backend.close()
    await assert_consistent(store)


async def test_what_cannot_be_recorded_fails_alone_with_a_clear_error(store, server, tmp_path):
    model, backend = await model_on(server, store, tmp_path / "art")
    bad = art.Trajectory(messages_and_choices=[{"role": "user", "content": "x"}], reward=0)
    bad.reward = float("nan")
    with pytest.raises(InvalidEventError, match="trajectory 0: the reward is nan"):
        await artstore.record_group(store, art.TrajectoryGroup([bad]), run=RUN, model=model)
    odd = art.Trajectory(messages_and_choices=[{"role": "user", "content": "x"}], reward=1)
    odd.messages_and_choices.append(object())
    with pytest.raises(InvalidEventError, match="neither a message dict nor an openai Choice"):
        await artstore.record_group(store, art.TrajectoryGroup([odd]), run=RUN, model=model)
    with pytest.raises(ConfigurationError, match="has not been started: pass the model"):
        await artstore.record_group(store, art.TrajectoryGroup([]), run="never-started")
    # Nothing half-written: the run was started, no rollout or group exists.
    assert await rows(store, t.rollouts) == [] and await rows(store, t.groups) == []
    await backend.close()


async def test_the_recording_backend_is_the_backend_and_records_every_train_call(
    store, server, tmp_path
):
    model, backend = await model_on(server, store, tmp_path / "art")
    # Still the backend it wraps, for isinstance and for ART's class-level checks.
    assert isinstance(backend, CheckOnlyBackend)
    assert hasattr(type(backend), "push_destination") and backend.path == str(tmp_path / "art")
    assert model.backend() is backend and await model.get_step() == 0

    groups = [await a_group(server, f"question {i}") for i in range(2)]
    # Arguments the backend refuses fail before anything is recorded.
    with pytest.raises(TypeError):
        await backend.train(model, groups, no_such_argument=1)
    assert await rows(store, t.train_steps) == []

    result = await backend.train(model, groups, learning_rate=1e-5)  # never seen: recorded
    assert result.step == 1 and await model.get_step() == 1
    (step,) = await rows(store, t.train_steps)
    assert (step.run, step.model, step.status, step.step) == (RUN, "loops/agent", "completed", 1)
    assert sorted(step.group_ids) == sorted(g.metadata["artstore_group_id"] for g in groups)
    assert step.metrics["learning_rate"] == 1e-5
    # No group twice into one model: refused before training.
    with pytest.raises(GroupAlreadyConsumedError, match="was already trained into loops/agent"):
        await backend.train(model, groups[:1])
    third = await a_group(server, "question 3")
    with pytest.raises(GroupAlreadyConsumedError, match="given twice"):
        await backend.train(model, [third, third])
    assert await model.get_step() == 1
    assert [
        g.metadata["artstore_group_id"] for g in await artstore.unconsumed_groups(store, RUN, model)
    ] == [third.metadata["artstore_group_id"]]

    # A failing backend: the step is recorded as failed, the error is the backend's own.
    class Broken(Exception):
        pass

    async def broken(*args: Any, **kwargs: Any) -> Any:
        raise Broken("out of memory")

    backend.unrecorded.train = broken
    with pytest.raises(Broken):
        await backend.train(model, [third])
    failed = [s for s in await rows(store, t.train_steps) if s.status == "failed"]
    assert [(s.error_type, s.error_message) for s in failed] == [("Broken", "out of memory")]
    assert len(await artstore.unconsumed_groups(store, RUN, model)) == 1
    await backend.close()
    await assert_consistent(store)


async def test_a_user_loop_run_is_a_run_everywhere(store, server, tmp_path, database_url):
    """runs, show, the views, rescore and replay on a run a loop of its own recorded."""
    model, backend = await model_on(server, store, tmp_path / "art")
    for step in range(2):
        groups = [await a_group(server, f"step {step} question {i}", size=2) for i in range(2)]
        for group in groups:
            await artstore.record_group(store, group, run=RUN, model=model, batch=step)
        await backend.train(model, groups)
    await artstore.finish_run(store, RUN)
    await backend.close()

    async with store.database.read() as connection:
        run = (
            await connection.execute(
                text(
                    "SELECT status, model, num_rollouts, num_groups, num_train_steps, last_step "
                    "FROM v_runs WHERE run = :run"
                ),
                {"run": RUN},
            )
        ).one()
        unconsumed = (
            await connection.execute(
                text("SELECT count(*) FROM v_groups WHERE run = :run AND consumed_by IS NULL"),
                {"run": RUN},
            )
        ).scalar()
    assert tuple(run) == ("finished", "agent", 8, 4, 2, 2) and unconsumed == 0

    listed = json.loads((await in_thread("runs", "--format", "json", "--url", database_url)).stdout)
    assert [(r["run"], r["steps"], r["groups_consumed"]) for r in listed] == [(RUN, 2, 4)]
    shown = await in_thread("show", RUN, "--format", "json", "--url", database_url)
    assert shown.exit_code == 0, shown.output
    assert len(json.loads(shown.stdout)["groups"]) == 4

    def by_length(scenario: Any, results: list[Any], trajectories: list[Any]) -> list[float]:
        return [float(len(t.messages_and_choices[-1].message.content or "")) for t in trajectories]

    scored = await artstore.rescore(store, RUN, by_length, "length")
    assert len(scored) == 4
    second = trainable_model(name="second", project="loops", base_model="test-base")
    await second.register(CheckOnlyBackend(path=tmp_path / "art"))
    plan = await artstore.replay(store, RUN, second, scorer="length")
    # The run's batches, as the loop trained them: 2 steps of 2 groups.
    assert [len(s) for s in plan.steps] == [2, 2] and plan.trained_steps == [1, 2]
    await assert_consistent(store)


async def test_rollouts_of_wrap_rollout_join_the_group_and_run_that_seal_them(store, server):
    from artstore.langgraph import init_chat_model, wrap_rollout

    model = art.Model(
        name="lg",
        project="loops",
        inference_base_url=server.base_url,
        inference_api_key=server.api_key,
        inference_model_name="test-model",
    )

    async def research(question: str) -> art.Trajectory:
        await init_chat_model().ainvoke([("user", question)])
        return art.Trajectory(messages_and_choices=[], reward=0.5)

    recorded = wrap_rollout(store, model, research, run="loops/lg")
    trajectories = [await recorded(f"question {i}") for i in range(2)]
    (run,) = await rows(store, t.runs)
    assert (run.run, run.status, run.model) == ("loops/lg", "recorded", "lg")  # from rollouts

    group_id = await artstore.record_group(store, art.TrajectoryGroup(trajectories), run="loops/lg")
    rollouts = await rows(store, t.rollouts)
    assert len(rollouts) == 2 and {r.group_id for r in rollouts} == {group_id}  # not copied
    (stored,) = await artstore.run_groups(store, "loops/lg")
    assert [t.reward for t in stored.trajectories] == [0.5, 0.5]
    assert all(t.messages_and_choices for t in stored.trajectories)  # the calls, recorded
    await assert_consistent(store)


async def test_a_trajectory_of_a_sealed_group_is_never_copied_into_another_group(
    store, server, tmp_path
):
    """Recorded again in another composition (one dropped), a sealed group's trajectories
    are refused, nothing written: their copy in a second group would be trained twice."""
    model, backend = await model_on(server, store, tmp_path / "art")
    group = await a_group(server, "How many legs has an ant?")
    group_id = await artstore.record_group(store, group, run=RUN, model=model)
    before = await event_count(store)
    fewer = art.TrajectoryGroup(group.trajectories[:2])
    with pytest.raises(ConfigurationError, match=f"already in sealed group {group_id}"):
        await artstore.record_group(store, fewer, run=RUN, model=model)
    with pytest.raises(ConfigurationError, match="a trajectory belongs to one group"):
        await backend.train(model, [fewer])
    assert await event_count(store) == before
    # As it was, the group is recognised; a copy made on purpose is recorded as one.
    assert await artstore.record_group(store, group, run=RUN, model=model) == group_id
    copy = group.trajectories[0].model_copy(deep=True)
    del copy.metadata["artstore_rollout_id"], copy.metadata["artstore_group_id"]
    other = await artstore.record_group(store, art.TrajectoryGroup([copy]), run=RUN, model=model)
    assert other != group_id
    await backend.close()
    await assert_consistent(store)


async def test_an_imported_run_replays_in_its_batches(store, server, tmp_path, database_url):
    url = database_url
    model, backend = await model_on(server, store, tmp_path / "art")
    for batch in range(2):
        for i in range(3):
            group = await a_group(server, f"batch {batch} question {i}", size=2)
            await artstore.record_group(store, group, run=RUN, model=model, batch=batch)
    await backend.close()
    from artstore.exchange import export_jsonl, import_path

    await export_jsonl(store, RUN, tmp_path / "run.jsonl")
    await import_path(store, tmp_path / "run.jsonl", run="imported/copy")
    second = trainable_model(name="second", project="loops", base_model="test-base")
    await second.register(CheckOnlyBackend(path=tmp_path / "art"))
    plan = await artstore.replay(store, "imported/copy", second)
    assert [len(s) for s in plan.steps] == [3, 3]  # its batches, though its config says nothing
    dry = await in_thread(
        "replay",
        "imported/copy",
        "--dry-run",
        "--model",
        "third",
        "--base-model",
        "test-base",
        "--url",
        url,
    )
    assert dry.exit_code == 0, dry.output
