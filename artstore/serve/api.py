"""The rollout API: start a rollout in a run, log, finish, fail, read it and its trajectory.

Every handler checks the request's token first (`artstore.serve.access`), then its body,
and writes nothing when either is refused.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import JSONResponse

from artstore.errors import InvalidArgumentError
from artstore.names import check_name
from artstore.serve.errors import Refused
from artstore.serve.limits import read_json_object
from artstore.serve.rollouts import rollout_row

if TYPE_CHECKING:
    from artstore.serve.services import Services


def _name(argument: str, value: str) -> str:
    try:
        check_name(argument, value)
    except InvalidArgumentError as exc:
        raise Refused(400, "invalid_request", str(exc).splitlines()[0]) from None
    return value


def base_url(request: Request, token: str) -> str:
    public = request.app.state.public_url or str(request.base_url)
    return f"{public.rstrip('/')}/r/{token}/v1"


def run_name(request: Request) -> str:
    """The run the path names, checked."""
    return _name("run", request.path_params["run"])


async def start_rollout(request: Request) -> JSONResponse:
    app: Services = request.app.state.serve
    run = run_name(request)
    await app.access.check(request, "write", run)
    body = await read_json_object(request, app.max_body_bytes)
    served, token = await app.rollouts.start(run, body)
    return JSONResponse(
        {
            "rollout_id": served.recorder.id,
            "run": run,
            "group_id": served.group_id,
            "token": token,
            "base_url": base_url(request, token),
        },
        status_code=201,
    )


async def _open_rollout(request: Request) -> Any:
    """The rollout of the path, served here, once the token allows writing to it."""
    app: Services = request.app.state.serve
    rollout_id = _name("rollout_id", request.path_params["rollout_id"])
    served = app.rollouts.get(rollout_id)
    row = None if served is not None else await rollout_row(app.store, rollout_id)
    run = served.run if served is not None else (row.run if row is not None else None)
    await app.access.check(request, "write", run, rollout_id)
    if served is None:
        if row is None:
            raise Refused(404, "not_found", f"no rollout {rollout_id} in this store")
        if row.status != "running":
            raise Refused(409, "rollout_ended", f"rollout {rollout_id} has {row.status}")
        raise Refused(503, "rollout_elsewhere", f"rollout {rollout_id} is served elsewhere")
    if served.ending:
        raise Refused(409, "rollout_ended", f"rollout {rollout_id} has ended")
    return served


async def log_lines(request: Request) -> JSONResponse:
    app: Services = request.app.state.serve
    served = await _open_rollout(request)
    body = await read_json_object(request, app.max_body_bytes)
    lines = body.get("lines", [body["message"]] if "message" in body else None)
    if not isinstance(lines, list) or not all(isinstance(line, str) for line in lines):
        raise Refused(400, "invalid_request", "give `lines` (a list of strings) or `message`")
    served.recorder.logs.extend(lines)
    return JSONResponse({"logged": len(lines)})


async def finish_rollout(request: Request) -> JSONResponse:
    app: Services = request.app.state.serve
    served = await _open_rollout(request)
    body = await read_json_object(request, app.max_body_bytes)
    await app.rollouts.finish(served, body)
    return JSONResponse({"rollout_id": served.recorder.id, "status": "finished"})


async def fail_rollout(request: Request) -> JSONResponse:
    app: Services = request.app.state.serve
    served = await _open_rollout(request)
    body = await read_json_object(request, app.max_body_bytes)
    await app.rollouts.fail(served, body)
    return JSONResponse({"rollout_id": served.recorder.id, "status": "failed"})


async def _readable(request: Request) -> Any:
    app: Services = request.app.state.serve
    rollout_id = _name("rollout_id", request.path_params["rollout_id"])
    served = app.rollouts.get(rollout_id)
    if served is not None:
        await app.store.flush()
    row = await rollout_row(app.store, rollout_id)
    await app.access.check(request, "read", row.run if row is not None else None, rollout_id)
    if row is None:
        raise Refused(404, "not_found", f"no rollout {rollout_id} in this store")
    return row


async def read_rollout(request: Request) -> JSONResponse:
    row = await _readable(request)
    return JSONResponse({"rollout_id": row.rollout_id, "run": row.run, "status": row.status})


async def read_trajectory(request: Request) -> JSONResponse:
    app: Services = request.app.state.serve
    row = await _readable(request)
    scorer = request.query_params.get("scorer")
    trajectory = await app.store.trajectory(row.rollout_id, scorer=scorer)
    return JSONResponse(
        {
            "rollout_id": row.rollout_id,
            "status": row.status,
            "trajectory": trajectory.model_dump(mode="json"),
        }
    )
