"""A durable rollout of the replay agent that SIGKILLs itself after chosen answers, once each.

    python tests/support/replay_crash_driver.py DATABASE_URL WORKDIR BASE_URL API_KEY KILLS CALLS

KILLS is a comma-separated list of call numbers, in order (a number may repeat). Run it
again and again until it exits 0: run i kills itself (writing WORKDIR/killed-i first) once
the answer of call KILLS[i] arrived (a call served back from the record counts: the agent
sees it arrive) and was committed; a later run resumes the rollout through
`artstore.durable_rollouts`, and the last writes WORKDIR/result.json (the rollout id, its
answer). The agent makes CALLS calls; the inference server (the test's) counts them.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path
from types import SimpleNamespace

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from replay_agent import agent

import artstore
from artstore.capture.rollout import current_rollout


async def main(
    url: str, workdir: Path, base_url: str, api_key: str, kills: list[int], calls: int
) -> None:
    import art

    server = SimpleNamespace(base_url=base_url, api_key=api_key)

    armed = next((i for i in range(len(kills)) if not (workdir / f"killed-{i}").exists()), None)

    async def on_answer(call: int) -> None:
        if armed is not None and call == kills[armed]:
            killed = workdir / f"killed-{armed}"
            # Killed once the calls so far are committed: a call still on its way to the
            # database when a process dies is not recorded, and goes to the server again.
            await current_rollout().settle()
            killed.write_text("")
            os.kill(os.getpid(), signal.SIGKILL)

    async def rollout(model: art.Model, scenario: str) -> art.Trajectory:
        messages: list = []
        answer = await agent(
            server, stream=True, on_answer=on_answer, messages=messages, num_calls=calls
        )
        return art.Trajectory(
            messages_and_choices=messages, reward=0.0, metadata={"answer": answer}
        )

    model = art.Model(
        name="agent",
        project="replay",
        inference_base_url=base_url,
        inference_api_key=api_key,
        inference_model_name="test-model",
    )
    store = await artstore.open_store(url)
    try:
        durable = artstore.durable_rollouts(store, rollout, run="replay")
        trajectory = await durable(model, "the task")
        rollout_id = trajectory.metadata["artstore_rollout_id"]
        (workdir / "result.json").write_text(
            json.dumps({"rollout_id": rollout_id, "answer": trajectory.metadata["answer"]})
        )
    finally:
        await store.close()


if __name__ == "__main__":
    database_url, workdir, base_url, api_key, kills, calls = sys.argv[1:]
    at = [int(n) for n in kills.split(",") if n]
    asyncio.run(main(database_url, Path(workdir), base_url, api_key, at, int(calls)))
