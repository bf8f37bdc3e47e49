"""Who may do what: the token of a request, checked against what it asks for.

Without `require_tokens` (a server bound to loopback, the default) a request without a
token is admitted: anyone who can reach 127.0.0.1 can already read the store's file. A
token given is always checked. A server listening on any other address requires one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from starlette.requests import Request

from artstore.serve import tokens
from artstore.serve.errors import Refused

if TYPE_CHECKING:
    from artstore.serve.rollouts import Rollouts, Served
    from artstore.store import Store

ROLLOUT_TOKEN_HEADER = "x-artstore-rollout-token"


def bearer(request: Request) -> str | None:
    value = request.headers.get("authorization") or ""
    scheme, _, token = value.partition(" ")
    return (token.strip() or None) if scheme.lower() == "bearer" else None


class Access:
    def __init__(self, store: Store, rollouts: Rollouts, *, require_tokens: bool) -> None:
        self.store = store
        self.rollouts = rollouts
        self.require_tokens = require_tokens

    async def check(
        self, request: Request, scope: str, run: str | None, rollout_id: str | None = None
    ) -> None:
        """Refuse (401, 403 or 409) unless the request's token allows `scope` there."""
        token = bearer(request)
        if token is None:
            if self.require_tokens:
                raise Refused(401, "missing_token", "this server requires a token (Bearer)")
            return
        grant = await self.grant(token)
        if grant is None:
            raise Refused(401, "invalid_token", "the token is not valid here")
        if grant.expired:
            if grant.kind == "rollout" and scope == "write":
                raise Refused(409, "rollout_ended", f"rollout {grant.rollout_id} has ended")
            raise Refused(401, "expired_token", "the token has expired")
        if not grant.may(scope, run, rollout_id):
            raise Refused(403, "forbidden", f"the token does not allow {scope} here")

    async def grant(self, token: str) -> tokens.Grant | None:
        served = self.rollouts.by_token.get(tokens.token_hash(token))
        if served is not None:  # a rollout of this process: no query
            return tokens.Grant("rollout", "write", served.run, served.recorder.id, False)
        return await tokens.find_grant(self.store, token)

    async def rollout_of(self, token: str | None) -> Served | None:
        """The rollout a proxied call belongs to (None without a token)."""
        if token is None:
            return None
        served = self.rollouts.by_token.get(tokens.token_hash(token))
        if served is not None:
            return served
        grant = await tokens.find_grant(self.store, token)
        if grant is None:
            raise Refused(401, "invalid_token", "the rollout token is not valid here")
        if grant.kind != "rollout":
            raise Refused(403, "forbidden", "a run token names no rollout: use a rollout token")
        if grant.expired:
            raise Refused(409, "rollout_ended", f"rollout {grant.rollout_id} has ended")
        raise Refused(
            503,
            "rollout_elsewhere",
            f"rollout {grant.rollout_id} is served by another server process",
        )
