"""The Starlette app of `artstore serve`: the proxy, the rollout API and its schema."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from artstore.errors import ArtstoreError, LeaseLostError
from artstore.redaction import redact_known
from artstore.serve import api, claims_api, leases
from artstore.serve.access import ROLLOUT_TOKEN_HEADER, Access
from artstore.serve.errors import Refused, error_response
from artstore.serve.limits import DEFAULT_MAX_BODY_BYTES
from artstore.serve.openapi import openapi_schema
from artstore.serve.proxy import Proxy
from artstore.serve.rollouts import Rollouts
from artstore.serve.services import Services

if TYPE_CHECKING:
    from artstore.store import Store

logger = logging.getLogger(__name__)


def create_app(
    store: Store,
    *,
    upstream: str,
    upstream_api_key: str | None = None,
    require_tokens: bool = False,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    public_url: str | None = None,
    lease_s: float = leases.DEFAULT_LEASE_S,
) -> Starlette:
    """The app over an open store; the store stays the caller's to close."""
    rollouts = Rollouts(store, upstream, lease_s)
    served = Services(
        store=store,
        rollouts=rollouts,
        access=Access(store, rollouts, require_tokens=require_tokens),
        proxy=Proxy(upstream, api_key=upstream_api_key, max_body_bytes=max_body_bytes),
        max_body_bytes=max_body_bytes,
    )

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        keeper = asyncio.create_task(leases.keep(store, rollouts.by_token, lease_s))
        try:
            yield
        finally:  # no rollout is left running by a server that stops
            keeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await keeper
            await rollouts.stop("the server stopped before the rollout ended")
            await served.proxy.close()

    routes = [
        Route("/r/{token}/v1/{path:path}", proxy_with_path_token, methods=["GET", "POST"]),
        Route("/v1/{path:path}", proxy_with_header_token, methods=["GET", "POST"]),
        Route("/api/runs/{run:path}/rollouts", api.start_rollout, methods=["POST"]),
        Route("/api/rollouts/{rollout_id}", api.read_rollout, methods=["GET"]),
        Route("/api/rollouts/{rollout_id}/log", api.log_lines, methods=["POST"]),
        Route("/api/rollouts/{rollout_id}/finish", api.finish_rollout, methods=["POST"]),
        Route("/api/rollouts/{rollout_id}/fail", api.fail_rollout, methods=["POST"]),
        Route("/api/rollouts/{rollout_id}/trajectory", api.read_trajectory, methods=["GET"]),
        Route("/api/runs/{run:path}/claims", claims_api.claim, methods=["POST"]),
        Route("/api/runs/{run:path}/claims/renew", claims_api.renew, methods=["POST"]),
        Route("/api/runs/{run:path}/claims/release", claims_api.release, methods=["POST"]),
        Route("/api/runs/{run:path}/claims/seal", claims_api.seal, methods=["POST"]),
        Route("/openapi.json", schema, methods=["GET"]),
    ]
    app = Starlette(
        routes=routes,
        lifespan=lifespan,
        exception_handlers={
            Refused: refused,
            LeaseLostError: lease_lost,
            ArtstoreError: failed,
            Exception: failed,
        },
    )
    app.state.serve = served
    app.state.public_url = public_url
    return app


async def proxy_with_path_token(request: Request) -> Response:
    served: Services = request.app.state.serve
    rollout = await served.access.rollout_of(request.path_params["token"])
    return await served.proxy.relay(request, request.path_params["path"], rollout)


async def proxy_with_header_token(request: Request) -> Response:
    served: Services = request.app.state.serve
    token = request.headers.get(ROLLOUT_TOKEN_HEADER)
    if token is None and served.access.require_tokens:
        raise Refused(401, "missing_token", "this server requires a rollout token")
    rollout = await served.access.rollout_of(token)
    return await served.proxy.relay(request, request.path_params["path"], rollout)


async def schema(request: Request) -> JSONResponse:
    return JSONResponse(openapi_schema())


async def refused(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, Refused)
    return exc.response()


async def lease_lost(request: Request, exc: Exception) -> Response:
    """A worker's claim expired or was taken over: the database refused its write."""
    message = redact_known((str(exc).strip().splitlines() or ["lease lost"])[0])
    return error_response(409, "lease_lost", message)


async def failed(request: Request, exc: Exception) -> Response:
    """Any other error: one line, cleaned of every credential the process knows."""
    message = redact_known((str(exc).strip().splitlines() or [type(exc).__name__])[0])
    if not isinstance(exc, ArtstoreError):
        logger.error("%s: %s", type(exc).__name__, message)
    return error_response(500, type(exc).__name__, message)
