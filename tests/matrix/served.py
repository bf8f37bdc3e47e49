"""The `serve` pattern: agents recorded by `artstore serve`, the groups trained from the store.

The child runs the server in-process (uvicorn on a free port) in front of the case's
LocalInferenceServer, so a kill takes the server down with it. Each rollout is started
through the rollout API in a group of its own scenario (`group_id_for`: the same group
in every start), its agent is a plain `openai.AsyncOpenAI` client given only the
rollout's base URL (and its own key for the upstream, which the proxy forwards and the
store must never hold), and it is finished with its reward (or failed) through the API
with the rollout's token. A group with GROUP_SIZE finished rollouts is sealed as it is
(`record_group` of the stored trajectories, stamped with their rollout ids), and each
step's sealed groups are trained (`run_groups` + `recording_backend`), as `artstore
replay` trains them.

Crash points: `rollout` (after the agent's call, before the rollout is finished) and
`stream` (after a streamed answer's first chunk, before its end).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator
from typing import Any

from matrix.patterns import (
    GROUP_SIZE,
    RUN,
    STEPS,
    Context,
    batch_for,
    question,
    registered_model,
)

ROLLOUT_TOKENS = "rollout-tokens.txt"  # for the invariant that no token is stored


@contextlib.asynccontextmanager
async def serving(context: Context) -> AsyncIterator[str]:
    """`artstore serve`'s app over the child's store, in this event loop; its address."""
    import uvicorn

    from artstore.serve.app import create_app

    app = create_app(context.store, upstream=context.server.base_url)
    sock = socket.socket()
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    server = uvicorn.Server(
        uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on")
    )
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:  # ends: a server that cannot start ends its task
        if task.done():
            await task
            raise RuntimeError("artstore serve did not start")
        await asyncio.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        await task


async def agent_answer(context: Context, base_url: str, scenario: dict[str, Any]) -> str:
    """A plain OpenAI client's call through the rollout's base URL (streamed or not)."""
    import openai

    client = openai.AsyncOpenAI(
        base_url=base_url,
        api_key=context.server.api_key,
        timeout=context.timeout_s,
        max_retries=2,
    )
    options = {"model": "served-agent", "messages": question(scenario)}
    async with client:
        if not context.streamed:
            completion = await client.chat.completions.create(**options)
            return completion.choices[0].message.content or ""
        answer = ""
        stream = await client.chat.completions.create(stream=True, **options)
        async for chunk in stream:
            if chunk.choices:
                answer += chunk.choices[0].delta.content or ""
                context.crash_plan.reached("stream")
        return answer


async def served_rollout(
    context: Context,
    http: Any,
    address: str,
    scenario: dict[str, Any],
    group_id: str,
    resumes: str | None = None,
) -> None:
    """One rollout through the API: started (resuming `resumes`, a rollout a killed child
    left running, when given), its agent run, finished with its reward or failed with the
    agent's error."""
    body = {
        "model": "agent",
        "scenario": scenario,
        "scenario_index": scenario["id"],
        "group_id": group_id,
    }
    if resumes is not None:
        body["resumes"] = resumes
    started = await http.post(f"{address}/api/runs/{RUN}/rollouts", json=body)
    assert started.status_code == 201, started.text
    rollout = started.json()
    with open(context.workdir / ROLLOUT_TOKENS, "a") as tokens:
        tokens.write(rollout["token"] + "\n")
    ending = f"{address}/api/rollouts/{rollout['rollout_id']}"
    auth = {"Authorization": f"Bearer {rollout['token']}"}
    try:
        answer = await agent_answer(context, rollout["base_url"], scenario)
        context.faults.after_call()
        await context.reach_rollout(scenario)
    except Exception as exc:
        failed = await http.post(f"{ending}/fail", json={"error": str(exc)}, headers=auth)
        assert failed.status_code == 200, failed.text
        return
    reward = context.faults.reward(answer)
    finished = await http.post(
        f"{ending}/finish",
        json={"result": answer, "rewards": {"reward": reward}},
        headers=auth,
    )
    assert finished.status_code == 200, finished.text
    context.finished[scenario["id"]] += 1


async def sealed_group(
    context: Context, model: Any, http: Any, address: str, step: int, scenario: dict[str, Any]
) -> None:
    """The scenario's group of the step, rolled out until GROUP_SIZE rollouts finished
    (a failed or abandoned one is rolled out again; one a killed child left running is
    resumed, its recorded answers served back by the proxy), then sealed as it is."""
    import art

    import artstore
    from artstore.groups import group_id_for, group_rollouts, sealed_groups

    store = context.store
    group_id = group_id_for(RUN, step, scenario["id"])
    if await sealed_groups(store, [group_id]):
        return
    while True:
        done = await group_rollouts(store, group_id)
        missing = GROUP_SIZE - len(done.policy)
        if missing <= 0:
            break
        resumes = done.running_policy[:missing]
        resumes += [None] * (missing - len(resumes))
        await asyncio.gather(
            *(served_rollout(context, http, address, scenario, group_id, r) for r in resumes)
        )
    ids = done.policy[:GROUP_SIZE]
    trajectories = await store.trajectories(ids)
    for rollout_id in ids:
        trajectories[rollout_id].metadata["artstore_rollout_id"] = rollout_id
    await artstore.record_group(
        store,
        art.TrajectoryGroup([trajectories[r] for r in ids]),
        run=RUN,
        model=model,
        batch=step,
        scenario=scenario,
        scenario_index=scenario["id"],
        group_id=group_id,
    )


async def serve(context: Context) -> None:
    """Rollouts through `artstore serve`, their groups sealed and trained step by step."""
    import httpx

    import artstore

    store = context.store
    backend = artstore.recording_backend(store, context.trainer(), run=RUN)
    model = await registered_model(context, backend)
    async with serving(context) as address, httpx.AsyncClient(timeout=120) as http:
        for step in range(await model.get_step(), STEPS):
            for scenario in batch_for(step):
                await sealed_group(context, model, http, address, step, scenario)
            groups = await artstore.run_groups(store, RUN, batch=step)
            result = await backend.train(model, groups)
            await model.log(groups, metrics=result.metrics, step=result.step, split="train")
    await artstore.finish_run(store, RUN)
    await backend.close()
