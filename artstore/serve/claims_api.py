"""Rollout workers over HTTP: claim, renew, give back and seal through the server.

`artstore worker --server URL` holds no database credentials: it asks the server, which
calls the same claim services as a database-connected worker (`artstore.workers.claims`)
on its own connection. A claimed slot is started here as a served rollout whose recorder
carries the claim's fence (`claims.rollout_check`): the worker's agent calls the proxy at
the rollout's base URL, and the worker ends it with `POST /api/rollouts/{id}/finish` (or
`/fail`) with the rollout's token. A worker whose lease expired is refused by the
database there, as in-process (409 `lease_lost`). A seal is scored by the worker (the
reward function is its code, not the server's) and written here with the claim's fence.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import JSONResponse

from artstore.errors import ConfigurationError, RewardFunctionError
from artstore.events import RunStarted
from artstore.groups import GroupPlace, group_rollouts, seal_group
from artstore.serve.api import base_url, run_name
from artstore.serve.errors import Refused
from artstore.serve.limits import read_json_object
from artstore.workers import claims
from artstore.workers.claims import RolloutClaim, SealClaim
from artstore.workers.worker import WORKER_GONE, abandon_rollout, abandoned_before

if TYPE_CHECKING:
    from artstore.serve.services import Services


async def _open(request: Request) -> tuple[Services, str, dict[str, Any]]:
    app: Services = request.app.state.serve
    run = run_name(request)
    await app.access.check(request, "write", run)
    try:
        claims.require_postgres(app.store.database, "rollout workers")
    except ConfigurationError as exc:
        raise Refused(400, "needs_postgresql", str(exc)) from None
    return app, run, await read_json_object(request, app.max_body_bytes)


def _claim(kind: type, value: Any, run: str) -> Any:
    """A claim the worker sends back, as the server gave it, for this run."""
    names = {f.name for f in dataclasses.fields(kind)}
    if not isinstance(value, dict) or set(value) != names or value.get("run") != run:
        raise Refused(400, "invalid_request", f"not a {kind.__name__} of run {run}")
    return kind(**value)


def _number(body: dict[str, Any], key: str, default: float) -> float:
    value = body.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise Refused(400, "invalid_request", f"`{key}` must be a positive number")
    return float(value)


async def claim(request: Request) -> JSONResponse:
    """Claim up to `limit` seals and slots for `worker`, each leased for `lease_s`."""
    app, run, body = await _open(request)
    worker = body.get("worker")
    if not isinstance(worker, str) or not 0 < len(worker) <= 200:
        raise Refused(400, "invalid_request", "`worker` must name the worker (a string)")
    limit, lease_s = int(_number(body, "limit", 1)), _number(body, "lease_s", 30.0)
    claimed = await claims.claim_work(app.store.database, run, worker, limit, lease_s)
    registered = claimed.registration
    if registered is None:
        raise Refused(404, "not_found", f"no trainer has registered run {run} for workers")
    started = await _run_started(app, run) if claimed.rollouts or claimed.seals else None
    answer: dict[str, Any] = {
        "run": {
            "status": registered.status,
            "policy_step": registered.policy_step,
            "error": registered.error,
            "reward_function": registered.reward_function,
        },
        "rollouts": [],
        "seals": [],
    }
    for slot in claimed.rollouts:
        answer["rollouts"].append(await _start(request, app, registered, started, slot))
    for seal in claimed.seals:
        answer["seals"].append(await _seal_inputs(app, started, seal))
    return JSONResponse(answer)


async def _start(
    request: Request, app: Services, registered: Any, started: Any, slot: RolloutClaim
) -> dict[str, Any]:
    """Start a claimed slot's rollout here, fenced by its claim."""
    resumes = None
    if slot.previous_rollout_id is not None:
        previous = slot.previous_rollout_id
        taken_over = await abandon_rollout(app.store, previous, WORKER_GONE)
        if taken_over or await abandoned_before(app.store, previous):
            resumes = previous  # its answered calls are served back, not paid again
        await app.rollouts.forget(previous)
    settings = registered.models[slot.role]
    scenario = started.scenarios[slot.scenario_index]
    served, token = await app.rollouts.start_claimed(slot, settings, scenario, resumes)
    return {
        "claim": dataclasses.asdict(slot),
        "scenario": scenario,
        "model": settings.get("inference_model_name") or settings["name"],
        "token": token,
        "base_url": base_url(request, token),
        "rollout_id": served.recorder.id,
    }


async def _seal_inputs(app: Services, started: Any, seal: SealClaim) -> dict[str, Any]:
    """What the worker scores a claimed group with: its finished rollouts and trajectories."""
    done = await group_rollouts(app.store, seal.group_id)
    if done.running:  # attempts whose claims moved on: their writers are gone
        for rollout_id in done.running:
            await abandon_rollout(app.store, rollout_id, WORKER_GONE)
            await app.rollouts.forget(rollout_id)
        done = await group_rollouts(app.store, seal.group_id)
    ids = [*done.policy, *done.validation]
    trajectories = await app.store.trajectories(ids)
    return {
        "claim": dataclasses.asdict(seal),
        "scenario": started.scenarios[seal.scenario_index],
        "rollout_ids": ids,
        "policy": len(done.policy),
        "results": [done.results[i] for i in ids],
        "trajectories": [trajectories[i].model_dump(mode="json") for i in ids],
    }


async def renew(request: Request) -> JSONResponse:
    """The worker's heartbeat: extend its leases; the claims it lost."""
    app, run, body = await _open(request)
    rollouts = [_claim(RolloutClaim, c, run) for c in body.get("rollouts") or []]
    seals = [_claim(SealClaim, c, run) for c in body.get("seals") or []]
    lease_s = _number(body, "lease_s", 30.0)
    lost = await claims.renew(app.store.database, rollouts, seals, lease_s)
    return JSONResponse(
        {
            "lost_rollouts": [dataclasses.asdict(c) for c in lost[0]],
            "lost_seals": [dataclasses.asdict(c) for c in lost[1]],
        }
    )


async def release(request: Request) -> JSONResponse:
    """Give a claim back: `released`, `ended` or `lost` (as `claims.release_*` say)."""
    app, run, body = await _open(request)
    if "rollout" in body:
        slot = _claim(RolloutClaim, body["rollout"], run)
        outcome = await claims.release_rollout(app.store.database, slot)
        if outcome != "ended":  # its served rollout is no one's now
            await app.rollouts.forget(slot.rollout_id)
    else:
        outcome = await claims.release_seal(
            app.store.database, _claim(SealClaim, body.get("seal"), run)
        )
    return JSONResponse({"outcome": outcome})


async def seal(request: Request) -> JSONResponse:
    """Seal a claimed group with the rewards its worker computed (or fail it: `error`)."""
    app, run, body = await _open(request)
    held = _claim(SealClaim, body.get("seal"), run)
    place = GroupPlace(held.group_id, held.run, held.epoch, held.batch, held.scenario_index)
    if isinstance(body.get("error"), str):
        await claims.fail_seal(app.store.database, held, body["error"][:2000])
        return JSONResponse({"group_id": held.group_id, "status": "failed"})
    done = await group_rollouts(app.store, held.group_id)
    ids = [*done.policy, *done.validation]
    if body.get("rollout_ids") != ids:
        raise Refused(
            409, "group_changed", f"group {held.group_id}'s rollouts changed: claim again"
        )
    if not done.policy:
        error = (
            f"RolloutsFailedError: {place}: every policy rollout failed (recorded, with "
            "their tracebacks)"
        )
        await claims.fail_seal(app.store.database, held, error)
        return JSONResponse({"group_id": held.group_id, "status": "failed"})
    rewards = body.get("rewards")
    started = await _run_started(app, run)
    try:
        await seal_group(
            app.store,
            place,
            done,
            scenario=started.scenarios[held.scenario_index],
            reward_function=lambda *_: rewards,
            scorer=started.scorer,
            condition=claims.seal_check(held),
        )
    except RewardFunctionError as exc:
        raise Refused(400, "invalid_request", str(exc).splitlines()[0]) from None
    return JSONResponse({"group_id": held.group_id, "status": "sealed"})


async def _run_started(app: Services, run: str) -> RunStarted:
    cached = app.runs_started.get(run)
    if cached is None:
        recorded = await app.store.read_stream(f"run-{run}", limit=1)
        cached = recorded[0].decode() if recorded else None
        if not isinstance(cached, RunStarted):
            raise Refused(404, "not_found", f"run {run} was not started by a trainer here")
        app.runs_started[run] = cached
    return cached
