"""Rollout workers coordinated through PostgreSQL: claims, leases, fencing, refusals, training.

The claims are exercised directly (two claimers, an expired lease, a stale writer) and
through whole runs: a trainer in workers mode with workers in the same event loop, and
`artstore worker` on the command line. SQLite is refused with a clear message, and so is
a worker on a copy of the trainer's database. The fault storm with real processes is in
tests/workers/test_worker_storm.py.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
import threading
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, text, update
from training_helpers import (
    PROJECT,
    assert_consistent,
    length_reward,
    rows,
    scenarios,
    scripted_agent,
    trainable_model,
    validation_model,
)
from typer.testing import CliRunner

import artstore
from artstore.backends import CheckOnlyBackend
from artstore.cli import app
from artstore.errors import (
    ConfigurationError,
    LeaseLostError,
    NotFoundError,
    WrongDatabaseError,
)
from artstore.events import GroupSealed, RewardsRecorded, RolloutStarted, RunStarted
from artstore.eventstore.records import NO_STREAM
from artstore.groups import group_stream
from artstore.schema import tables as t
from artstore.testing.inference_server import LocalInferenceServer
from artstore.workers import claims, run_worker, sealed_groups, wait_for_groups
from artstore.workers.claims import GroupPlan
from artstore.workers.worker import InferenceModel, abandon_rollout, abandoned_before

RUN = "workers-test/run"
CLAIM_HOLDER = Path(__file__).parents[1] / "support" / "claim_holder.py"
MODEL = "workers-test/model"


async def register(
    store: artstore.Store,
    *,
    batches: list[int],
    group_size: int = 2,
    max_steps_off_policy: int = 0,
    base_url: str | None = None,
) -> list[GroupPlan]:
    """A run registered for workers as a trainer registers it: one group per batch entry."""
    await store.append(
        f"run-{RUN}",
        [
            RunStarted(
                run=RUN,
                project="workers-test",
                model="model",
                config={"rollouts": "workers"},
                scenarios=scenarios(len(batches)),
                scorer="reward",
                trainer="test",
            )
        ],
        expected_version=NO_STREAM,
    )
    groups = [
        GroupPlan(f"g{i}", epoch=0, batch=b, scenario_index=i, policy=group_size)
        for i, b in enumerate(batches)
    ]
    await claims.register_run(
        store.database,
        run=RUN,
        model=MODEL,
        trainer="test",
        models={
            "policy": {
                "name": "model",
                "project": "workers-test",
                "inference_base_url": base_url,
                "inference_model_name": "model@0",
                "needs_api_key": False,
            }
        },
        reward_function="training_helpers:length_reward",
        max_steps_off_policy=max_steps_off_policy,
        policy_step=0,
        next_batch=0,
        groups=groups,
    )
    return groups


async def expire(store: artstore.Store, table: Any, **where: Any) -> None:
    """End a lease now, as if its worker had been silent for longer than the lease."""
    async with store.database.write() as connection:
        await connection.execute(
            update(table)
            .where(*(table.c[name] == value for name, value in where.items()))
            .values(lease_expires_at=func.clock_timestamp() - text("interval '1 second'"))
        )


def model_of(server: LocalInferenceServer | None = None) -> InferenceModel:
    return InferenceModel(
        name="model",
        project="workers-test",
        inference_base_url=server.base_url if server else None,
        inference_model_name="test-model",
        inference_api_key=server.api_key if server else None,
    )


def claimed_rollout(store: artstore.Store, claim: claims.RolloutClaim) -> Any:
    """The policy rollout of a claimed slot, recorded only while the claim's lease holds."""
    return store.rollout(
        model_of(),
        run=RUN,
        group_id=claim.group_id,
        role="policy",
        rollout_id=claim.rollout_id,
        check=claims.rollout_check(claim),
    )


async def end_rollout(store: artstore.Store, claim: claims.RolloutClaim) -> None:
    async with claimed_rollout(store, claim) as rollout:
        rollout.result = "done"


@pytest.fixture
async def pg_store(postgres_url: str):
    async with await artstore.open_store(postgres_url) as store:
        yield store


# --- claims ------------------------------------------------------------------------------


async def test_claimers_share_the_work_without_overlap_within_the_off_policy_bound(pg_store):
    await register(pg_store, batches=[0, 0, 1, 2], max_steps_off_policy=1)
    first, second = await asyncio.gather(
        claims.claim_rollouts(pg_store.database, RUN, "a", 3, 30),
        claims.claim_rollouts(pg_store.database, RUN, "b", 3, 30),
    )
    taken = [(c.group_id, c.slot) for c in [*first, *second]]
    # Batches 0 and 1 (the next batch, 0, plus one): 6 slots, none twice, none of batch 2.
    assert len(taken) == len(set(taken)) == 6
    assert {c.batch for c in [*first, *second]} == {0, 1}
    assert all(c.token == 1 and c.previous_rollout_id is None for c in [*first, *second])
    assert await claims.claim_rollouts(pg_store.database, RUN, "c", 3, 30) == []

    await claims.advance(pg_store.database, RUN, next_batch=1, policy_step=1)
    later = await claims.claim_rollouts(pg_store.database, RUN, "c", 3, 30)
    assert {(c.batch, c.policy_step) for c in later} == {(2, 1)} and len(later) == 2


async def test_an_expired_lease_is_claimed_again_and_the_stale_end_is_refused(pg_store):
    await register(pg_store, batches=[0], group_size=1)
    (stale,) = await claims.claim_rollouts(pg_store.database, RUN, "stale", 1, 30)
    with pytest.raises(LeaseLostError, match="refused to record its end"):
        async with claimed_rollout(pg_store, stale) as rollout:
            await pg_store.flush()  # its start is recorded while the lease holds
            await expire(pg_store, t.rollout_claims, group_id=stale.group_id)
            (fresh,) = await claims.claim_rollouts(pg_store.database, RUN, "fresh", 1, 30)
            rollout.result = "too late"
    assert (fresh.token, fresh.previous_rollout_id) == (stale.token + 1, stale.rollout_id)
    # The stale worker's end was not written: its rollout is still open...
    events = await pg_store.read_stream(f"rollout-{stale.rollout_id}")
    assert [e.type for e in events] == ["rollout.started"]
    # ...until the new claimer records it as abandoned, and rolls out the slot again.
    assert await abandon_rollout(pg_store, stale.rollout_id, "gone")
    assert not await abandon_rollout(pg_store, stale.rollout_id, "gone")  # once
    await end_rollout(pg_store, fresh)
    (slot,) = await rows(pg_store, t.rollout_claims)
    assert (slot.status, slot.rollout_id, slot.attempts) == ("finished", fresh.rollout_id, 2)
    by_id = {r.rollout_id: r for r in await rows(pg_store, t.rollouts)}
    assert by_id[stale.rollout_id].error_type == "RolloutAbandoned"
    assert by_id[fresh.rollout_id].status == "finished"
    (group,) = await rows(pg_store, t.group_claims)
    assert group.status == "sealable"  # its last slot ended


async def test_a_claim_lost_before_its_rollout_started_leaves_its_attempt_to_the_next(pg_store):
    """The attempt a claim abandoned is resumed by the next claim when that claim's own
    rollout never started (its worker stalled past its lease): the chain of resumes holds."""
    database = pg_store.database
    await register(pg_store, batches=[0], group_size=1)
    (first,) = await claims.claim_rollouts(database, RUN, "first", 1, 30)
    with pytest.raises(LeaseLostError):
        async with claimed_rollout(pg_store, first) as rollout:
            await pg_store.flush()  # started: its worker then stalls past its lease
            await expire(pg_store, t.rollout_claims, group_id=first.group_id)
            (lost,) = await claims.claim_rollouts(database, RUN, "lost", 1, 30)
            rollout.result = "too late"
    assert lost.previous_rollout_id == first.rollout_id
    assert await abandon_rollout(pg_store, first.rollout_id, "gone")
    await expire(pg_store, t.rollout_claims, group_id=first.group_id)  # lost never started

    (third,) = await claims.claim_rollouts(database, RUN, "third", 1, 30)
    assert third.previous_rollout_id == first.rollout_id  # not lost's: it names nothing
    assert await abandoned_before(pg_store, first.rollout_id)
    assert not await abandoned_before(pg_store, lost.rollout_id)
    with pytest.raises(LeaseLostError):
        async with claimed_rollout(pg_store, third) as rollout:
            await pg_store.flush()
            await expire(pg_store, t.rollout_claims, group_id=first.group_id)
            (fourth,) = await claims.claim_rollouts(database, RUN, "fourth", 1, 30)
            rollout.result = "too late"
    assert fourth.previous_rollout_id == third.rollout_id  # it started: it is the one to resume


async def test_a_worker_stopped_inside_a_claims_transaction_gives_up_its_slots(
    pg_store, postgres_url: str
):
    # Stopped while its heartbeat's renewal held the rows of its slots locked: the others'
    # claims skip locked rows, so its slots come free only once the server ends its session.
    await register(pg_store, batches=[0], group_size=1)
    (held,) = await claims.claim_rollouts(pg_store.database, RUN, "stopped", 1, 1)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])}
    holder = subprocess.Popen(
        [sys.executable, str(CLAIM_HOLDER), postgres_url, RUN, "stopped"],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        os.kill(holder.pid, signal.SIGSTOP)
        taken: list[claims.RolloutClaim] = []
        for _ in range(600):  # up to a minute; the server ends the session within seconds
            taken = await claims.claim_rollouts(pg_store.database, RUN, "other", 1, 30)
            if taken:
                break
            await asyncio.sleep(0.1)
    finally:
        holder.kill()
        os.kill(holder.pid, signal.SIGCONT)
        holder.wait()
    assert [(c.group_id, c.slot, c.token) for c in taken] == [
        (held.group_id, held.slot, held.token + 1)
    ]


async def test_a_lease_that_expired_is_refused_even_if_nobody_claimed_it(pg_store):
    await register(pg_store, batches=[0, 0], group_size=1)
    started, idle = await claims.claim_rollouts(pg_store.database, RUN, "slow", 2, 30)
    with pytest.raises(LeaseLostError, match="refused to record its end"):
        async with claimed_rollout(pg_store, started) as rollout:
            await pg_store.flush()
            await expire(pg_store, t.rollout_claims, group_id=started.group_id)
            rollout.result = "too late"
    # A rollout whose lease expired before it started is not even started.
    await expire(pg_store, t.rollout_claims, group_id=idle.group_id)
    with pytest.raises(LeaseLostError, match="refused to record its start"):
        await end_rollout(pg_store, idle)
    assert await pg_store.read_stream(f"rollout-{idle.rollout_id}") == []

    lost, _ = await claims.renew(pg_store.database, [started, idle], [], 30)
    assert lost == [started, idle]  # an expired lease is not renewed either
    slots = await rows(pg_store, t.rollout_claims)
    assert {(s.status, s.token) for s in slots} == {("claimed", 1)}  # for the next claimer


async def test_a_start_checked_before_the_append_lock_keeps_its_slot_until_commit(pg_store):
    # The lease is checked before the events' INSERT takes the append lock. While the
    # start waits for that lock its lease runs out: nobody may claim the slot until the
    # start commits (or the new claimer would not know to abandon the started rollout).
    await register(pg_store, batches=[0], group_size=1)
    (stale,) = await claims.claim_rollouts(pg_store.database, RUN, "stale", 1, 2)
    started = RolloutStarted(
        rollout_id=stale.rollout_id,
        run=RUN,
        group_id=stale.group_id,
        model="model",
        started_at=datetime.now(UTC),
    )
    check = claims.rollout_check(stale)
    async with pg_store.database.write() as blocker:
        await blocker.exec_driver_sql("LOCK TABLE append_lock IN EXCLUSIVE MODE")
        start = asyncio.create_task(
            pg_store.append(
                f"rollout-{stale.rollout_id}",
                [started],
                NO_STREAM,
                condition=lambda connection: check(connection, started),
            )
        )
        waiting = text(
            "SELECT count(*) FROM pg_locks WHERE relation = 'append_lock'::regclass AND NOT granted"
        )
        expired = text("SELECT bool_and(lease_expires_at < clock_timestamp()) FROM rollout_claims")
        async with pg_store.database.read() as reader:
            while not (await reader.execute(waiting)).scalar():  # checked, at the INSERT
                await asyncio.sleep(0.02)
            while not (await reader.execute(expired)).scalar():
                await reader.commit()
                await asyncio.sleep(0.1)
        assert not start.done()
        assert await claims.claim_rollouts(pg_store.database, RUN, "fresh", 1, 30) == []
    assert (await start).written  # the blocker committed: the start goes through
    (fresh,) = await claims.claim_rollouts(pg_store.database, RUN, "fresh", 1, 30)
    assert (fresh.token, fresh.previous_rollout_id) == (stale.token + 1, stale.rollout_id)
    events = await pg_store.read_stream(f"rollout-{stale.rollout_id}")
    assert [e.type for e in events] == ["rollout.started"]
    assert await abandon_rollout(pg_store, stale.rollout_id, "gone")


async def test_the_heartbeat_extends_held_leases_and_reports_lost_ones(pg_store):
    await register(pg_store, batches=[0, 0], group_size=1)
    held = await claims.claim_rollouts(pg_store.database, RUN, "w", 2, 30)

    async def expiries() -> dict[str, Any]:
        return {r.group_id: r.lease_expires_at for r in await rows(pg_store, t.rollout_claims)}

    before = await expiries()
    lost, _ = await claims.renew(pg_store.database, held, [], 60)
    after = await expiries()
    assert lost == [] and all(after[g] > before[g] for g in before)

    await expire(pg_store, t.rollout_claims, group_id=held[0].group_id)
    (taken,) = await claims.claim_rollouts(pg_store.database, RUN, "other", 1, 30)
    assert taken.group_id == held[0].group_id
    lost, _ = await claims.renew(pg_store.database, held, [], 60)
    assert lost == [held[0]]


async def test_a_stale_seal_is_refused_by_the_database(pg_store):
    await register(pg_store, batches=[0], group_size=1)
    (claim,) = await claims.claim_rollouts(pg_store.database, RUN, "w", 1, 30)
    await end_rollout(pg_store, claim)
    (stale,) = await claims.claim_seals(pg_store.database, RUN, "stale", 1, 30)
    await expire(pg_store, t.group_claims, group_id=stale.group_id)
    (fresh,) = await claims.claim_seals(pg_store.database, RUN, "fresh", 1, 30)
    assert fresh.token == stale.token + 1

    def seal(by: claims.SealClaim) -> Any:
        return pg_store.append(
            group_stream("g0"),
            [
                RewardsRecorded(group_id="g0", scorer="reward", rewards={claim.rollout_id: 1.0}),
                GroupSealed(group_id="g0", run=RUN, batch=0, rollout_ids=[claim.rollout_id]),
            ],
            expected_version=NO_STREAM,
            condition=claims.seal_check(by),
        )

    with pytest.raises(LeaseLostError, match="refused the write"):
        await seal(stale)
    assert await pg_store.read_stream(group_stream("g0")) == []
    await seal(fresh)
    (group,) = await rows(pg_store, t.group_claims)
    assert group.status == "sealed"
    assert [g.group_id for g in await rows(pg_store, t.groups)] == ["g0"]


# --- refusals ------------------------------------------------------------------------------


async def test_workers_on_sqlite_are_refused_naming_postgresql(tmp_path: Path):
    url = f"sqlite:///{tmp_path / 'artstore.db'}"
    async with await artstore.open_store(url) as store:
        with pytest.raises(ConfigurationError, match="need PostgreSQL") as refused:
            await run_worker(store, RUN, scripted_agent)
        assert len(str(refused.value).splitlines()) == 1
        with LocalInferenceServer() as server:
            model, _ = await trainable_model(tmp_path, server)
            with pytest.raises(ConfigurationError, match=r"need PostgreSQL.*SQLite"):
                await artstore.TrainingFramework(store).run_training(
                    model=model,
                    scenarios=scenarios(2),
                    agent_function=scripted_agent,
                    reward_function=length_reward,
                    config=artstore.TrainingConfig(
                        epochs=1, batch_size=1, group_size=2, rollouts="workers"
                    ),
                )
        assert await store.read_all() == []  # refused before anything was written


def test_the_worker_command_refuses_sqlite_in_one_line(tmp_path: Path):
    url = f"sqlite:///{tmp_path / 'artstore.db'}"
    result = CliRunner().invoke(
        app, ["worker", RUN, "--agent", "training_helpers:scripted_agent", "--url", url]
    )
    assert result.exit_code == 1
    assert "need PostgreSQL" in result.output and "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1
    assert not (tmp_path / "artstore.db").exists()  # nothing opened, nothing created


async def test_a_worker_on_a_copy_of_the_trainers_database_is_refused(postgres_url: str):
    import psycopg
    from sqlalchemy.engine import make_url

    async with await artstore.open_store(postgres_url) as store:
        await register(store, batches=[0])
    original = make_url(postgres_url)
    copy_url = original.set(database=f"{original.database}_copy")
    admin = original.set(database="postgres", drivername="postgresql").render_as_string(False)
    with psycopg.connect(admin, autocommit=True) as connection:
        connection.execute(f'CREATE DATABASE "{copy_url.database}" TEMPLATE "{original.database}"')
    try:
        async with await artstore.open_store(copy_url.render_as_string(False)) as copied:
            with pytest.raises(WrongDatabaseError, match="another database") as refused:
                await run_worker(copied, RUN, scripted_agent)
            assert "point the worker at the trainer's database" in str(refused.value)
            with pytest.raises(NotFoundError, match="no trainer has registered run 'other'"):
                await run_worker(copied, "other", scripted_agent, wait_for_run_s=0)
    finally:
        with psycopg.connect(admin, autocommit=True) as connection:
            connection.execute(f'DROP DATABASE IF EXISTS "{copy_url.database}" WITH (FORCE)')


# --- waiting for groups ----------------------------------------------------------------------


async def seal_bare_group(store: artstore.Store, group_id: str, run: str = RUN) -> None:
    await store.append(
        group_stream(group_id),
        [
            RewardsRecorded(group_id=group_id, scorer="reward", rewards={}),
            GroupSealed(group_id=group_id, run=run, rollout_ids=[]),
        ],
        expected_version=NO_STREAM,
    )


async def test_wait_for_groups_returns_once_enough_unconsumed_groups_are_sealed(store):
    await seal_bare_group(store, "elsewhere", run="another run")
    waiter = asyncio.create_task(wait_for_groups(store, RUN, MODEL, 2, timeout=60))
    await seal_bare_group(store, "g1")
    with pytest.raises(TimeoutError, match="1 of the 2 sealed groups"):  # one is not two
        await wait_for_groups(store, RUN, MODEL, 2, timeout=0.3)
    assert not waiter.done()
    await seal_bare_group(store, "g2")
    assert await waiter == ["g1", "g2"]

    async with store.database.write() as connection:
        await connection.execute(
            t.group_consumptions.insert().values(
                group_id="g1",
                model=MODEL,
                run=RUN,
                step=1,
                scorer="reward",
                consumed_at=func.now(),
                position=0,
            )
        )
    assert await wait_for_groups(store, RUN, MODEL, 1, timeout=5) == ["g2"]
    assert await wait_for_groups(store, RUN, "another/model", 2, timeout=5) == ["g1", "g2"]
    with pytest.raises(TimeoutError, match="1 of the 2 sealed groups"):
        await wait_for_groups(store, RUN, MODEL, 2, timeout=0.3)

    arrivals = sealed_groups(store, RUN, MODEL, idle_timeout=30)
    assert await anext(arrivals) == "g2"
    later = asyncio.create_task(anext(arrivals))
    await seal_bare_group(store, "g3")
    assert await later == "g3"
    await arrivals.aclose()


# --- whole runs ---------------------------------------------------------------------------


async def test_a_trainer_trains_what_workers_roll_out_within_the_off_policy_bound(
    postgres_url: str, tmp_path: Path
):
    async with LocalInferenceServer(latency_s=0.02) as server:
        model, backend = await trainable_model(tmp_path, server)
        run = f"{PROJECT}/{model.name}"
        config = artstore.TrainingConfig(
            epochs=2,
            batch_size=2,
            group_size=2,
            validation_samples=1,
            rollouts="workers",
            max_steps_off_policy=1,
        )
        async with (
            await artstore.open_store(postgres_url) as store,
            await artstore.open_store(postgres_url) as store_a,
            await artstore.open_store(postgres_url) as store_b,
        ):
            trainer = artstore.TrainingFramework(store).run_training(
                model=model,
                scenarios=scenarios(3),
                agent_function=scripted_agent,
                reward_function=length_reward,
                config=config,
                validation_model=validation_model(server),
            )
            # No worker dies here, so the lease only has to outlast a heartbeat starved by
            # a busy machine: a lost lease would redo a rollout and change the counts below.
            workers = [
                run_worker(
                    s, run, scripted_agent, concurrency=2, lease_s=120, api_key=server.api_key
                )
                for s in (store_a, store_b)
            ]
            summary, *done = await asyncio.gather(trainer, *workers)

            assert summary.steps_trained == [1, 2, 3, 4] and summary.rollouts == 0
            assert sum(w.rollouts_finished for w in done) == 6 * (2 + 1)  # 3 scenarios, 2 epochs
            assert sum(w.groups_sealed for w in done) == 6
            assert all(w.run_status == "finished" for w in done)
            groups = {g.group_id: g for g in await rows(store, t.groups)}
            assert len(groups) == 6 and {(g.size, g.num_validation) for g in groups.values()} == {
                (2, 1)
            }
            consumptions = await rows(store, t.group_consumptions)
            assert Counter(c.group_id for c in consumptions) == Counter(set(groups))
            steps = {s.step: s for s in await rows(store, t.train_steps)}
            for rollout in await rows(store, t.rollouts):
                assert rollout.status == "finished"
                if rollout.role == "validation":
                    assert rollout.policy_step is None
                    continue
                group = groups[rollout.group_id]
                trained_at = steps[group.batch + 1].step_before  # batch b trains step b+1
                assert trained_at - config.max_steps_off_policy <= rollout.policy_step
                assert rollout.policy_step <= trained_at
            (registered,) = await rows(store, t.worker_runs)
            assert (registered.status, registered.policy_step) == ("finished", 4)
            assert registered.models["policy"]["inference_model_name"] == "agent@4"
            assert server.api_key not in str(registered.models)  # keys are never stored
            assert backend._current_step(model) == 4
            await assert_consistent(store)


class FailsOnceBackend(CheckOnlyBackend):
    """A backend whose second `train` call fails, once: the trainer stops on it."""

    failed = False

    async def train(self, model: Any, groups: Any, **kwargs: Any) -> Any:
        if self._current_step(model) == 1 and not self.failed:
            type(self).failed = True
            raise RuntimeError("the GPU fell off the bus")
        return await super().train(model, groups, **kwargs)


async def test_workers_wait_for_a_failed_run_to_be_resumed_by_its_trainer(
    postgres_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    """The trainer fails, its workers see the run failed, the trainer is started again:
    the workers carry on with the resumed run, which trains every group once."""
    caplog.set_level(logging.INFO, logger="artstore.workers")
    async with LocalInferenceServer(latency_s=0.01) as server:
        model, _ = await trainable_model(tmp_path, server, backend_class=FailsOnceBackend)
        run = f"{PROJECT}/{model.name}"
        config = artstore.TrainingConfig(
            epochs=1, batch_size=1, group_size=2, rollouts="workers", max_steps_off_policy=0
        )

        def training() -> Any:
            return artstore.TrainingFramework(store).run_training(
                model=model,
                scenarios=scenarios(3),
                agent_function=scripted_agent,
                reward_function=length_reward,
                config=config,
            )

        async with (
            await artstore.open_store(postgres_url) as store,
            await artstore.open_store(postgres_url) as store_a,
            await artstore.open_store(postgres_url) as store_b,
        ):
            workers = asyncio.gather(
                *(
                    run_worker(s, run, scripted_agent, lease_s=120, api_key=server.api_key)
                    for s in (store_a, store_b)
                )
            )
            with pytest.raises(artstore.ArtstoreError, match="the GPU fell off the bus"):
                await training()

            def saw_failure() -> int:
                return sum(f"run {run} failed" in r.getMessage() for r in caplog.records)

            for _ in range(1200):  # both workers notice the failure (a slow machine: 60 s)
                if saw_failure() == 2:
                    break
                await asyncio.sleep(0.05)
            assert saw_failure() == 2
            # Started again: a hang (workers gone, the trainer waiting for them) fails here.
            summary = await asyncio.wait_for(training(), timeout=300)
            done = await asyncio.wait_for(workers, timeout=60)

            assert summary.steps_trained == [2, 3]
            assert [w.run_status for w in done] == ["finished", "finished"]
            groups = {g.group_id for g in await rows(store, t.groups)}
            consumptions = await rows(store, t.group_consumptions)
            assert len(groups) == 3 and Counter(c.group_id for c in consumptions) == Counter(groups)
            await assert_consistent(store)


def test_artstore_worker_on_the_command_line(postgres_url: str, tmp_path: Path, monkeypatch):
    """A trainer in a thread, `artstore worker` in the foreground, until the run finishes."""
    outcome: dict[str, Any] = {}

    with LocalInferenceServer() as server:

        async def train() -> None:
            model, _ = await trainable_model(tmp_path, server, name="cli")
            async with await artstore.open_store(postgres_url) as store:
                outcome["summary"] = await artstore.TrainingFramework(store).run_training(
                    model=model,
                    scenarios=scenarios(2),
                    agent_function=scripted_agent,
                    reward_function=length_reward,
                    config=artstore.TrainingConfig(
                        epochs=1, batch_size=1, group_size=2, rollouts="workers"
                    ),
                )

        trainer = threading.Thread(target=lambda: asyncio.run(train()))
        trainer.start()
        try:
            monkeypatch.setenv("ARTSTORE_INFERENCE_API_KEY", server.api_key)
            result = CliRunner().invoke(
                app,
                [
                    "worker",
                    f"{PROJECT}/cli",
                    "--agent",
                    "training_helpers:scripted_agent",
                    "--concurrency",
                    "3",
                    "--url",
                    postgres_url,
                ],
            )
        finally:
            trainer.join(timeout=120)
    assert result.exit_code == 0, result.output
    assert "4 rollouts finished, 0 failed, 2 groups sealed" in result.output
    assert outcome["summary"].steps_trained == [1, 2]
    assert server.api_key not in result.output


async def test_a_worker_without_the_inference_key_is_told_where_to_give_it(pg_store):
    await register(pg_store, batches=[0])
    async with pg_store.database.write() as connection:
        await connection.execute(
            update(t.worker_runs).values(
                models={"policy": {"name": "model", "needs_api_key": True}}
            )
        )
    with pytest.raises(ConfigurationError, match=r"never stored.*\$ARTSTORE_INFERENCE_API_KEY"):
        await run_worker(pg_store, RUN, scripted_agent)
