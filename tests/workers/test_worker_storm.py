"""Nothing lost, nothing twice: 4 workers and a trainer under kills, a pause and a cut-off.

Real processes on this machine (loopback only): a trainer in workers mode and 4 rollout
workers (tests/support/worker_storm.py, forked from a forkserver that imported ART once), an
inference server in this process with a fixed latency, and PostgreSQL. While the run
trains, the test

- SIGKILLs random workers, and every fifth time the trainer, and starts them again (12
  kills in all; 32 under ARTSTORE_LONG=1);
- pauses a worker that holds claims with SIGSTOP until other workers have claimed its
  slots again (its leases expired), then resumes it: the database must refuse what it
  tries to end (fencing), and it must go on working;
- terminates every PostgreSQL connection of another worker (`pg_terminate_backend`): it
  must reconnect and go on working.

Then every scenario's groups of every epoch are sealed and complete, no group was
consumed twice (the store, the train steps and the backend's checkpoints agree), no
finished rollout was lost, every rollout either finished, failed (stopped by its
worker) or was abandoned and redone, and each redone rollout resumed the one it replaced:
the answers that one had recorded were served back, none paid for again.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import os
import random
import signal
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import worker_storm as storm
from budget import budget
from matrix.invariants import no_recorded_call_paid_twice
from sqlalchemy import bindparam, select, text
from training_helpers import assert_consistent, rows
from waiting import eventually

import artstore
from artstore.backends import CheckOnlyBackend
from artstore.groups import group_id_for
from artstore.schema import tables as t
from artstore.testing.inference_server import LocalInferenceServer

WORKERS = 4
MIN_KILLS = budget(12, 32)
LEASE_S = 1.5
LATENCY_S = 0.1
# What the storm waits for (a first group, a takeover) comes within seconds; minutes on a
# machine busy with other work, which must not fail the test.
PATIENCE_S = 300


@pytest.fixture(scope="module")
def processes() -> Any:
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(
        [
            "worker_storm",
            "art",
            "art.langgraph",
            "langchain_openai",
            "artstore.store",
            "artstore.training",
            "artstore.workers",
            "artstore.backends",
        ]
    )
    return context


class Storm:
    """The processes of one storm, started again as they are killed."""

    def __init__(self, processes: Any, url: str, workdir: Path, server: LocalInferenceServer):
        self.processes = processes
        self.url = url
        self.workdir = workdir
        self.server = server
        self.trainer: Any = None
        self.workers: list[Any] = [None] * WORKERS
        self.started = 0
        self.kills = Counter()

    def _log(self, name: str) -> str:
        self.started += 1
        return str(self.workdir / f"{self.started:03d}-{name}.log")

    def start_trainer(self) -> None:
        args = (self.url, str(self.workdir), self.server.base_url, self.server.api_key)
        self.trainer = self.processes.Process(
            target=storm.trainer, args=(*args, self._log("trainer"))
        )
        self.trainer.start()

    def start_worker(self, slot: int) -> None:
        summary = self.workdir / f"summary-{self.started + 1:03d}.json"
        process = self.processes.Process(
            target=storm.worker,
            args=(self.url, self.server.api_key, LEASE_S, str(summary), self._log("worker")),
        )
        process.start()
        process.summary_path = summary  # type: ignore[attr-defined]
        self.workers[slot] = process

    async def kill(self, process: Any, kind: str) -> None:
        if process.is_alive():
            os.kill(process.pid, signal.SIGKILL)
            self.kills[kind] += 1
        await asyncio.to_thread(process.join)

    def logs(self) -> str:
        return "\n".join(
            f"--- {path.name}\n{path.read_text()[-3000:]}"
            for path in sorted(self.workdir.glob("*.log"))
        )


def socket_ports(pid: int) -> set[int]:
    """Local TCP ports of the sockets process `pid` holds (from /proc: no extra package)."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[len("socket:[") : -1])
    ports = set()
    for table in ("tcp", "tcp6"):
        lines = Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
        for line in lines:
            fields = line.split()
            if fields[9] in inodes:
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


async def held_claims(store: artstore.Store, pid: int) -> list[Any]:
    return await rows(
        store,
        t.rollout_claims,
        t.rollout_claims.c.status == "claimed",
        t.rollout_claims.c.worker.like(f"%:{pid}:%"),
    )


async def finished_by(store: artstore.Store, pid: int) -> int:
    return len(
        await rows(
            store,
            t.rollout_claims,
            t.rollout_claims.c.status == "finished",
            t.rollout_claims.c.worker.like(f"%:{pid}:%"),
        )
    )


@pytest.mark.slow
async def test_workers_and_trainer_survive_kills_a_pause_and_a_cut_connection(
    postgres_url: str, tmp_path: Path, processes: Any
) -> None:
    rng = random.Random(20261201)
    async with (
        LocalInferenceServer(latency_s=LATENCY_S) as server,
        await artstore.open_store(postgres_url) as store,
    ):
        storm_ = Storm(processes, postgres_url, tmp_path, server)
        try:
            paused, cut = await run_storm(storm_, store, rng)
        except BaseException:
            print(storm_.logs())
            raise
        finally:
            for process in [storm_.trainer, *storm_.workers]:
                if process is not None and process.is_alive():
                    process.kill()
                    process.join()
        await check(store, storm_, paused, cut)


async def run_storm(
    storm_: Storm, store: artstore.Store, rng: random.Random
) -> tuple[dict[str, Any], dict[str, Any]]:
    storm_.start_trainer()
    await eventually(
        lambda: rows(store, t.worker_runs), "the trainer to register the run", timeout=PATIENCE_S
    )
    for slot in range(WORKERS):
        storm_.start_worker(slot)
    await eventually(lambda: rows(store, t.groups), "a first sealed group", timeout=PATIENCE_S)

    spared: set[int] = set()  # worker slots the chaos leaves alone (paused, cut off)
    paused: dict[str, Any] = {}
    cut: dict[str, Any] = {}
    kills = 0
    while kills < MIN_KILLS:
        if kills == MIN_KILLS // 4:
            paused = await pause_a_worker_past_its_lease(storm_, store, spared)
        if kills == MIN_KILLS // 2:
            cut = await cut_a_worker_off(storm_, store, spared)
        await asyncio.sleep(rng.uniform(0.1, 0.4))
        if kills % 5 == 4:
            await storm_.kill(storm_.trainer, "trainer")
            storm_.start_trainer()
        else:
            slot = await busy_worker(storm_, store, spared, rng)
            await storm_.kill(storm_.workers[slot], "worker")
            storm_.start_worker(slot)
        kills += 1
        assert (await rows(store, t.runs))[0].status == "running", "the run ended before the storm"

    await asyncio.to_thread(storm_.trainer.join, PATIENCE_S)  # the rest of the run, slowly
    assert storm_.trainer.exitcode == 0, "the trainer did not finish"
    for process in storm_.workers:
        await asyncio.to_thread(process.join, PATIENCE_S)
        assert process.exitcode == 0, f"worker {process.pid} exited {process.exitcode}"
    return paused, cut


async def busy_worker(
    storm_: Storm, store: artstore.Store, spared: set[int], rng: random.Random
) -> int:
    """A worker with a rollout in flight (started, not ended), if one shows up soon."""
    slots = [s for s in range(WORKERS) if s not in spared]
    in_flight = (
        select(t.rollout_claims.c.worker)
        .join(t.rollouts, t.rollouts.c.rollout_id == t.rollout_claims.c.rollout_id)
        .where(t.rollout_claims.c.status == "claimed", t.rollouts.c.status == "running")
    )
    for _ in range(50):
        async with store.database.read() as connection:
            busy = {row.worker.split(":")[1] for row in await connection.execute(in_flight)}
        found = [s for s in slots if str(storm_.workers[s].pid) in busy]
        if found:
            return rng.choice(found)
        await asyncio.sleep(0.02)
    return rng.choice(slots)


async def pause_a_worker_past_its_lease(
    storm_: Storm, store: artstore.Store, spared: set[int]
) -> dict[str, Any]:
    """SIGSTOP a worker that holds claims until others claimed them again, then SIGCONT."""
    for _ in range(500):
        candidates = [s for s in range(WORKERS) if s not in spared]
        slot = candidates[_ % len(candidates)]
        process = storm_.workers[slot]
        os.kill(process.pid, signal.SIGSTOP)
        held = await held_claims(store, process.pid)  # what it holds, now that it cannot move
        if held:
            break
        os.kill(process.pid, signal.SIGCONT)
        await asyncio.sleep(0.02)
    assert held, "no worker held a claim to pause"
    spared.add(slot)

    async def taken_over() -> bool:
        now = {(r.group_id, r.slot): r for r in await rows(store, t.rollout_claims)}
        return any(now[(c.group_id, c.slot)].token > c.token for c in held)

    await eventually(
        taken_over, "another worker to claim a paused worker's slot", timeout=PATIENCE_S
    )
    now = {(r.group_id, r.slot): r for r in await rows(store, t.rollout_claims)}
    taken = [c.rollout_id for c in held if now[(c.group_id, c.slot)].token > c.token]
    os.kill(process.pid, signal.SIGCONT)
    return {"process": process, "taken": taken}


async def cut_a_worker_off(
    storm_: Storm, store: artstore.Store, spared: set[int]
) -> dict[str, Any]:
    """Terminate every PostgreSQL connection of a worker, from the server's side."""
    slot = next(s for s in range(WORKERS) if s not in spared)
    process = storm_.workers[slot]
    spared.add(slot)
    await eventually(
        lambda: finished_by(store, process.pid),
        "the worker to finish a rollout",
        timeout=PATIENCE_S,
    )
    ports = socket_ports(process.pid)
    terminate = text(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
        "WHERE datname = current_database() AND client_port IN :ports"
    ).bindparams(bindparam("ports", expanding=True))
    async with store.database.write() as connection:
        terminated = (await connection.execute(terminate, {"ports": sorted(ports)})).all()
    assert terminated, "the worker had no connection to terminate"
    return {"process": process, "finished": await finished_by(store, process.pid)}


async def check(
    store: artstore.Store, storm_: Storm, paused: dict[str, Any], cut: dict[str, Any]
) -> None:
    # A process may be gone already when its turn comes (not counted as a kill).
    assert sum(storm_.kills.values()) >= MIN_KILLS - 2, storm_.kills
    assert storm_.kills["trainer"] >= MIN_KILLS // 5 - 1, storm_.kills
    (run,) = await rows(store, t.runs)
    assert run.status == "finished"

    # Every scenario's group of every epoch is sealed, with exactly its group's rollouts.
    expected = {
        group_id_for(storm.RUN, epoch, index)
        for epoch in range(storm.EPOCHS)
        for index in range(len(storm.SCENARIOS))
    }
    groups = {g.group_id: g for g in await rows(store, t.groups)}
    assert set(groups) == expected
    sealed = {
        e.group_id: e
        for e in (r.decode() for r in await store.read_all(limit=100_000, types=["group.sealed"]))
    }
    rollouts = {r.rollout_id: r for r in await rows(store, t.rollouts)}
    for group_id, event in sealed.items():
        finished = {
            r.rollout_id
            for r in rollouts.values()
            if r.group_id == group_id and r.status == "finished"
        }
        # No finished rollout lost (each is in its group), none counted twice.
        assert set(event.rollout_ids) == finished and len(finished) == storm.GROUP_SIZE

    # Every rollout ended: finished, or failed because its worker stopped it or died
    # (abandoned, and its slot rolled out again: the groups above are complete).
    assert {r.status for r in rollouts.values()} <= {"finished", "failed"}
    failures = Counter(r.error_type for r in rollouts.values() if r.status == "failed")
    assert set(failures) <= {"RolloutAbandoned", "CancelledError"}, failures
    assert failures["RolloutAbandoned"] > 0  # killed workers' rollouts were redone
    # Each redone rollout resumed the one it replaced: the answers that one had recorded
    # were served back from the store, in order, none sent to the server again.
    await no_recorded_call_paid_twice(store)

    # The paused worker's slots were taken over: what it had in flight never finished (it
    # was abandoned, or its start was refused), and its heartbeat or its write found the
    # lease lost, refused by the database.
    for rollout_id in paused["taken"]:
        events = [e.type for e in await store.read_stream(f"rollout-{rollout_id}")]
        assert "rollout.finished" not in events, events
        assert not events or events[-1] == "rollout.failed", events
    paused_summary = json.loads(paused["process"].summary_path.read_text())
    assert paused_summary["leases_lost"] >= 1, paused_summary
    # The cut-off worker reconnected and went on working.
    assert await finished_by(store, cut["process"].pid) > cut["finished"]

    # No group consumed twice: the consumptions, the train steps and the backend agree.
    consumptions = await rows(store, t.group_consumptions)
    assert Counter(c.group_id for c in consumptions) == Counter(expected)
    steps = await rows(store, t.train_steps)
    completed = sorted((s for s in steps if s.status == "completed"), key=lambda s: s.step)
    num_steps = storm.EPOCHS * len(storm.SCENARIOS) // storm.BATCH_SIZE
    assert [s.step for s in completed] == list(range(1, num_steps + 1))
    assert not [s for s in steps if s.status == "started"]
    for step in completed:
        assert {groups[g].batch for g in step.group_ids} == {step.step - 1}
    backend = CheckOnlyBackend(path=storm_.workdir / "art")
    model = artstore_model()
    in_checkpoints = Counter()
    for step in completed:
        record = backend.read_checkpoint(model, step.step)
        in_checkpoints.update(m["group_id"] for m in record["group_metadata"])
    assert in_checkpoints == Counter(expected)

    # Within the off-policy bound: a rollout is trained at most that many steps late.
    step_before = {g: s.step_before for s in completed for g in s.group_ids}
    for r in rollouts.values():
        if r.status == "finished":
            late = step_before[r.group_id] - r.policy_step
            assert 0 <= late <= storm.MAX_STEPS_OFF_POLICY, (r.rollout_id, late)

    types = Counter(
        e.type for e in await store.read_all(limit=100_000, types=["run.resumed", "run.started"])
    )
    assert types["run.started"] == 1 and types["run.resumed"] >= 1
    async with store.database.read() as connection:
        open_claims = (
            await connection.execute(
                select(t.rollout_claims.c.status).where(
                    t.rollout_claims.c.status.in_(("open", "claimed"))
                )
            )
        ).all()
    assert not open_claims
    await assert_consistent(store)


def artstore_model() -> Any:
    import art

    return art.TrainableModel(
        name=storm.MODEL_NAME,
        run_name=storm.MODEL_NAME,
        project=storm.PROJECT,
        base_model="test-base",
    )
