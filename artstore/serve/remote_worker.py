"""`artstore worker --server URL`: a rollout worker that holds no database credentials.

It claims, renews, gives back and seals through the server's claims API
(`artstore.serve.claims_api`), which runs the claim services of database-connected
workers on the server's connection: the same leases, heartbeats and fencing. Each claimed
rollout is served by the server; the agent calls the proxy at the rollout's base URL
(`current_rollout()`), and the worker ends the rollout through the rollout API with the
rollout's token. A worker killed outright loses its leases; another worker's claim then
records its rollouts as abandoned and rolls them out again. A worker whose lease expired
has its finish refused by the database (409 `lease_lost`), whatever it believes.

Without database notifications, an idle worker asks again every `poll_s`.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import inspect
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any
from urllib.parse import quote

import httpx

from artstore.art_api import trajectory_class
from artstore.capture.rollout import to_json_value
from artstore.errors import ArtstoreError, NotFoundError, RewardFunctionError
from artstore.groups import call_reward_function
from artstore.workers.worker import WorkerSummary, registered_reward, worker_id

log = logging.getLogger("artstore.workers")

POLL_S = 0.5


@dataclass(frozen=True)
class ServedRollout:
    """The rollout an agent of a `--server` worker runs: where it calls its model."""

    rollout_id: str
    base_url: str  # the proxy's OpenAI-compatible base URL of this rollout
    model: str  # the model name to ask for
    token: str  # the rollout's token, also in the base URL

    def __repr__(self) -> str:
        return f"ServedRollout({self.rollout_id}, {self.model})"


_current: contextvars.ContextVar[ServedRollout | None] = contextvars.ContextVar(
    "artstore_served_rollout", default=None
)


def current_rollout() -> ServedRollout:
    """The served rollout the calling agent runs in (inside `artstore worker --server`)."""
    found = _current.get()
    if found is None:
        raise LookupError("no served rollout here: this agent is not run by a --server worker")
    return found


class ServerRefused(ArtstoreError):
    """The server answered a worker's request with an error."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status, self.code = status, code


async def run_remote_worker(
    server: str,
    token: str | None,
    run: str,
    agent: Callable[[Any, str], Any],
    reward: Callable[..., Any] | None = None,
    *,
    concurrency: int = 4,
    lease_s: float = 30.0,
    wait_for_run_s: float = 60.0,
    stop: asyncio.Event | None = None,
    poll_s: float = POLL_S,
) -> WorkerSummary:
    """Work on `run` through the server at `server` until its trainer finishes it."""
    worker = RemoteWorker(server, token, run, agent, reward, concurrency, lease_s, poll_s)
    return await worker.run(wait_for_run_s, stop or asyncio.Event())


class RemoteWorker:
    def __init__(
        self,
        server: str,
        token: str | None,
        run: str,
        agent: Callable[[Any, str], Any],
        reward: Callable[..., Any] | None,
        concurrency: int,
        lease_s: float,
        poll_s: float,
    ) -> None:
        self.server = server.rstrip("/")
        self.headers = {"authorization": f"Bearer {token}"} if token else {}
        self.run_name = run
        self.claims_url = f"{self.server}/api/runs/{quote(run, safe='/')}/claims"
        self.agent, self.reward = agent, reward
        self.concurrency, self.lease_s, self.poll_s = concurrency, lease_s, poll_s
        self.id = worker_id()
        self.summary = WorkerSummary(worker=self.id, run=run)
        self.tasks: dict[asyncio.Task[None], tuple[str, dict[str, Any]]] = {}
        self.http: httpx.AsyncClient | None = None
        self._lost: set[tuple[str, Any]] = set()  # claims counted in `leases_lost`

    async def post(
        self, url: str, body: dict[str, Any], token: str | None = None
    ) -> dict[str, Any]:
        assert self.http is not None
        headers = {"authorization": f"Bearer {token}"} if token else self.headers
        response = await self.http.post(url, json=body, headers=headers)
        return _answer(response)

    async def run(self, wait_for_run_s: float, stop: asyncio.Event) -> WorkerSummary:
        loop = asyncio.get_running_loop()
        beat = Heartbeat(self, loop)
        async with httpx.AsyncClient(timeout=max(60.0, self.lease_s)) as self.http:
            beat.start()
            try:
                await self._work(loop.time() + wait_for_run_s, stop)
            finally:
                await self._stop_tasks()
                await asyncio.to_thread(beat.stop)
        log.info("worker %s: %s", self.id, self.summary)
        return self.summary

    async def _work(self, registration_deadline: float, stop: asyncio.Event) -> None:
        loop = asyncio.get_running_loop()
        while not stop.is_set():
            free = self.concurrency - len(self.tasks)
            if free <= 0:  # busy: until a task of ours ends
                await self._idle(stop)
                continue
            body = {"worker": self.id, "limit": free, "lease_s": self.lease_s}
            try:
                answer = await self.post(self.claims_url, body)
            except ServerRefused as exc:
                if exc.status != 404 or loop.time() > registration_deadline:
                    raise NotFoundError(str(exc)) if exc.status == 404 else exc from None
                await _wait(stop, self.poll_s)
                continue
            except httpx.TransportError as exc:  # the server is away: try again soon
                self._note(f"server unavailable: {type(exc).__name__}: {exc}")
                await _wait(stop, self.poll_s)
                continue
            status = answer["run"]["status"]
            self.summary.run_status = status
            if self.reward is None and answer["seals"]:
                self.reward = registered_reward(SimpleNamespace(run=self.run_name, **answer["run"]))
            for item in answer["seals"]:
                self._start(self._seal(item), "seal", item)
            for item in answer["rollouts"]:
                self._start(self._rollout(item), "rollout", item)
            if status != "open" and not self.tasks:
                return
            if not (answer["rollouts"] or answer["seals"]):
                await self._idle(stop)

    async def _idle(self, stop: asyncio.Event) -> None:
        """Until a task of ours ends, `stop` is set, or `poll_s` passes."""
        stopping = asyncio.ensure_future(stop.wait())
        try:
            await asyncio.wait(
                [*self.tasks, stopping], timeout=self.poll_s, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            stopping.cancel()

    def _start(self, work: Any, kind: str, item: dict[str, Any]) -> None:
        task = asyncio.create_task(work)
        self.tasks[task] = (kind, item["claim"])
        task.add_done_callback(lambda done: self.tasks.pop(done, None))

    def on_lost(self, kind: str, claim: dict[str, Any]) -> None:
        """The heartbeat found a lease lost: stop what this worker does under it."""
        key = (kind, tuple(sorted(claim.items())))
        for task, held in list(self.tasks.items()):
            if held == (kind, claim):
                if key not in self._lost:  # reported by every beat until the task ends
                    self._lost.add(key)
                    self.summary.leases_lost += 1
                    log.warning("worker %s: lease lost on %s %s", self.id, kind, claim)
                task.cancel()

    async def _stop_tasks(self) -> None:
        for task in self.tasks:
            task.cancel()
        if self.tasks:
            await asyncio.gather(*self.tasks, return_exceptions=True)

    async def _rollout(self, item: dict[str, Any]) -> None:
        served = ServedRollout(item["rollout_id"], item["base_url"], item["model"], item["token"])
        end = f"{self.server}/api/rollouts/{served.rollout_id}"
        _current.set(served)
        try:
            result = self.agent(item["scenario"], served.rollout_id)
            if inspect.isawaitable(result):
                result = await result
            await self.post(f"{end}/finish", {"result": to_json_value(result)}, served.token)
            self.summary.rollouts_finished += 1
        except asyncio.CancelledError:  # stopped by us: the slot is given back
            failure = {"error": {"type": "CancelledError", "message": "the worker stopped it"}}
            await asyncio.shield(self._end_quietly(f"{end}/fail", failure, served.token))
            self.summary.released += 1
            raise
        except ServerRefused as exc:
            self._refused(exc, item)
        except Exception as exc:  # the agent raised: recorded as failed
            failure = {"error": {"type": type(exc).__name__, "message": _first_line(exc)}}
            try:
                await self.post(f"{end}/fail", failure, served.token)
                self.summary.rollouts_failed += 1
            except ServerRefused as refused:
                self._refused(refused, item)
            except httpx.TransportError:
                self._note(f"rollout {served.rollout_id}: the server is away; its lease runs out")

    def _refused(self, exc: ServerRefused, item: dict[str, Any]) -> None:
        if exc.status == 409:  # fenced: the lease expired, or another worker took the slot
            self.summary.leases_lost += 1
            log.warning("worker %s: lease lost on %s: %s", self.id, item["rollout_id"], exc)
        else:
            self._note(f"rollout {item['rollout_id']}: {exc}")

    async def _end_quietly(self, url: str, body: dict[str, Any], token: str) -> None:
        # Lost already, or the server is away: the lease runs out.
        with contextlib.suppress(ServerRefused, httpx.TransportError):
            await self.post(url, body, token)

    async def _seal(self, item: dict[str, Any]) -> None:
        claim = item["claim"]
        where = f"group {claim['group_id']}"
        body: dict[str, Any] = {"seal": claim, "rollout_ids": item["rollout_ids"]}
        try:
            if item["policy"]:
                trajectories = _trajectories(item["trajectories"])
                assert self.reward is not None
                body["rewards"] = await call_reward_function(
                    self.reward, item["scenario"], item["results"], trajectories, where
                )
            await self.post(f"{self.claims_url}/seal", body)
            self.summary.groups_sealed += 1
        except RewardFunctionError as exc:
            await self.post(f"{self.claims_url}/seal", {"seal": claim, "error": str(exc)})
            self.summary.groups_failed += 1
        except ServerRefused as exc:
            if exc.status == 409:
                self.summary.leases_lost += 1
            self._note(f"seal of {where}: {exc}")
        except asyncio.CancelledError:
            await asyncio.shield(self._give_back_seal(claim))
            raise

    async def _give_back_seal(self, claim: dict[str, Any]) -> None:
        with contextlib.suppress(ServerRefused, httpx.TransportError):
            await self.post(f"{self.claims_url}/release", {"seal": claim})

    def _note(self, message: str) -> None:
        log.warning("worker %s: %s", self.id, message)
        if len(self.summary.errors) < 20:
            self.summary.errors.append(message.splitlines()[0] if message else message)


class Heartbeat:
    """Renews the worker's leases from a thread of its own, as database workers do, so
    that an agent that blocks the event loop does not cost its worker the leases."""

    def __init__(self, worker: RemoteWorker, loop: asyncio.AbstractEventLoop) -> None:
        self.worker, self.loop = worker, loop
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="artstore-heartbeat", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        self._thread.join(timeout=30)

    def _beat(self) -> None:
        worker = self.worker
        with httpx.Client(timeout=worker.lease_s, headers=worker.headers) as http:
            while not self._stopped.wait(worker.lease_s / 3):
                try:
                    held = list(worker.tasks.values())
                except RuntimeError:  # the loop changed the tasks meanwhile: next beat
                    continue
                if not held:
                    continue
                body = {
                    "lease_s": worker.lease_s,
                    "rollouts": [claim for kind, claim in held if kind == "rollout"],
                    "seals": [claim for kind, claim in held if kind == "seal"],
                }
                try:
                    lost = _answer(http.post(f"{worker.claims_url}/renew", json=body))
                except (ServerRefused, httpx.TransportError) as exc:
                    log.warning("heartbeat: %s; retrying", _first_line(exc))
                    continue
                for kind in ("rollout", "seal"):
                    for claim in lost[f"lost_{kind}s"]:
                        self.loop.call_soon_threadsafe(worker.on_lost, kind, claim)


def _answer(response: httpx.Response) -> dict[str, Any]:
    try:
        body = response.json()
    except ValueError:
        body = {}
    if response.status_code >= 400:
        error = body.get("error") if isinstance(body, dict) else None
        error = error if isinstance(error, dict) else {}
        raise ServerRefused(
            response.status_code,
            str(error.get("code", "error")),
            str(error.get("message", response.text[:200])),
        )
    return body


def _trajectories(stored: list[dict[str, Any]]) -> list[Any]:
    """The group's trajectories as the reward function of a trainer gets them."""
    return [trajectory_class().model_validate(value) for value in stored]


async def _wait(stop: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), timeout=seconds)


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]
