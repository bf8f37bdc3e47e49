"""A rollout worker: claims a run's rollouts and seals from PostgreSQL, runs them, records them.

    summary = await run_worker(store, "email/agent-001", agent, concurrency=8)

A worker is a plain process (`artstore worker RUN --agent module:function`), started by
any scheduler on any host, as many as wanted, joining and leaving at any time. It:

1. reads what the run's trainer registered (`worker_runs`): the model's inference URL and
   name, its current policy step, the off-policy bound, the reward function's import path,
   and the identity of the trainer's database, which must be its own;
2. claims open rollout slots (lowest batch first, within the off-policy bound) and groups
   ready to seal, up to `concurrency` at a time, and renews its leases with a heartbeat;
3. runs the agent for each claimed slot inside `store.rollout(...)`, whose end is written
   only if the lease still holds (fencing), and seals groups whose last rollout ended
   (rewards by the reward function, then `rewards.recorded` + `group.sealed` in one
   append, again fenced);
4. sleeps on the run's notifications (with a timeout as a safety net, and a wakeup when
   the next lease of another worker expires) when there is nothing to claim;
5. returns when the trainer finished the run, or when `stop` is set (its rollouts in
   flight are stopped and their slots given back). A run that failed is waited for as a
   run not registered yet is (`wait_for_run_s`): its trainer, started again, reopens it
   and the worker carries on; else the worker returns.

A worker that dies loses its leases: after they expire another worker claims the slots,
records the dead worker's rollouts as abandoned, and rolls them out again, each resuming
the one it replaces (`artstore.capture.replay`: the calls it had answered are served back
while the agent's requests match them). A worker that
lost a lease (paused, cut off from the database) is refused by the database when it tries
to end what it claimed; its heartbeat notices too, and stops those rollouts.

The inference API key is never stored: a worker takes it from its caller (`api_key`,
`$ARTSTORE_INFERENCE_API_KEY` on the command line).
"""

from __future__ import annotations

import asyncio
import copy
import inspect
import logging
import os
import secrets
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from artstore.capture.rollout import rollout_stream, to_json_value
from artstore.errors import (
    ArtstoreError,
    ConfigurationError,
    DatabaseUnavailableError,
    LeaseLostError,
    NotFoundError,
    RewardFunctionError,
    WrongExpectedVersionError,
)
from artstore.events import RolloutFailed, RunStarted
from artstore.eventstore.database import connect
from artstore.groups import GroupPlace, group_rollouts, seal_group
from artstore.workers import claims
from artstore.workers.claims import RolloutClaim, SealClaim
from artstore.workers.notify import Wakeups

if TYPE_CHECKING:
    from artstore.store import Store

log = logging.getLogger("artstore.workers")

AgentFunction = Callable[[Any, str], Any]
RewardFunction = Callable[[Any, list[Any], list[Any]], Any]

# Longest sleep without a notification: a safety net for one lost with a connection.
SAFETY_NET_S = 5.0
# How long a worker waits for the run's trainer to register the run, by default.
WAIT_FOR_RUN_S = 60.0
ENDED = {RolloutFailed.type, "rollout.finished"}


@dataclass
class WorkerSummary:
    """What one worker did."""

    worker: str
    run: str
    run_status: str = "open"  # the run's status when the worker stopped
    rollouts_finished: int = 0
    rollouts_failed: int = 0  # the agent raised: recorded as failed, left out of the group
    groups_sealed: int = 0
    groups_failed: int = 0  # no policy rollout finished, or the reward function raised
    abandoned: int = 0  # rollouts of dead or stalled workers recorded as abandoned
    leases_lost: int = 0  # claims the database took back: their writes were refused
    released: int = 0  # claims given back after an error (database away, stopping)
    errors: list[str] = field(default_factory=list)  # the first few, one line each


@dataclass(frozen=True)
class InferenceModel:
    """What a rollout records and an agent calls: the model's name and how to reach it."""

    name: str
    project: str | None
    inference_base_url: str | None
    inference_model_name: str | None
    inference_api_key: str | None = field(default=None, repr=False)  # never stored


def worker_id() -> str:
    """`host:pid:random`: unique per worker process, readable in the claims tables."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


async def run_worker(
    store: Store,
    run: str,
    agent: AgentFunction,
    reward: RewardFunction | None = None,
    *,
    concurrency: int = 4,
    lease_s: float = 30.0,
    api_key: str | None = None,
    validation_api_key: str | None = None,
    inference_base_url: str | None = None,
    wait_for_run_s: float = WAIT_FOR_RUN_S,
    stop: asyncio.Event | None = None,
) -> WorkerSummary:
    """Work on `run` until its trainer finishes it (or `stop` is set); see the module.

    `agent(scenario, rollout_id)` is the agent `TrainingFramework` takes; it gets the
    scenario as stored (JSON). `reward(scenario, results, trajectories)` scores a group;
    by default the reward function the trainer registered (when it is importable by name).
    `api_key` (`validation_api_key`) is the inference key of the policy (validation)
    model; `inference_base_url` replaces the URL the trainer registered (when workers
    reach the inference server at another address than the trainer does).
    """
    worker = Worker(
        store,
        run,
        agent,
        reward,
        concurrency=concurrency,
        lease_s=lease_s,
        api_keys={"policy": api_key, "validation": validation_api_key or api_key},
        inference_base_url=inference_base_url,
        stop=stop,
    )
    return await worker.run(wait_for_run_s)


class Worker:
    """One worker process's loop (use `run_worker`)."""

    def __init__(
        self,
        store: Store,
        run: str,
        agent: AgentFunction,
        reward: RewardFunction | None,
        *,
        concurrency: int,
        lease_s: float,
        api_keys: dict[str, str | None],
        inference_base_url: str | None,
        stop: asyncio.Event | None,
    ) -> None:
        claims.require_postgres(store.database, "rollout workers")
        if not callable(agent):
            raise ConfigurationError(f"the agent must be callable, got {agent!r}")
        if reward is not None and not callable(reward):
            raise ConfigurationError(f"the reward function must be callable, got {reward!r}")
        if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
            raise ConfigurationError(f"concurrency must be a positive number, got {concurrency!r}")
        if not lease_s > 0:
            raise ConfigurationError(f"the lease must be positive, got {lease_s!r} s")
        self.store = store
        self.database = store.database
        self.run_name = run
        self.agent = agent
        self.reward = reward
        self.concurrency = concurrency
        self.lease_s = float(lease_s)
        self.api_keys = api_keys
        self.inference_base_url = inference_base_url
        self.stop = stop or asyncio.Event()
        self.wait_for_run_s = WAIT_FOR_RUN_S  # for a run to be registered, or resumed
        self.id = worker_id()
        self.summary = WorkerSummary(worker=self.id, run=run)
        self.started: RunStarted | None = None  # the run's configuration: scenarios, scorer
        self.registered: claims.RunRegistration | None = None
        self._rollouts: dict[asyncio.Task[None], RolloutClaim] = {}
        self._seals: dict[asyncio.Task[None], SealClaim] = {}
        self._heartbeat = Heartbeat(self.lease_s, self._on_lost)
        self._counted_lost: set[tuple[Any, ...]] = set()  # claims counted in `leases_lost`
        self._wakeups: Wakeups | None = None
        store.redact.add([key for key in api_keys.values()])

    # --- the loop ---------------------------------------------------------------------

    async def run(self, wait_for_run_s: float) -> WorkerSummary:
        self.wait_for_run_s = wait_for_run_s
        async with Wakeups(self.database, self.run_name) as wakeups:
            self._wakeups = wakeups
            self.registered = await self._wait_for_registration(wait_for_run_s)
            await claims.check_same_database(self.database, self.registered)
            self._check_models(self.registered)
            if self.reward is None:
                self.reward = registered_reward(self.registered)
            self.started = await _run_started(self.store, self.run_name)
            log.info("worker %s: working on run %s", self.id, self.run_name)
            self._heartbeat.start(self.database.url, asyncio.get_running_loop())
            stopping = asyncio.create_task(self.stop.wait())
            stopping.add_done_callback(lambda _: wakeups.poke("stop"))
            try:
                await self._work(wakeups)
            finally:
                stopping.cancel()
                await self._stop_tasks()
                await asyncio.to_thread(self._heartbeat.stop)
        log.info("worker %s: %s", self.id, self.summary)
        return self.summary

    async def _work(self, wakeups: Wakeups) -> None:
        failures = 0
        while not self.stop.is_set():
            free = self.concurrency - len(self._rollouts) - len(self._seals)
            try:
                claimed = await claims.claim_work(
                    self.database, self.run_name, self.id, free, self.lease_s
                )
                failures = 0
            except DatabaseUnavailableError as exc:  # the database is away: try again soon
                failures += 1
                self._note(f"database unavailable: {exc}")
                await asyncio.sleep(min(0.1 * 2**failures, 2.0))
                continue
            registered = claimed.registration
            if registered is None:
                raise NotFoundError(f"run {self.run_name!r} is no longer registered")
            self.registered = registered
            for seal in claimed.seals:
                self._start(self._seal(seal), self._seals, seal)
            for slot in claimed.rollouts:
                self._start(self._rollout(slot), self._rollouts, slot)
            if registered.status != "open":
                self.summary.run_status = registered.status
                if not self._rollouts and not self._seals:
                    if registered.status == "finished" or not await self._wait_for_resume():
                        return
                    continue
            # Asked for `free`: whatever was missing is not there now. Wait for a task of
            # ours to end, a notification, or the next lease of another worker to expire.
            await wakeups.wait(await self._idle_timeout())

    def _start(self, work: Any, tasks: dict[asyncio.Task[None], Any], claim: Any) -> None:
        task = asyncio.create_task(work)
        tasks[task] = claim
        self._heartbeat.hold(claim)

        def done(finished: asyncio.Task[None]) -> None:
            tasks.pop(finished, None)
            self._heartbeat.drop(claim)
            if self._wakeups is not None:
                self._wakeups.poke("done")

        task.add_done_callback(done)

    def _on_lost(self, claim: RolloutClaim | SealClaim) -> None:
        """The heartbeat found a lease lost: stop what this worker does under it."""
        for task, held in [*self._rollouts.items(), *self._seals.items()]:
            if held is claim:
                self._count_lost(claim, None)
                task.cancel()

    async def _idle_timeout(self) -> float:
        """Until the next notification, the next lease that expires, or the safety net."""
        if len(self._rollouts) + len(self._seals) >= self.concurrency:
            return SAFETY_NET_S  # woken when a task of ours finishes
        try:
            expiry = await claims.seconds_to_next_expiry(self.database, self.run_name)
        except DatabaseUnavailableError:
            return 0.5
        if expiry is None:
            return SAFETY_NET_S
        return min(SAFETY_NET_S, max(0.05, expiry + 0.05))

    async def _stop_tasks(self) -> None:
        tasks = [*self._rollouts, *self._seals]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    # --- one rollout ------------------------------------------------------------------

    async def _rollout(self, claim: RolloutClaim) -> None:
        try:
            previous, resumes = claim.previous_rollout_id, None
            if previous is not None and await abandon_rollout(self.store, previous, WORKER_GONE):
                self.summary.abandoned += 1
                resumes = previous  # its answered calls are served back, not paid again
            elif previous is not None and await abandoned_before(self.store, previous):
                resumes = previous
            assert self.started is not None
            scenario = self.started.scenarios[claim.scenario_index]
            async with self.store.rollout(
                self._model(claim),
                scenario=scenario,
                run=claim.run,
                group_id=claim.group_id,
                scenario_index=claim.scenario_index,
                role=claim.role,  # type: ignore[arg-type]
                policy_step=claim.policy_step if claim.role == "policy" else None,
                rollout_id=claim.rollout_id,
                check=claims.rollout_check(claim),
                resumes=resumes,
            ) as recorder:
                result = self.agent(copy.deepcopy(scenario), recorder.id)
                if inspect.isawaitable(result):
                    result = await result
                recorder.result = to_json_value(result)
            self.summary.rollouts_finished += 1
        except BaseException as exc:  # cancellation included: the task is ours to end
            await self._after_failed_rollout(claim, exc)
            if not isinstance(exc, Exception | asyncio.CancelledError):
                raise

    async def _after_failed_rollout(self, claim: RolloutClaim, exc: BaseException) -> None:
        """Give the slot back if its end was not recorded; count what happened."""
        try:
            outcome = await claims.release_rollout(self.database, claim)
        except DatabaseUnavailableError:
            outcome = "unknown"  # the lease runs out instead
        if outcome == "lost" or (outcome == "unknown" and _lease_lost(exc)):
            self._count_lost(claim, exc)
        elif outcome in ("released", "unknown"):
            self.summary.released += 1
            self._note(f"rollout {claim.rollout_id} given back: {type(exc).__name__}: {exc}")
        elif isinstance(exc, asyncio.CancelledError):
            self.summary.released += 1  # stopped by us: its end reopened the slot
        else:  # the agent raised; the rollout is recorded as failed
            self.summary.rollouts_failed += 1
            log.warning(
                "worker %s: rollout %s failed: %s: %s",
                self.id,
                claim.rollout_id,
                type(exc).__name__,
                _first_line(exc),
            )

    def _count_lost(self, claim: RolloutClaim | SealClaim, exc: BaseException | None) -> None:
        """One lease lost, counted once (by the heartbeat or by a refused write)."""
        key = (claim.group_id, getattr(claim, "slot", None), claim.token)
        if key in self._counted_lost:
            return
        self._counted_lost.add(key)
        self.summary.leases_lost += 1
        reason = _first_line(exc) if exc is not None else "the heartbeat found it lost"
        log.warning("worker %s: lease lost on %s: %s", self.id, claim, reason)

    def _model(self, claim: RolloutClaim) -> InferenceModel:
        assert self.registered is not None
        settings = self.registered.models[claim.role]
        return InferenceModel(
            name=settings["name"],
            project=settings.get("project"),
            inference_base_url=self.inference_base_url or settings.get("inference_base_url"),
            inference_model_name=settings.get("inference_model_name"),
            inference_api_key=self.api_keys.get(claim.role),
        )

    # --- one seal ---------------------------------------------------------------------

    async def _seal(self, claim: SealClaim) -> None:
        assert self.started is not None and self.reward is not None
        place = GroupPlace(
            claim.group_id, claim.run, claim.epoch, claim.batch, claim.scenario_index
        )
        try:
            done = await group_rollouts(self.store, claim.group_id)
            if done.running:  # attempts whose claims moved on: their writers are gone
                for rollout_id in done.running:
                    if await abandon_rollout(self.store, rollout_id, WORKER_GONE):
                        self.summary.abandoned += 1
                done = await group_rollouts(self.store, claim.group_id)
            if not done.policy:
                await claims.fail_seal(
                    self.database,
                    claim,
                    f"RolloutsFailedError: {place}: every policy rollout failed (recorded, "
                    "with their tracebacks)",
                )
                self.summary.groups_failed += 1
                return
            try:
                await seal_group(
                    self.store,
                    place,
                    done,
                    scenario=self.started.scenarios[claim.scenario_index],
                    reward_function=self.reward,
                    scorer=self.started.scorer,
                    condition=claims.seal_check(claim),
                )
            except RewardFunctionError as exc:
                await claims.fail_seal(self.database, claim, f"RewardFunctionError: {exc}")
                self.summary.groups_failed += 1
                return
            self.summary.groups_sealed += 1
        except BaseException as exc:
            await self._after_failed_seal(claim, exc)
            if not isinstance(exc, Exception | asyncio.CancelledError):
                raise

    async def _after_failed_seal(self, claim: SealClaim, exc: BaseException) -> None:
        try:
            outcome = await claims.release_seal(self.database, claim)
        except DatabaseUnavailableError:
            outcome = "unknown"
        if outcome == "lost" or (outcome == "unknown" and _lease_lost(exc)):
            self._count_lost(claim, exc)
        elif outcome in ("released", "unknown") and not isinstance(exc, asyncio.CancelledError):
            self.summary.released += 1
            self._note(f"seal of group {claim.group_id} given back: {type(exc).__name__}: {exc}")

    # --- starting ---------------------------------------------------------------------

    async def _wait_for_registration(self, wait_s: float) -> claims.RunRegistration:
        assert self._wakeups is not None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_s
        while True:
            found = await claims.registration(self.database, self.run_name)
            if found is not None:
                return found
            left = deadline - loop.time()
            if left <= 0 or self.stop.is_set():
                raise NotFoundError(
                    f"no trainer has registered run {self.run_name!r} for workers in "
                    f"{self.database.display_url} (waited {wait_s:g} s): start its trainer with "
                    "TrainingConfig(rollouts='workers') on this database"
                )
            await self._wakeups.wait(min(left, SAFETY_NET_S))

    async def _wait_for_resume(self) -> bool:
        """The run failed: wait for its trainer to start it again (it then reopens the run),
        as long as a worker waits for a run to be registered. Whether it was reopened.

        A trainer resumed after a failure (by hand, or by its scheduler's restart policy)
        finds its workers still there; a run nobody resumes lets them go.
        """
        assert self._wakeups is not None and self.registered is not None
        log.warning(
            "worker %s: run %s failed: %s; waiting up to %g s for its trainer to resume it",
            self.id,
            self.run_name,
            self.registered.error,
            self.wait_for_run_s,
        )
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.wait_for_run_s
        while not self.stop.is_set() and (left := deadline - loop.time()) > 0:
            await self._wakeups.wait(min(left, SAFETY_NET_S))
            found = await claims.registration(self.database, self.run_name)
            if found is not None and found.status != "failed":
                log.info("worker %s: run %s is %s again", self.id, self.run_name, found.status)
                return True
        return False

    def _check_models(self, registered: claims.RunRegistration) -> None:
        for role, settings in registered.models.items():
            if settings is None:
                continue
            if settings.get("url_redacted") and not self.inference_base_url:
                raise ConfigurationError(
                    f"the {role} model's inference URL holds a secret, so it was not stored: "
                    "give the worker the URL (--inference-url, $ARTSTORE_INFERENCE_BASE_URL)"
                )
            if settings.get("needs_api_key") and not self.api_keys.get(role):
                variable = (
                    f"ARTSTORE_{'VALIDATION' if role == 'validation' else 'INFERENCE'}_API_KEY"
                )
                raise ConfigurationError(
                    f"the {role} model ({settings.get('name')}) needs an inference API key, "
                    f"which is never stored: give it to the worker (${variable})"
                )

    def _note(self, message: str) -> None:
        log.warning("worker %s: %s", self.id, message)
        if len(self.summary.errors) < 20:
            self.summary.errors.append(message.splitlines()[0] if message else message)


class Heartbeat:
    """Renews a worker's leases from a thread of its own, on a connection of its own.

    So an agent that blocks the event loop for a while (a synchronous tool, a slow first
    import) does not cost its worker the leases; a paused, killed or cut-off process still
    loses them, as it should. Lost claims are handed to `on_lost` on the worker's loop.
    """

    def __init__(self, lease_s: float, on_lost: Callable[[Any], None]) -> None:
        self.lease_s = lease_s
        self.on_lost = on_lost
        self._held: dict[int, RolloutClaim | SealClaim] = {}
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None

    def hold(self, claim: RolloutClaim | SealClaim) -> None:
        with self._lock:
            self._held[id(claim)] = claim

    def drop(self, claim: RolloutClaim | SealClaim) -> None:
        with self._lock:
            self._held.pop(id(claim), None)

    def start(self, url: Any, loop: asyncio.AbstractEventLoop) -> None:
        self._thread = threading.Thread(
            target=lambda: asyncio.run(self._beat(url, loop)),
            name="artstore-heartbeat",
            daemon=True,
        )
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        if self._thread is not None:
            self._thread.join(timeout=30)

    async def _beat(self, url: Any, loop: asyncio.AbstractEventLoop) -> None:
        database = connect(url)  # engines of this thread's own loop
        try:
            while not self._stopped.wait(self.lease_s / 3):
                with self._lock:
                    held = list(self._held.values())
                rollouts = [c for c in held if isinstance(c, RolloutClaim)]
                seals = [c for c in held if isinstance(c, SealClaim)]
                if not held:
                    continue
                try:
                    lost = await claims.renew(database, rollouts, seals, self.lease_s)
                except DatabaseUnavailableError as exc:
                    log.warning("heartbeat: database unavailable (%s); retrying", exc)
                    continue
                for claim in [*lost[0], *lost[1]]:
                    self.drop(claim)
                    loop.call_soon_threadsafe(self.on_lost, claim)
        finally:
            await database.dispose()


WORKER_GONE = (
    "its worker's lease expired before the rollout ended (the worker died, stalled or lost "
    "the database) or it gave the rollout back; another worker rolled it out again"
)


async def abandoned_before(store: Store, rollout_id: str) -> bool:
    """Whether `rollout_id` ended abandoned: a slot's claim that abandoned it was lost
    before its own rollout started, and the claim kept it for the next to resume
    (`RolloutClaim.previous_rollout_id`)."""
    recorded = await store.read_stream(rollout_stream(rollout_id))
    return bool(recorded) and recorded[-1].data.get("error_type") == "RolloutAbandoned"


async def abandon_rollout(store: Store, rollout_id: str, reason: str) -> bool:
    """Record `rollout_id` as abandoned unless its stream has ended; True if recorded.

    Its old writer may still append (a paused worker that woke up): a conflict is read
    again and retried, and the abandonment is one more event at the stream's end.
    """
    for _ in range(100):
        recorded = await store.read_stream(rollout_stream(rollout_id))
        if not recorded or recorded[-1].type in ENDED:
            return False
        duration = (recorded[-1].recorded_at - recorded[0].recorded_at).total_seconds()
        try:
            await store.append(
                rollout_stream(rollout_id),
                [
                    RolloutFailed(
                        rollout_id=rollout_id,
                        error_type="RolloutAbandoned",
                        error_message=reason,
                        traceback="",
                        duration_s=duration,
                    )
                ],
                expected_version=recorded[-1].version,
            )
            return True
        except WrongExpectedVersionError:
            await asyncio.sleep(0.01)
    raise ArtstoreError(f"rollout {rollout_id}: its stream kept moving; could not abandon it")


async def _run_started(store: Store, run: str) -> RunStarted:
    recorded = await store.read_stream(f"run-{run}", limit=1)
    if not recorded:
        raise NotFoundError(f"no run {run!r} in {store.database.display_url}")
    started = recorded[0].decode()
    if not isinstance(started, RunStarted):
        raise NotFoundError(f"run {run!r} was imported, not trained: workers cannot roll it out")
    return started


def registered_reward(registered: claims.RunRegistration) -> RewardFunction:
    spec = registered.reward_function
    if not spec:
        raise ConfigurationError(
            f"run {registered.run!r}'s reward function cannot be imported by name (it is "
            "defined in a script or a closure): give the worker one (--reward module:function)"
        )
    import importlib

    module_name, _, qualname = spec.partition(":")
    try:
        value: Any = importlib.import_module(module_name)
        for part in qualname.split("."):
            value = getattr(value, part)
    except (ImportError, AttributeError) as exc:
        raise ConfigurationError(
            f"run {registered.run!r}'s reward function {spec} cannot be imported here ({exc}): "
            "install the trainer's code on this host, or give --reward module:function"
        ) from None
    return value


def _lease_lost(exc: BaseException) -> bool:
    """Whether `exc`, or what it was raised from, is a refusal by the fence."""
    seen = 0
    current: BaseException | None = exc
    while current is not None and seen < 10:
        if isinstance(current, LeaseLostError):
            return True
        current = current.__cause__ or current.__context__
        seen += 1
    return False


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__
