"""Claims on a run's work, in PostgreSQL: leases with heartbeats, and fencing tokens.

The trainer registers the run (`register_run`: `worker_runs`) and publishes one row per
rollout a group needs (`rollout_claims`, its *slots*) and one per group
(`group_claims`). Workers claim slots, then seals, with `SELECT ... FOR UPDATE SKIP
LOCKED`, so that any number of them share the work without waiting for each other.

A claim is a lease: `lease_expires_at`, in the database's clock, renewed by the worker's
heartbeat (`renew`). A claim whose lease expired can be claimed again, and every claim
adds one to the row's `token`. The write that ends a claimed rollout (`rollout.finished`
or `rollout.failed`) and the write that seals a group run a check in their own
transaction (`rollout_check`, `seal_check`) that the token is still the claimer's and
the lease has not expired: a worker that was paused, cut off or presumed dead has its
write refused by the database (LeaseLostError), whatever it believes. The write that
starts a claimed rollout is checked too, so that a stale worker cannot start a rollout
that nobody would end.

Slots are claimed in batch order, and only up to `max_steps_off_policy` batches past the
one the trainer trains next (`worker_runs.next_batch`): a rollout is never trained more
than that many steps after the policy step it ran at.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, TypeVar

from sqlalchemy import (
    String,
    and_,
    case,
    cast,
    column,
    exists,
    func,
    literal,
    or_,
    select,
    table,
    tuple_,
    update,
)
from sqlalchemy.exc import DBAPIError

from artstore.errors import ConfigurationError, LeaseLostError, WrongDatabaseError
from artstore.eventstore.database import error_kind, translate_error
from artstore.eventstore.recorder import ErrorKind
from artstore.schema.tables import events, group_claims, rollout_claims, worker_runs
from artstore.workers.notify import notify, notify_sync

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection
    from sqlalchemy.ext.asyncio import AsyncConnection

    from artstore.eventstore.database import Database

T = TypeVar("T")

# Ending a rollout with one of these errors gives its slot back instead of failing it: the
# worker stopped it (shutting down, or its lease was lost), the agent did not fail.
REDO_ERRORS = frozenset({"CancelledError"})
NOW = func.clock_timestamp  # the database's clock, for every lease (hosts' clocks differ)
# A worker stopped inside one of these transactions (SIGSTOP, a frozen VM, a debugger)
# keeps the rows it touched locked, and other workers' claims skip locked rows: its slots
# could not be taken over when its leases expire. The server ends such a session once it
# has sat idle in its transaction this long (the sessions' default is 10 minutes).
CLAIMS_IDLE_TIMEOUT = "5s"
CONFLICT_RETRIES = 5  # a deadlock broken by the server, the transaction run again
_pg_database = table("pg_database", column("oid"), column("datname"))


def require_postgres(database: Database, who: str) -> None:
    """Refuse SQLite for workers and workers mode, in one line that names PostgreSQL."""
    if not database.many_machines:
        raise ConfigurationError(
            f"{who} need PostgreSQL: workers on many hosts coordinate through its row locks "
            f"and notifications, and {database.display_url} is SQLite, which serves one "
            "machine (open the store with a postgresql:// URL)"
        )


# --- what is claimed ------------------------------------------------------------------------


@dataclass(frozen=True)
class GroupPlan:
    """A group the trainer publishes: where it belongs, and how many rollouts it needs."""

    group_id: str
    epoch: int
    batch: int
    scenario_index: int
    policy: int  # policy rollouts (group_size)
    validation: int = 0


@dataclass(frozen=True)
class RunRegistration:
    """What the trainer registered for a run trained from workers (`worker_runs`)."""

    run: str
    model: str
    trainer: str
    database_id: str
    status: str  # open | finished | failed
    policy_step: int
    next_batch: int
    max_steps_off_policy: int
    models: dict[str, Any]  # per role: name, project, inference_base_url, inference_model_name
    reward_function: str | None
    error: str | None
    updated_at: datetime


@dataclass(frozen=True)
class RolloutClaim:
    """A slot this worker holds: a rollout to run, under `token` until the lease expires."""

    group_id: str
    slot: int
    token: int
    run: str
    epoch: int
    batch: int
    scenario_index: int
    role: str
    rollout_id: str
    # The attempt this claim resumes: the latest rollout of the slot that started, if any.
    previous_rollout_id: str | None
    policy_step: int


@dataclass(frozen=True)
class SealClaim:
    """A group this worker seals: score its rollouts and seal it, under `token`."""

    group_id: str
    token: int
    run: str
    epoch: int
    batch: int
    scenario_index: int


@dataclass(frozen=True)
class GroupState:
    status: str  # rolling | sealable | sealing | sealed | failed
    error: str | None


async def claims_transaction(
    database: Database, work: Callable[[AsyncConnection], Awaitable[T]]
) -> T:
    """One transaction on the claims, ended by the server if its process stops inside it;
    a lost connection comes out as DatabaseUnavailableError."""

    async def bounded(connection: AsyncConnection) -> T:
        await connection.exec_driver_sql(
            f"SET LOCAL idle_in_transaction_session_timeout = '{CLAIMS_IDLE_TIMEOUT}'"
        )
        return await work(connection)

    # Workers, heartbeats and trainers update the same claim rows in whatever order their
    # statements reach them, so the server may end one transaction to break a deadlock.
    # Each transaction here is whole in itself: running it again is what the server asks.
    for attempt in range(CONFLICT_RETRIES + 1):
        try:
            return await database.run_write(bounded)
        except (DBAPIError, OSError) as exc:
            if attempt < CONFLICT_RETRIES and error_kind(exc) is ErrorKind.CONFLICT_RETRY:
                await asyncio.sleep(random.uniform(0.01, 0.05) * (attempt + 1))
                continue
            raise translate_error(exc, database) from exc
    raise AssertionError("unreachable: the last attempt returns or raises")


async def _read(database: Database, work: Callable[[AsyncConnection], Awaitable[T]]) -> T:
    try:
        async with database.read() as connection:
            return await work(connection)
    except (DBAPIError, OSError) as exc:
        raise translate_error(exc, database) from exc


# --- the database's identity --------------------------------------------------------------


async def database_identity(connection: AsyncConnection) -> str:
    """Which database this is: the server's system identifier, the database's oid and name.

    A copy of the database (a restored backup, `CREATE DATABASE ... TEMPLATE`, another
    server) answers differently, so a worker on it is told it is not the trainer's.
    """
    system = func.pg_control_system().table_valued("system_identifier")
    row = (
        await connection.execute(
            select(
                select(system.c.system_identifier).scalar_subquery(),
                _pg_database.c.oid,
                _pg_database.c.datname,
            ).where(_pg_database.c.datname == func.current_database())
        )
    ).one()
    return f"postgresql:{row[0]}:{row[1]}:{row[2]}"


# --- the trainer's side -------------------------------------------------------------------


async def register_run(
    database: Database,
    *,
    run: str,
    model: str,
    trainer: str,
    models: dict[str, Any],
    reward_function: str | None,
    max_steps_off_policy: int,
    policy_step: int,
    next_batch: int,
    groups: Sequence[GroupPlan],
) -> None:
    """Register (or re-register, on resume) the run and publish its groups and slots.

    Idempotent: groups and slots published before keep their state. Groups that failed
    (every policy rollout failed, or the reward function raised) are opened again, as a
    resumed in-process run rolls such a group out again.
    """

    async def work(connection: AsyncConnection) -> None:
        identity = await database_identity(connection)
        row = {
            "model": model,
            "trainer": trainer,
            "database_id": identity,
            "status": "open",
            "policy_step": policy_step,
            "next_batch": next_batch,
            "max_steps_off_policy": max_steps_off_policy,
            "models": models,
            "reward_function": reward_function,
            "error": None,
            "updated_at": NOW(),
        }
        await connection.execute(
            database.recorder.insert(worker_runs)
            .values(run=run, **row)
            .on_conflict_do_update(index_elements=["run"], set_=row)
        )
        for start in range(0, len(groups), 1000):
            await _publish_groups(database, connection, run, groups[start : start + 1000])
        await _reopen_failed_groups(connection, run)
        await notify(connection, run, "work")

    await claims_transaction(database, work)


async def _publish_groups(
    database: Database, connection: AsyncConnection, run: str, groups: Sequence[GroupPlan]
) -> None:
    """The groups and their rollout slots, as claimable work (those published before keep
    their state)."""
    await connection.execute(
        database.recorder.insert(group_claims).values(updated_at=NOW()).on_conflict_do_nothing(),
        [
            {
                "group_id": g.group_id,
                "run": run,
                "epoch": g.epoch,
                "batch": g.batch,
                "scenario_index": g.scenario_index,
                "status": "rolling",
                "token": 0,
            }
            for g in groups
        ],
    )
    slots = [
        {
            "group_id": g.group_id,
            "slot": slot,
            "run": run,
            "batch": g.batch,
            "role": "policy" if slot < g.policy else "validation",
            "status": "open",
            "token": 0,
            "attempts": 0,
        }
        for g in groups
        for slot in range(g.policy + g.validation)
    ]
    await connection.execute(
        database.recorder.insert(rollout_claims).values(updated_at=NOW()).on_conflict_do_nothing(),
        slots,
    )


async def _reopen_failed_groups(connection: AsyncConnection, run: str) -> None:
    failed = select(group_claims.c.group_id).where(
        group_claims.c.run == run, group_claims.c.status == "failed"
    )
    finished_policy = select(rollout_claims.c.slot).where(
        rollout_claims.c.group_id == group_claims.c.group_id,
        rollout_claims.c.role == "policy",
        rollout_claims.c.status == "finished",
    )
    # No finished policy rollout: roll out the failed slots again.
    again = (
        select(group_claims.c.group_id)
        .where(group_claims.c.run == run, group_claims.c.status == "failed")
        .where(~exists(finished_policy))
    )
    await connection.execute(
        update(rollout_claims)
        .where(rollout_claims.c.group_id.in_(again), rollout_claims.c.status == "failed")
        .values(status="open", worker=None, lease_expires_at=None, updated_at=NOW())
    )
    open_slots = select(rollout_claims.c.slot).where(
        rollout_claims.c.group_id == group_claims.c.group_id,
        rollout_claims.c.status.in_(("open", "claimed")),
    )
    await connection.execute(
        update(group_claims)
        .where(group_claims.c.group_id.in_(failed))
        .values(
            status=case((exists(open_slots), "rolling"), else_="sealable"),
            error=None,
            worker=None,
            lease_expires_at=None,
            updated_at=NOW(),
        )
    )


async def advance(
    database: Database,
    run: str,
    *,
    next_batch: int,
    policy_step: int,
    models: dict[str, Any] | None = None,
) -> None:
    """Tell workers which batch is trained next and the model's step (and serving names)."""
    values: dict[str, Any] = {
        "next_batch": next_batch,
        "policy_step": policy_step,
        "updated_at": NOW(),
    }
    if models is not None:
        values["models"] = models

    async def work(connection: AsyncConnection) -> None:
        await connection.execute(update(worker_runs).where(worker_runs.c.run == run).values(values))
        await notify(connection, run, "work")

    await claims_transaction(database, work)


async def close_run(database: Database, run: str, status: str, error: str | None = None) -> None:
    """The trainer finished (`finished`) or stopped on an error (`failed`): workers stop."""

    async def work(connection: AsyncConnection) -> None:
        await connection.execute(
            update(worker_runs)
            .where(worker_runs.c.run == run)
            .values(status=status, error=error, updated_at=NOW())
        )
        await notify(connection, run, "closed")

    await claims_transaction(database, work)


async def group_states(database: Database, group_ids: Iterable[str]) -> dict[str, GroupState]:
    ids = list(group_ids)

    async def work(connection: AsyncConnection) -> dict[str, GroupState]:
        found = {}
        for start in range(0, len(ids), 500):
            query = select(group_claims.c.group_id, group_claims.c.status, group_claims.c.error)
            query = query.where(group_claims.c.group_id.in_(ids[start : start + 500]))
            for row in await connection.execute(query):
                found[row.group_id] = GroupState(row.status, row.error)
        return found

    return await _read(database, work)


# --- the workers' side --------------------------------------------------------------------


async def registration(database: Database, run: str) -> RunRegistration | None:
    async def work(connection: AsyncConnection) -> RunRegistration | None:
        row = (
            await connection.execute(select(worker_runs).where(worker_runs.c.run == run))
        ).first()
        return None if row is None else RunRegistration(**row._asdict())

    return await _read(database, work)


async def check_same_database(database: Database, registered: RunRegistration) -> None:
    """Refuse a worker whose database is not the one the run's trainer registered in."""

    async def work(connection: AsyncConnection) -> str:
        return await database_identity(connection)

    mine = await _read(database, work)
    if mine != registered.database_id:
        raise WrongDatabaseError(
            f"run {registered.run!r} was registered by its trainer ({registered.trainer}) in "
            f"another database ({registered.database_id}) than this worker's "
            f"({mine} at {database.display_url}), a copy or a restore of it: point the "
            "worker at the trainer's database"
        )


@dataclass(frozen=True)
class Claimed:
    """What one claiming transaction found: the run's registration and the new claims."""

    registration: RunRegistration | None
    seals: list[SealClaim]
    rollouts: list[RolloutClaim]


async def claim_work(
    database: Database, run: str, worker: str, limit: int, lease_s: float
) -> Claimed:
    """In one transaction: the run's registration, then up to `limit` claims, seals first
    (they unblock the trainer), then rollout slots (lowest batch first, within the bound).

    The registration is read under a share lock, so that the trainer cannot move the
    policy step between the off-policy bound used here and the step given to the claims.
    """

    async def work(connection: AsyncConnection) -> Claimed:
        row = (
            await connection.execute(
                select(worker_runs).where(worker_runs.c.run == run).with_for_update(read=True)
            )
        ).first()
        registration = None if row is None else RunRegistration(**row._asdict())
        if registration is None or registration.status != "open" or limit <= 0:
            return Claimed(registration, [], [])
        seals = await _claim_seals(connection, run, worker, limit, lease_s)
        rollouts = await _claim_rollouts(
            connection, registration, worker, limit - len(seals), lease_s
        )
        return Claimed(registration, seals, rollouts)

    return await claims_transaction(database, work)


async def claim_rollouts(
    database: Database, run: str, worker: str, limit: int, lease_s: float
) -> list[RolloutClaim]:
    """Claim up to `limit` open slots (or slots whose lease expired), lowest batch first."""

    async def work(connection: AsyncConnection) -> list[RolloutClaim]:
        row = (
            await connection.execute(
                select(worker_runs).where(worker_runs.c.run == run).with_for_update(read=True)
            )
        ).first()
        if row is None or row.status != "open":
            return []
        registration = RunRegistration(**row._asdict())
        return await _claim_rollouts(connection, registration, worker, limit, lease_s)

    return await claims_transaction(database, work)


async def claim_seals(
    database: Database, run: str, worker: str, limit: int, lease_s: float
) -> list[SealClaim]:
    """Claim up to `limit` groups ready to seal (or whose sealer's lease expired)."""

    async def work(connection: AsyncConnection) -> list[SealClaim]:
        return await _claim_seals(connection, run, worker, limit, lease_s)

    return await claims_transaction(database, work)


async def _claim_rollouts(
    connection: AsyncConnection,
    registration: RunRegistration,
    worker: str,
    limit: int,
    lease_s: float,
) -> list[RolloutClaim]:
    if limit <= 0:
        return []
    run = registration.run
    last_batch = registration.next_batch + registration.max_steps_off_policy
    candidates = (
        select(rollout_claims.c.group_id, rollout_claims.c.slot, rollout_claims.c.rollout_id)
        .where(
            rollout_claims.c.run == run,
            or_(
                rollout_claims.c.status == "open",
                and_(
                    rollout_claims.c.status == "claimed",
                    rollout_claims.c.lease_expires_at < NOW(),
                ),
            ),
            rollout_claims.c.batch <= last_batch,
        )
        .order_by(rollout_claims.c.batch, rollout_claims.c.group_id, rollout_claims.c.slot)
        .limit(limit)
        .with_for_update(skip_locked=True)
        .cte("candidates")
    )
    claim = (
        update(rollout_claims)
        .where(
            rollout_claims.c.group_id == candidates.c.group_id,
            rollout_claims.c.slot == candidates.c.slot,
        )
        .values(
            status="claimed",
            token=rollout_claims.c.token + 1,
            worker=worker,
            rollout_id=cast(func.gen_random_uuid(), String),
            resume_rollout_id=_resumed_next(),
            attempts=rollout_claims.c.attempts + 1,
            lease_expires_at=NOW() + timedelta(seconds=lease_s),
            updated_at=NOW(),
        )
        .returning(
            rollout_claims.c.group_id,
            rollout_claims.c.slot,
            rollout_claims.c.token,
            rollout_claims.c.batch,
            rollout_claims.c.role,
            rollout_claims.c.rollout_id,
            rollout_claims.c.resume_rollout_id.label("previous_rollout_id"),
        )
    )
    claimed = (await connection.execute(claim)).all()
    if not claimed:
        return []
    places = await _places(connection, {row.group_id for row in claimed})
    return [
        RolloutClaim(
            group_id=row.group_id,
            slot=row.slot,
            token=row.token,
            run=run,
            epoch=places[row.group_id][0],
            batch=row.batch,
            scenario_index=places[row.group_id][1],
            role=row.role,
            rollout_id=row.rollout_id,
            previous_rollout_id=row.previous_rollout_id,
            policy_step=registration.policy_step,
        )
        for row in claimed
    ]


def _resumed_next() -> Any:
    """The attempt a slot's new claim resumes: the rollout of its previous claim if that
    one started; else the one that claim was to resume (a claim lost before its rollout
    started leaves the attempt before it to the next)."""
    started = exists().where(
        events.c.stream_id == literal("rollout-").concat(rollout_claims.c.rollout_id)
    )
    return case((started, rollout_claims.c.rollout_id), else_=rollout_claims.c.resume_rollout_id)


async def _claim_seals(
    connection: AsyncConnection, run: str, worker: str, limit: int, lease_s: float
) -> list[SealClaim]:
    if limit <= 0:
        return []
    candidates = (
        select(group_claims.c.group_id)
        .where(
            group_claims.c.run == run,
            or_(
                group_claims.c.status == "sealable",
                and_(group_claims.c.status == "sealing", group_claims.c.lease_expires_at < NOW()),
            ),
        )
        .order_by(group_claims.c.batch, group_claims.c.group_id)
        .limit(limit)
        .with_for_update(skip_locked=True)
        .cte("candidates")
    )
    claim = (
        update(group_claims)
        .where(group_claims.c.group_id == candidates.c.group_id)
        .values(
            status="sealing",
            token=group_claims.c.token + 1,
            worker=worker,
            lease_expires_at=NOW() + timedelta(seconds=lease_s),
            updated_at=NOW(),
        )
        .returning(
            group_claims.c.group_id,
            group_claims.c.token,
            group_claims.c.epoch,
            group_claims.c.batch,
            group_claims.c.scenario_index,
        )
    )
    return [
        SealClaim(
            group_id=row.group_id,
            token=row.token,
            run=run,
            epoch=row.epoch,
            batch=row.batch,
            scenario_index=row.scenario_index,
        )
        for row in await connection.execute(claim)
    ]


async def _places(connection: AsyncConnection, group_ids: set[str]) -> dict[str, tuple[int, int]]:
    query = select(group_claims.c.group_id, group_claims.c.epoch, group_claims.c.scenario_index)
    rows = await connection.execute(query.where(group_claims.c.group_id.in_(sorted(group_ids))))
    return {row.group_id: (row.epoch, row.scenario_index) for row in rows}


async def renew(
    database: Database,
    rollouts: Sequence[RolloutClaim],
    seals: Sequence[SealClaim],
    lease_s: float,
) -> tuple[list[RolloutClaim], list[SealClaim]]:
    """Extend the leases still held (the heartbeat); returns the claims that were lost.

    Lost: claimed by another worker since, or expired (an expired lease is not renewed,
    even if nobody claimed it yet: the worker must stop and give it up). A claim whose
    end this worker already recorded is neither renewed nor lost.
    """
    until = NOW() + timedelta(seconds=lease_s)

    async def work(connection: AsyncConnection) -> tuple[list[RolloutClaim], list[SealClaim]]:
        lost_rollouts: list[RolloutClaim] = []
        lost_seals: list[SealClaim] = []
        if rollouts:
            slot = tuple_(rollout_claims.c.group_id, rollout_claims.c.slot)
            mine = slot.in_([(c.group_id, c.slot) for c in rollouts])
            renewed = await connection.execute(
                update(rollout_claims)
                .where(
                    mine,
                    tuple_(
                        rollout_claims.c.group_id, rollout_claims.c.slot, rollout_claims.c.token
                    ).in_([(c.group_id, c.slot, c.token) for c in rollouts]),
                    rollout_claims.c.status == "claimed",
                    rollout_claims.c.lease_expires_at > NOW(),
                )
                .values(lease_expires_at=until)
                .returning(rollout_claims.c.group_id, rollout_claims.c.slot)
            )
            kept = {tuple(row) for row in renewed}
            now = await connection.execute(
                select(
                    rollout_claims.c.group_id,
                    rollout_claims.c.slot,
                    rollout_claims.c.token,
                    rollout_claims.c.status,
                ).where(mine)
            )
            state = {(r.group_id, r.slot): (r.token, r.status) for r in now}
            for claim in rollouts:
                token, status = state[(claim.group_id, claim.slot)]
                if (claim.group_id, claim.slot) in kept:
                    continue
                if token != claim.token or status == "claimed":
                    lost_rollouts.append(claim)
        if seals:
            mine = group_claims.c.group_id.in_([c.group_id for c in seals])
            renewed = await connection.execute(
                update(group_claims)
                .where(
                    tuple_(group_claims.c.group_id, group_claims.c.token).in_(
                        [(c.group_id, c.token) for c in seals]
                    ),
                    group_claims.c.status == "sealing",
                    group_claims.c.lease_expires_at > NOW(),
                )
                .values(lease_expires_at=until)
                .returning(group_claims.c.group_id)
            )
            kept_groups = {row.group_id for row in renewed}
            now = await connection.execute(
                select(group_claims.c.group_id, group_claims.c.token, group_claims.c.status).where(
                    mine
                )
            )
            groups = {r.group_id: (r.token, r.status) for r in now}
            for claim in seals:
                token, status = groups[claim.group_id]
                if claim.group_id in kept_groups:
                    continue
                if token != claim.token or status == "sealing":
                    lost_seals.append(claim)
        return lost_rollouts, lost_seals

    return await claims_transaction(database, work)


async def release_rollout(database: Database, claim: RolloutClaim) -> str:
    """Give a claimed slot back, if it is still ours and its end was not recorded.

    Returns `released` (given back: the slot keeps the rollout's id, so that whoever
    claims it next records that rollout as abandoned), `ended` (this claim's end was
    recorded) or `lost` (the lease expired, or another worker claimed the slot since).
    """

    async def work(connection: AsyncConnection) -> str:
        slot = [rollout_claims.c.group_id == claim.group_id, rollout_claims.c.slot == claim.slot]
        row = (
            await connection.execute(
                update(rollout_claims)
                .where(
                    *slot,
                    rollout_claims.c.token == claim.token,
                    rollout_claims.c.status == "claimed",
                    rollout_claims.c.lease_expires_at > NOW(),
                )
                .values(status="open", worker=None, lease_expires_at=None, updated_at=NOW())
                .returning(rollout_claims.c.slot)
            )
        ).first()
        if row is not None:
            await notify(connection, claim.run, "work")
            return "released"
        token, status = (
            await connection.execute(
                select(rollout_claims.c.token, rollout_claims.c.status).where(*slot)
            )
        ).one()
        return "ended" if token == claim.token and status != "claimed" else "lost"

    return await claims_transaction(database, work)


async def release_seal(database: Database, claim: SealClaim) -> str:
    """Give a seal back for another worker to try: `released`, `ended` or `lost`."""

    async def work(connection: AsyncConnection) -> str:
        row = (
            await connection.execute(
                update(group_claims)
                .where(*_holding_seal(claim))
                .values(status="sealable", worker=None, lease_expires_at=None, updated_at=NOW())
                .returning(group_claims.c.group_id)
            )
        ).first()
        if row is not None:
            await notify(connection, claim.run, "sealable")
            return "released"
        token, status = (
            await connection.execute(
                select(group_claims.c.token, group_claims.c.status).where(
                    group_claims.c.group_id == claim.group_id
                )
            )
        ).one()
        return "ended" if token == claim.token and status != "sealing" else "lost"

    return await claims_transaction(database, work)


async def fail_seal(database: Database, claim: SealClaim, error: str) -> None:
    """Record that the group cannot be sealed (no policy rollout finished, or the reward
    function raised): the trainer stops on it; a resumed trainer opens it again."""

    async def work(connection: AsyncConnection) -> None:
        row = (
            await connection.execute(
                update(group_claims)
                .where(*_holding_seal(claim))
                .values(status="failed", error=error, lease_expires_at=None, updated_at=NOW())
                .returning(group_claims.c.group_id)
            )
        ).first()
        if row is None:
            raise _seal_lost(claim)
        await notify(connection, claim.run, "failed")

    await claims_transaction(database, work)


async def seconds_to_next_expiry(database: Database, run: str) -> float | None:
    """Seconds until the earliest lease of the run expires (None when nothing is held)."""
    earliest = func.least(
        select(func.min(rollout_claims.c.lease_expires_at))
        .where(rollout_claims.c.run == run, rollout_claims.c.status == "claimed")
        .scalar_subquery(),
        select(func.min(group_claims.c.lease_expires_at))
        .where(group_claims.c.run == run, group_claims.c.status == "sealing")
        .scalar_subquery(),
    )

    async def work(connection: AsyncConnection) -> float | None:
        value = (await connection.execute(select(func.extract("epoch", earliest - NOW())))).scalar()
        return None if value is None else float(value)

    return await _read(database, work)


# --- fencing: checks inside the transactions that end a claim -------------------------------


def rollout_check(claim: RolloutClaim) -> Callable[[Connection, Any], None]:
    """The fence of a claimed rollout (`store.rollout(check=...)`).

    In the transactions of `rollout.started`, `rollout.finished` and `rollout.failed`: the
    slot must still be claimed under this claim's token, with a lease that has not
    expired, or LeaseLostError refuses the event. At the end the slot becomes `finished`
    or `failed` (or `open` again, when the worker stopped the rollout itself), and the
    group `sealable` when it was its last slot.
    """

    def check(connection: Connection, event: Any) -> None:
        if event.type == "rollout.started":
            # Locked until commit: on PostgreSQL the events' INSERT may wait for the append
            # lock after this check, and a claimer (SKIP LOCKED) must not take the slot
            # before the start is recorded.
            held = connection.execute(
                select(rollout_claims.c.slot)
                .where(*_holding_slot(claim))
                .with_for_update(read=True)
            ).first()
            if held is None:
                raise _slot_lost(claim, "start")
            return
        if getattr(event, "error_type", None) in REDO_ERRORS:
            status = "open"
        else:
            status = "finished" if event.type == "rollout.finished" else "failed"
        # The group first (the order every writer takes): its last two slots ending at
        # once must not both see the other one still running.
        group = connection.execute(
            select(group_claims.c.status)
            .where(group_claims.c.group_id == claim.group_id)
            .with_for_update()
        ).scalar()
        ended = connection.execute(
            update(rollout_claims)
            .where(*_holding_slot(claim))
            .values(status=status, lease_expires_at=None, updated_at=NOW())
            .returning(rollout_claims.c.slot)
        ).first()
        if ended is None:
            raise _slot_lost(claim, "end")
        if status == "open":
            notify_sync(connection, claim.run, "work")
            return
        unfinished = connection.execute(
            select(func.count())
            .select_from(rollout_claims)
            .where(
                rollout_claims.c.group_id == claim.group_id,
                rollout_claims.c.status.in_(("open", "claimed")),
            )
        ).scalar()
        if unfinished == 0 and group == "rolling":
            connection.execute(
                update(group_claims)
                .where(group_claims.c.group_id == claim.group_id)
                .values(status="sealable", updated_at=NOW())
            )
            notify_sync(connection, claim.run, "sealable")

    return check


def _holding_slot(claim: RolloutClaim) -> list[Any]:
    return [
        rollout_claims.c.group_id == claim.group_id,
        rollout_claims.c.slot == claim.slot,
        rollout_claims.c.token == claim.token,
        rollout_claims.c.status == "claimed",
        rollout_claims.c.lease_expires_at > NOW(),
    ]


def _slot_lost(claim: RolloutClaim, what: str) -> LeaseLostError:
    return LeaseLostError(
        f"rollout {claim.rollout_id} (group {claim.group_id}, slot {claim.slot}): this "
        f"worker's lease expired or another worker claimed it; the database refused to "
        f"record its {what}"
    )


def seal_check(claim: SealClaim) -> Callable[[Connection], None]:
    """The check in the transaction that appends a group's rewards and seal."""

    def check(connection: Connection) -> None:
        sealed = connection.execute(
            update(group_claims)
            .where(*_holding_seal(claim))
            .values(status="sealed", lease_expires_at=None, updated_at=NOW())
            .returning(group_claims.c.group_id)
        ).first()
        if sealed is None:
            raise _seal_lost(claim)

    return check


def _holding_seal(claim: SealClaim) -> list[Any]:
    return [
        group_claims.c.group_id == claim.group_id,
        group_claims.c.token == claim.token,
        group_claims.c.status == "sealing",
        group_claims.c.lease_expires_at > NOW(),
    ]


def _seal_lost(claim: SealClaim) -> LeaseLostError:
    return LeaseLostError(
        f"group {claim.group_id}: this worker's lease on its seal expired or another worker "
        "claimed it; the database refused the write"
    )
