"""The ways of running ART on the store, each a small run a matrix case can drive.

Each pattern runs STEPS train steps of BATCH scenarios in groups of GROUP_SIZE rollouts,
resuming from where the store (and the backend's own step) says it stopped, so that a
child killed at any point and started again finishes the run. An agent makes one LLM
call per rollout, through an OpenAI client (ART's `model.openai_client()`) or a LangGraph
graph on ART's chat model, streamed or not; `Faults` makes it fail as the case says.

The registry says which agent kinds each pattern is written for, and whether this ART
and the database have it (a pattern that is not available is never drawn).
"""

from __future__ import annotations

import hashlib
import os
import warnings
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from crash_points import CrashingBackend, CrashPlan, finished_in_unsealed_group

from matrix.cases import Case

PROJECT, MODEL_NAME = "matrix", "agent"
RUN = f"{PROJECT}/{MODEL_NAME}"  # the run TrainingFramework names; the others take it
STEPS, BATCH, GROUP_SIZE = 2, 2, 2
SCENARIOS = [{"question": f"What is fact number {i}?", "id": i} for i in range(3)]
MAX_EXCEPTIONS = 1  # the loops tolerate one failed rollout per step


def batch_for(step: int) -> list[dict[str, Any]]:
    """The scenarios of a step (distinct within a step, repeating across steps)."""
    return [SCENARIOS[(step * BATCH + k) % len(SCENARIOS)] for k in range(BATCH)]


def scenarios_in_order() -> list[dict[str, Any]]:
    """The scenarios of every step, for the patterns that take them all at once."""
    return [scenario for step in range(STEPS) for scenario in batch_for(step)]


class InjectedFailure(RuntimeError):
    """What a failing agent or reward function raises."""


@dataclass
class Faults:
    """The case's failures, each injected once in the whole case (across restarts): a
    marker file in WORKDIR says it happened, so the run can finish after it."""

    case: Case
    workdir: Path

    def once(self, name: str) -> bool:
        """True the first time `name` is asked for in this case, False ever after."""
        try:
            os.close(os.open(self.workdir / f"fault-{name}", os.O_CREAT | os.O_EXCL))
        except FileExistsError:
            return False
        return True

    def after_call(self) -> None:
        """The agent, after its LLM call, raises if this is a rollout the case fails."""
        failure = self.case.failure
        if failure in ("agent-raises", "art-retry") and self.once("agent"):
            raise InjectedFailure(f"{failure}: the agent raised after its call")
        if failure == "max-exceptions" and (self.once("agent-1") or self.once("agent-2")):
            raise InjectedFailure("max-exceptions: the agent raised after its call")

    def reward(self, text: str) -> float:
        """A reward with spread across a group (the answers differ); raises once when the
        case's reward function fails."""
        if self.case.failure == "reward-raises" and self.once("reward"):
            raise InjectedFailure("reward-raises: the reward function raised")
        return float(int(hashlib.sha256(text.encode()).hexdigest()[:4], 16) % 5)


@dataclass
class Context:
    """What a pattern gets from the child."""

    case: Case
    workdir: Path
    store: Any
    server: Any
    crash_plan: CrashPlan
    faults: Faults
    timeout_s: float
    finished: Counter[int] = field(default_factory=Counter)

    @property
    def streamed(self) -> bool:
        return self.case.agent.endswith("-stream")

    def trainer(self) -> CrashingBackend:
        return CrashingBackend(
            self.crash_plan,
            path=self.workdir / "art",
            inference_base_url=self.server.base_url,
            inference_api_key=self.server.api_key,
        )

    async def reach_rollout(self, scenario: dict[str, Any]) -> None:
        """The `rollout` crash point, once a sibling of the scenario's group finished."""
        await self.crash_plan.reach_rollout(
            self.finished,
            scenario["id"],
            lambda: finished_in_unsealed_group(self.store, scenario["id"]),
        )


# --- agents -----------------------------------------------------------------------------------


def question(scenario: dict[str, Any]) -> list[dict[str, str]]:
    return [{"role": "user", "content": scenario["question"]}]


async def openai_agent(context: Context, model: Any, scenario: dict[str, Any]) -> Any:
    """ART's OpenAI-client rollout: one call, its Choice appended to the trajectory."""
    import art
    from art.openai import consume_chat_completion_stream

    client = model.openai_client().with_options(timeout=context.timeout_s, max_retries=2)
    options = {"model": model.get_inference_name(), "messages": question(scenario)}
    if context.streamed:
        completion = await consume_chat_completion_stream(
            await client.chat.completions.create(
                stream=True, stream_options={"include_usage": True}, logprobs=True, **options
            )
        )
    else:
        completion = await client.chat.completions.create(logprobs=True, **options)
    context.faults.after_call()
    await context.reach_rollout(scenario)
    choice = completion.choices[0]
    reward = context.faults.reward(choice.message.content or "")
    context.finished[scenario["id"]] += 1
    return art.Trajectory(messages_and_choices=[*question(scenario), choice], reward=reward)


def graph(checkpointer: Any = None) -> Any:
    """A LangGraph ReAct graph on ART's chat model (the server never asks for the tool),
    compiled with `checkpointer` when given."""
    from art.langgraph import init_chat_model
    from training_helpers import lookup

    with warnings.catch_warnings():  # create_react_agent is deprecated in LangGraph 1.x
        warnings.simplefilter("ignore")
        from langgraph.prebuilt import create_react_agent

        model = init_chat_model().bind_tools([lookup])
        return create_react_agent(model, [lookup], checkpointer=checkpointer)


def checkpointed(context: Context) -> tuple[Any, dict[str, Any]]:
    """The graph and its config: `langgraph-checkpointed` compiles it with artstore's
    checkpointer, on a thread of its own per rollout (its checkpoint events are then part
    of what a killed child leaves behind)."""
    if context.case.agent != "langgraph-checkpointed":
        return graph(), {}
    import uuid

    from artstore.langgraph import checkpointer

    thread = {"configurable": {"thread_id": f"matrix-{uuid.uuid4().hex}"}}
    return graph(checkpointer(context.store)), thread


async def langgraph_answer(context: Context, scenario: dict[str, Any]) -> str:
    """Run the graph (streamed: `astream` in `messages` mode) and return its answer."""
    messages = {"messages": [("user", scenario["question"])]}
    agent, config = checkpointed(context)
    if context.streamed:
        answer = ""
        async for message, _ in agent.astream(messages, config, stream_mode="messages"):
            answer += str(message.content)
    else:
        answer = (await agent.ainvoke(messages, config))["messages"][-1].content
    context.faults.after_call()
    await context.reach_rollout(scenario)
    return answer


# --- patterns ---------------------------------------------------------------------------------


async def registered_model(context: Context, backend: Any) -> Any:
    from artstore.art_versions import trainable_model

    model = trainable_model(name=MODEL_NAME, project=PROJECT, base_model="test-base")
    await model.register(backend)
    return model


def retried(context: Context, rollout: Callable[..., Awaitable[Any]]) -> Any:
    """The rollout function under `@art.retry` when the case retries it."""
    import art

    if context.case.failure != "art-retry":
        return rollout
    return art.retry(max_attempts=2, delay=0.01, exceptions=(InjectedFailure,))(rollout)


async def gathering_loop(context: Context, rollout: Any, record: str) -> None:
    """ART's own loop made durable: recording backend, `gather_trajectory_groups` with
    `max_exceptions`, each group recorded by `group_recorder` (record="after_each") or by
    `record_group` once gathered (record="record_group"), `backend.train`, `model.log`."""
    import art

    import artstore

    store = context.store
    backend = artstore.recording_backend(store, context.trainer(), run=RUN)
    model = await registered_model(context, backend)
    for step in range(await model.get_step(), STEPS):
        after_each = artstore.group_recorder(store, run=RUN, model=model, batch=step)
        groups = await art.gather_trajectory_groups(
            (
                art.TrajectoryGroup(rollout(model, s) for _ in range(GROUP_SIZE))
                for s in batch_for(step)
            ),
            after_each=after_each if record == "after_each" else None,
            max_exceptions=MAX_EXCEPTIONS,
            pbar_desc=None,
        )
        if record == "record_group":
            for group in groups:
                await artstore.record_group(store, group, run=RUN, model=model, batch=step)
        result = await backend.train(model, groups)
        await model.log(groups, metrics=result.metrics, step=result.step, split="train")
    await artstore.finish_run(store, RUN)
    await backend.close()


def durable_openai_rollout(context: Context, replay_calls: bool = True) -> Any:
    import artstore

    async def rollout(model: Any, scenario: dict[str, Any]) -> Any:
        return await openai_agent(context, model, scenario)

    return artstore.durable_rollouts(
        context.store, retried(context, rollout), run=RUN, replay_calls=replay_calls
    )


async def user_loop(context: Context) -> None:
    """recording_backend + durable_rollouts + group_recorder (the docs' own loop)."""
    await gathering_loop(context, durable_openai_rollout(context), "after_each")


async def user_loop_live(context: Context) -> None:
    """The docs' loop with `durable_rollouts(replay_calls=False)`: a rollout a killed child
    left running is rolled out again from its first call."""
    await gathering_loop(context, durable_openai_rollout(context, replay_calls=False), "after_each")


async def record_group_loop(context: Context) -> None:
    """durable_rollouts + gather_trajectory_groups, then record_group for each group."""
    await gathering_loop(context, durable_openai_rollout(context), "record_group")


async def langgraph_loop(context: Context) -> None:
    """`artstore.langgraph.wrap_rollout` around a LangGraph agent, group_recorder."""
    import art

    from artstore.langgraph import wrap_rollout

    async def agent(model: Any, scenario: dict[str, Any]) -> Any:
        answer = await langgraph_answer(context, scenario)
        reward = context.faults.reward(answer)
        context.finished[scenario["id"]] += 1
        return art.Trajectory(messages_and_choices=[], reward=reward)

    def rollout(model: Any, scenario: dict[str, Any]) -> Any:
        wrapped = wrap_rollout(context.store, model, agent, run=RUN, scenario=lambda m, s: s)
        return retried(context, wrapped)(model, scenario)

    await gathering_loop(context, rollout, "after_each")


def framework_agent(context: Context, model: Any) -> Any:
    """The agent `TrainingFramework` (and a rollout worker) calls: `(scenario, id) -> text`."""

    async def agent(scenario: dict[str, Any], thread_id: str) -> str:
        if context.case.agent.startswith("openai"):
            trajectory = await openai_agent(context, model, scenario)
            return trajectory.messages_and_choices[-1].message.content
        answer = await langgraph_answer(context, scenario)
        context.finished[scenario["id"]] += 1
        return answer

    return retried(context, agent)


def framework_reward(context: Context) -> Any:
    def reward(scenario: Any, results: list[Any], trajectories: list[Any]) -> list[float]:
        return [context.faults.reward(str(result)) for result in results]

    return reward


async def training_framework(context: Context, rollouts: str = "in_process") -> None:
    """artstore.TrainingFramework: the seed's loop on events, resumed from the store."""
    import artstore

    backend = context.trainer()
    model = await registered_model(context, backend)
    await artstore.TrainingFramework(context.store, progress=False).run_training(
        model=model,
        scenarios=scenarios_in_order(),
        agent_function=framework_agent(context, model),
        reward_function=framework_reward(context),
        config=artstore.TrainingConfig(
            epochs=1, batch_size=BATCH, group_size=GROUP_SIZE, rollouts=rollouts
        ),
    )
    await backend.close()


async def workers(context: Context) -> None:
    """TrainingFramework in workers mode and a rollout worker, side by side (PostgreSQL)."""
    import asyncio

    from artstore.workers import run_worker

    trainer = training_framework(context, rollouts="workers")
    worker = run_worker(
        context.store,
        RUN,
        framework_agent(context, None),  # LangGraph agents only: no model of its own
        framework_reward(context),
        concurrency=2,
        api_key=context.server.api_key,
    )
    await asyncio.gather(trainer, worker)


async def pipeline_trainer(context: Context) -> None:
    """artstore.pipeline_trainer: ART's PipelineTrainer, durable on the store."""
    from art.pipeline_trainer import PipelineRuntimeConfig, make_group_rollout_fn

    import artstore

    backend = context.trainer()
    model = await registered_model(context, backend)

    async def one(model: Any, scenario: dict[str, Any], config: Any) -> Any:
        return await openai_agent(context, model, scenario)

    trainer = artstore.pipeline_trainer(
        context.store,
        run=RUN,
        model=model,
        backend=backend,
        rollout_fn=make_group_rollout_fn(retried(context, one), n=GROUP_SIZE),
        scenarios=scenarios_in_order(),
        pipeline=PipelineRuntimeConfig(num_rollout_workers=1, min_batch_size=BATCH),
        max_steps_off_policy=None,
        log_interval_seconds=60,
    )
    await trainer.train(handle_signals=False)
    await backend.close()


@dataclass(frozen=True)
class Pattern:
    run: Callable[[Context], Awaitable[None]]
    agents: tuple[str, ...]
    available: Callable[[str], bool] = lambda database: True


def _is_postgresql(database: str) -> bool:
    return database == "postgresql"


def _has_pipeline_trainer(database: str) -> bool:
    from artstore.art_versions import has_pipeline_trainer

    return has_pipeline_trainer()


async def serve(context: Context) -> None:
    """Agents recorded by `artstore serve` (tests/matrix/served.py)."""
    from matrix.served import serve

    await serve(context)


OPENAI = ("openai", "openai-stream")
LANGGRAPH = ("langgraph", "langgraph-stream", "langgraph-checkpointed")
PATTERNS: dict[str, Pattern] = {
    "serve": Pattern(serve, OPENAI),
    "user-loop": Pattern(user_loop, OPENAI),
    "user-loop-live": Pattern(user_loop_live, OPENAI),
    "record-group": Pattern(record_group_loop, OPENAI),
    "langgraph-loop": Pattern(langgraph_loop, LANGGRAPH),
    "training-framework": Pattern(training_framework, OPENAI + LANGGRAPH),
    "workers": Pattern(workers, LANGGRAPH, _is_postgresql),
    # ART's PipelineTrainer refuses a streamed Choice (no usage: no completion tokens).
    "pipeline-trainer": Pattern(pipeline_trainer, ("openai",), _has_pipeline_trainer),
}


def available_patterns(database: str) -> dict[str, tuple[str, ...]]:
    """The patterns this ART and `database` have, with the agent kinds each offers."""
    return {name: p.agents for name, p in PATTERNS.items() if p.available(database)}
