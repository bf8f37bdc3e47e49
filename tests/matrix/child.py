"""The child process of a matrix case: one run of a pattern, until it finishes or is killed.

`train(url, workdir, plan)` has the shape of the crash drivers' (tests/support/crash_points.py), so
that tests/support/crash_runs.py runs it in a forkserver child. The case is read from
WORKDIR/case.json. Around the pattern it sets up what the invariants read afterwards:

- a LocalInferenceServer that logs each request it received (WORKDIR/requests.jsonl),
  answers each call with a text of its own (a nonce: two trajectories that say the same
  are copies), some spelling out the server's API key (a credential artstore saw), and
  carries the case's scripted HTTP error or timeout;
- the crash points of tests/support/crash_points.py around the store and the backend, `append`
  (right after an acknowledged append) included;
- an ack file (WORKDIR/acks.txt): the event ids of every append the store acknowledged,
  written and synced before the caller hears of it.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
import uuid
from pathlib import Path
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from crash_points import CrashPlan, crash_around_appends

from matrix.cases import Case
from matrix.patterns import PATTERNS, SCENARIOS, Context, Faults

ACKS, REQUESTS, API_KEY, PORT = "acks.txt", "requests.jsonl", "api_key", "port"
TIMEOUT_S = 1.0  # the client timeout of the agents that can set one
SECRET_TOLD_IN = SCENARIOS[-1]["question"]


def answer_policy(api_key: str, faults: Faults) -> Any:
    """Every answer unique; those about the last scenario spell out the key (the others
    are stored as the trainer got them, so a copy of one is recognised); one answer late
    when the case times out."""

    def policy(request: dict[str, Any], sample_index: int) -> str:
        if faults.case.failure == "timeout" and faults.once("late-answer"):
            time.sleep(TIMEOUT_S * 3)
        told = SECRET_TOLD_IN in json.dumps(request.get("messages"))
        return f"Answer {uuid.uuid4().hex}" + (f"; my key is {api_key}." if told else ".")

    return policy


def failing_requests(faults: Faults) -> Any:
    """The second request of the run answered HTTP 500, once, when the case says so."""
    seen = [0]

    def fail_when(request: dict[str, Any]) -> bool:
        seen[0] += 1
        return faults.case.failure == "http-error" and seen[0] == 2 and faults.once("http-500")

    return fail_when


class Acks:
    """Writes the ids of acknowledged appends to the ack file, then reaches the crash
    point `append`."""

    def __init__(self, workdir: Path, crash_plan: CrashPlan) -> None:
        self.descriptor = os.open(workdir / ACKS, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self.crash_plan = crash_plan

    def acknowledged(self, events: Any) -> None:
        ids = "".join(f"{e.event_id}\n" for e in events)
        os.write(self.descriptor, ids.encode())
        os.fsync(self.descriptor)
        self.crash_plan.reached("append")

    def when_committed(self, events: Any) -> Any:
        """A future's callback: acknowledge `events` if their append succeeded."""

        def done(future: asyncio.Future) -> None:
            if not future.cancelled() and future.exception() is None:
                self.acknowledged(events)

        return done

    def watch(self, store: Any) -> None:
        """Hear of every append of `store` (its crash points wrapped already): `append`
        (which no longer goes through `append_nowait`), and the queued ones."""
        append = store.append
        append_nowait, append_together_nowait = store.append_nowait, store.append_together_nowait

        async def append_acknowledged(stream_id: str, events: Any, *args: Any, **kw: Any) -> Any:
            result = await append(stream_id, events, *args, **kw)
            self.acknowledged(events)
            return result

        def nowait(stream_id: str, events: Any, *args: Any, **kwargs: Any) -> Any:
            future = append_nowait(stream_id, events, *args, **kwargs)
            future.add_done_callback(self.when_committed(events))
            return future

        def together(appends: Any) -> list[Any]:
            futures = append_together_nowait(appends)
            for pending, future in zip(appends, futures, strict=True):
                future.add_done_callback(self.when_committed(pending.events))
            return futures

        store.append = append_acknowledged
        store.append_nowait, store.append_together_nowait = nowait, together


async def train(url: str, workdir: Path, plan: str) -> None:
    import artstore
    from artstore.testing.inference_server import LocalInferenceServer

    case = Case.read(workdir)
    faults = Faults(case, workdir)
    crash_plan = CrashPlan(workdir, plan)
    server = LocalInferenceServer(
        api_key=(workdir / API_KEY).read_text(),
        port=int((workdir / PORT).read_text()),
        request_log=workdir / REQUESTS,
        fail_when=failing_requests(faults),
    )
    server.policy = answer_policy(server.api_key, faults)
    with server:
        store = await artstore.open_store(url)
        crash_around_appends(store, crash_plan)
        Acks(workdir, crash_plan).watch(store)
        try:
            context = Context(case, workdir, store, server, crash_plan, faults, TIMEOUT_S)
            await PATTERNS[case.pattern].run(context)
        finally:
            await store.close()
    (workdir / "finished.json").write_text(json.dumps({"pid": os.getpid()}))
