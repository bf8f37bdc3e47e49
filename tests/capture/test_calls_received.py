"""Every way of recording a run keeps each LLM call the inference server received, once.

Each case runs one pattern the store supports, small, against a fresh local inference
server, and then compares `v_llm_calls` with the requests the server received
(`capture_helpers.assert_each_call_recorded_once`): as many rows, with the same numbers
of input messages, failed calls included. A rollout that returned a trajectory also
counts its calls (`num_llm_calls`), which is what the viewer's token charts sum.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import art
import openai
import pytest
from capture_helpers import assert_each_call_recorded_once, served_model
from sqlalchemy import text
from training_helpers import langgraph_agent, length_reward, scenarios, trainable_model

import artstore
from artstore.art_versions import has_pipeline_trainer
from artstore.art_versions import trainable_model as art_trainable_model
from artstore.testing.inference_server import LocalInferenceServer

RUN = "calls/received"


@pytest.fixture(autouse=True)
def in_tmp_path(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.chdir(tmp_path)  # ART writes .art/ here


def question(scenario: Any) -> list[dict[str, str]]:
    return [{"role": "user", "content": scenario["question"]}]


async def ask(client: Any, model: Any, scenario: Any, *, stream: bool = False) -> art.Trajectory:
    """ART's OpenAI-client pattern: one call, its Choice appended (streamed or not)."""
    from art.openai import consume_chat_completion_stream

    messages = question(scenario)
    options = {"model": model.get_inference_name(), "messages": messages, "logprobs": True}
    if stream:
        completion = await consume_chat_completion_stream(
            await client.chat.completions.create(
                stream=True, stream_options={"include_usage": True}, **options
            )
        )
    else:
        completion = await client.chat.completions.create(**options)
    choice = completion.choices[0]
    return art.Trajectory(
        messages_and_choices=[*messages, choice], reward=float(len(choice.message.content or ""))
    )


# --- the patterns -------------------------------------------------------------------------------


async def rollout_with_openai_clients(store: Any, server: Any, tmp_path: Path) -> None:
    """`store.rollout()` around async and sync OpenAI clients, streamed and not."""
    model = served_model(server)
    aclient = openai.AsyncOpenAI(base_url=server.base_url, api_key=server.api_key)
    client = openai.OpenAI(base_url=server.base_url, api_key=server.api_key)

    def sync_call(stream: bool) -> None:
        messages = question({"question": "Sync?"})
        response = client.chat.completions.create(
            model="test-model", messages=messages, logprobs=True, stream=stream
        )
        if stream:
            list(response)

    for stream in (False, True):
        async with store.rollout(model, scenario={"stream": stream}):
            await ask(aclient, model, {"question": "Async?"}, stream=stream)
            await asyncio.to_thread(sync_call, stream)


async def training_framework(store: Any, server: Any, tmp_path: Path) -> None:
    model, backend = await trainable_model(tmp_path, server)
    await artstore.TrainingFramework(store, progress=False).run_training(
        model=model,
        scenarios=scenarios(1),
        agent_function=langgraph_agent,
        reward_function=length_reward,
        config=artstore.TrainingConfig(epochs=1, batch_size=1, group_size=2),
    )
    await backend.close()


async def durable_rollouts_and_record_group(store: Any, server: Any, tmp_path: Path) -> None:
    model, backend = await trainable_model(tmp_path, server)
    client = model.openai_client()

    async def rollout(model: Any, scenario: Any) -> art.Trajectory:
        return await ask(client, model, scenario)

    durable = artstore.durable_rollouts(store, rollout, run=RUN)
    groups = await art.gather_trajectory_groups(
        [art.TrajectoryGroup(durable(model, s) for _ in range(2)) for s in scenarios(2)],
        pbar_desc=None,
    )
    for group in groups:
        await artstore.record_group(store, group, run=RUN, model=model)
    await backend.close()


async def recording_backend_loop(store: Any, server: Any, tmp_path: Path) -> None:
    """The README's own loop: recording backend, durable rollouts, group recorder."""
    from artstore.backends import CheckOnlyBackend

    trainer = CheckOnlyBackend(
        path=tmp_path / "art", inference_base_url=server.base_url, inference_api_key=server.api_key
    )
    backend = artstore.recording_backend(store, trainer, run=RUN)
    model = art_trainable_model(name="agent", project="calls", base_model="test-base")
    await model.register(backend)
    client = model.openai_client()

    async def rollout(model: Any, scenario: Any) -> art.Trajectory:
        return await ask(client, model, scenario, stream=scenario["id"] == 1)

    durable = artstore.durable_rollouts(store, rollout, run=RUN)
    groups = await art.gather_trajectory_groups(
        [art.TrajectoryGroup(durable(model, s) for _ in range(2)) for s in scenarios(2)],
        after_each=artstore.group_recorder(store, run=RUN, model=model, batch=0),
        pbar_desc=None,
    )
    await backend.train(model, groups, learning_rate=1e-5)
    await backend.close()


async def langgraph_wrap_rollout(store: Any, server: Any, tmp_path: Path) -> None:
    """`artstore.langgraph.wrap_rollout` with artstore's and ART's chat models, streamed."""
    from art.langgraph import init_chat_model as art_init_chat_model
    from test_langgraph_streaming import graph_of

    from artstore.langgraph import init_chat_model, wrap_rollout

    async def agent(init: Callable[[], Any], scenario: Any) -> art.Trajectory:
        messages = {"messages": [("user", scenario["question"])]}
        async for _ in graph_of(init()).astream(messages, stream_mode="messages"):
            pass
        return art.Trajectory(messages_and_choices=[], reward=float(len(scenario["question"])))

    model = served_model(server)
    wrapped = wrap_rollout(store, model, agent, scenario=lambda init, s: s, run=RUN)
    trajectories = [
        await wrapped(init, scenario)
        for init in (init_chat_model, art_init_chat_model)
        for scenario in scenarios(1)
    ]
    await artstore.group_recorder(store, run=RUN, model=model)(art.TrajectoryGroup(trajectories))


async def pipeline_trainer(store: Any, server: Any, tmp_path: Path) -> int:
    """ART's PipelineTrainer: rollouts side by side in one group (one of them failing after
    its streamed call), and a group answered by one call with `n=2`."""
    from art.pipeline_trainer import PipelineRuntimeConfig, make_group_rollout_fn

    model, backend = await trainable_model(tmp_path, server)
    client = model.openai_client()
    attempts: dict[int, int] = {}

    async def one(model: Any, scenario: Any, config: Any) -> art.Trajectory:
        attempt = attempts[scenario["id"]] = attempts.get(scenario["id"], 0) + 1
        trajectory = await ask(client, model, scenario, stream=attempt == 3)
        if attempt == 3:  # (ART trains no streamed Choice: it carries no token count)
            raise RuntimeError("gave up after asking")
        return trajectory

    async def shared(model: Any, scenario: Any, config: Any) -> art.TrajectoryGroup:
        completion = await client.chat.completions.create(
            model=model.get_inference_name(), messages=question(scenario), logprobs=True, n=2
        )
        return art.TrajectoryGroup(
            art.Trajectory(messages_and_choices=[*question(scenario), c], reward=float(i))
            for i, c in enumerate(completion.choices)
        )

    side_by_side = make_group_rollout_fn(one, n=3)

    async def rollout_fn(model: Any, scenario: Any, config: Any) -> art.TrajectoryGroup:
        return await (shared if scenario["id"] == 1 else side_by_side)(model, scenario, config)

    trainer = artstore.pipeline_trainer(
        store,
        run=RUN,
        model=model,
        backend=backend,
        rollout_fn=rollout_fn,
        scenarios=scenarios(2),
        pipeline=PipelineRuntimeConfig(num_rollout_workers=1, min_batch_size=1),
        max_steps_off_policy=None,
        log_interval_seconds=60,
    )
    await trainer.train(handle_signals=False)
    await backend.close()
    await assert_each_call_is_its_trajectorys(store)
    return 1  # the second trajectory answered by the call with n=2: that call is the first's


async def assert_each_call_is_its_trajectorys(store: Any) -> None:
    """Each finished rollout's call answered with its trajectory's Choice; the call of the
    rollout that raised is in a rollout of the group that failed."""
    from artstore.documents.exchanges import chat_completion

    async with store.database.read() as connection:
        rollouts = (
            await connection.execute(
                text("SELECT rollout_id, status, error_type FROM v_rollouts ORDER BY rollout_id")
            )
        ).all()
    streams = await store.read_streams(f"rollout-{r.rollout_id}" for r in rollouts)
    for rollout in rollouts:
        calls = [e.data for e in streams[f"rollout-{rollout.rollout_id}"] if e.type == "llm.call"]
        if rollout.status == "failed":
            assert rollout.error_type == "NoTrajectory" and len(calls) == 1
            continue
        if not calls:
            continue  # the second answer of the call with n=2
        (call,) = calls
        document = json.loads((await store.get_blobs([call["output"]]))[call["output"]])
        answers = [c.message.content for c in chat_completion(document).choices]
        trajectory = await store.trajectory(rollout.rollout_id)
        assert trajectory.messages_and_choices[-1].message.content == answers[0]
    assert [r.status for r in rollouts].count("failed") == 1


async def workers(store: Any, server: Any, tmp_path: Path) -> None:
    """A trainer in workers mode and a rollout worker (PostgreSQL)."""
    from training_helpers import scripted_agent

    from artstore.workers import run_worker

    model, backend = await trainable_model(tmp_path, server)
    config = artstore.TrainingConfig(epochs=1, batch_size=1, group_size=2, rollouts="workers")
    trainer = artstore.TrainingFramework(store, progress=False).run_training(
        model=model,
        scenarios=scenarios(1),
        agent_function=scripted_agent,
        reward_function=length_reward,
        config=config,
    )
    run = f"{model.project}/{model.name}"
    worker = run_worker(store, run, scripted_agent, concurrency=2, api_key=server.api_key)
    await asyncio.gather(trainer, worker)
    await backend.close()


# A pattern returns how many of its finished rollouts share a call another one holds.
Pattern = Callable[[Any, Any, Path], Awaitable[int | None]]
PATTERNS: dict[str, Pattern] = {
    "rollout-openai-clients": rollout_with_openai_clients,
    "training-framework": training_framework,
    "durable-rollouts-record-group": durable_rollouts_and_record_group,
    "recording-backend-loop": recording_backend_loop,
    "langgraph-wrap-rollout": langgraph_wrap_rollout,
    "pipeline-trainer": pipeline_trainer,
    "workers": workers,
}


# PipelineTrainer exists from ART 0.5.20 on: on older ARTs the pattern is not offered at
# all, so that no PostgreSQL case is skipped.
PATTERNS_OF_THIS_ART = [
    name for name in PATTERNS if name != "pipeline-trainer" or has_pipeline_trainer()
]


@pytest.mark.parametrize("pattern", PATTERNS_OF_THIS_ART)
async def test_each_call_the_server_received_is_recorded_once(
    store, database_url: str, tmp_path: Path, pattern: str
) -> None:
    if pattern == "workers" and not database_url.startswith("postgresql"):
        pytest.skip("rollout workers need PostgreSQL")
    async with LocalInferenceServer() as server:
        sharing = await PATTERNS[pattern](store, server, tmp_path) or 0

    await assert_each_call_recorded_once(store, server)
    async with store.database.read() as connection:
        rollouts = (
            await connection.execute(
                text("SELECT status, num_llm_calls, total_tokens FROM v_rollouts")
            )
        ).all()
    finished = [r for r in rollouts if r.status == "finished"]
    assert finished and [r.num_llm_calls for r in finished].count(0) == sharing, rollouts


# --- failed calls ---------------------------------------------------------------------------------

FAILING = {"fail_when": lambda request: True}


async def openai_client_retrying(store: Any, server: Any) -> None:
    client = openai.AsyncOpenAI(base_url=server.base_url, api_key=server.api_key, max_retries=1)
    async with store.rollout(served_model(server)):
        with pytest.raises(openai.InternalServerError):
            await client.chat.completions.create(model="test-model", messages=question(HI))


async def arts_chat_model_retrying(store: Any, server: Any) -> None:
    from art.langgraph import init_chat_model as art_init_chat_model

    async with store.rollout(served_model(server)):
        with pytest.raises(openai.InternalServerError):  # its ChatOpenAI retries twice
            await art_init_chat_model().ainvoke("hi")


async def artstores_chat_model_retrying(store: Any, server: Any) -> None:
    from artstore.langgraph import init_chat_model

    async with store.rollout(served_model(server)):
        with pytest.raises(openai.InternalServerError):
            await init_chat_model(max_retries=1).ainvoke("hi")  # the SDK sends it twice
        with pytest.raises(openai.InternalServerError):
            await asyncio.to_thread(init_chat_model(max_retries=1).invoke, "hi")


async def stream_closed_early(store: Any, server: Any) -> None:
    client = openai.AsyncOpenAI(base_url=server.base_url, api_key=server.api_key)
    async with store.rollout(served_model(server)):
        stream = await client.chat.completions.create(
            model="test-model", messages=question(HI), stream=True
        )
        async for _ in stream:
            break
        await stream.close()


HI = {"question": "Tell me a long story please"}
FAILURES: dict[str, tuple[Callable[[Any, Any], Awaitable[None]], dict[str, Any]]] = {
    "openai-client-retrying": (openai_client_retrying, FAILING),
    "arts-chat-model-retrying": (arts_chat_model_retrying, FAILING),
    "artstores-chat-model-retrying": (artstores_chat_model_retrying, FAILING),
    "stream-closed-early": (stream_closed_early, {"chunk_interval_s": 0.05}),
}


@pytest.mark.parametrize("failure", FAILURES)
async def test_each_failed_call_is_recorded_once_with_what_arrived(store, failure: str) -> None:
    run, options = FAILURES[failure]
    async with LocalInferenceServer(**options) as server:
        await run(store, server)

    await assert_each_call_recorded_once(store, server)
    events = [e.data for e in await store.read_all(types=["llm.call"])]
    superseded = {e["supersedes"] for e in events if e.get("supersedes")}
    kept = [e for e in events if e["call_id"] not in superseded]
    assert kept and all(e["error_type"] for e in kept)
    http = [e for e in events if e["source"] == "http"]
    bodies = await store.get_blobs([e["output"] for e in http])
    for event in http:  # the response as it arrived: the error, or the stream so far
        arrived = json.loads(bodies[event["output"]])
        if event["stream"]:
            assert arrived["sse"] and "[DONE]" not in json.dumps(arrived)
        else:
            assert arrived["json"]["error"]["message"] == "Injected failure (fail_when)."
    async with store.database.read() as connection:
        rollout_ids = (await connection.execute(text("SELECT rollout_id FROM v_rollouts"))).all()
    for (rollout_id,) in rollout_ids:  # failed calls are no part of a trajectory
        assert (await store.trajectory(rollout_id)).messages_and_choices == []
