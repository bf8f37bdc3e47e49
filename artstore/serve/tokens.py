"""Tokens of `artstore serve`: made random, shown once, kept as their SHA-256 only.

A run token (`artstore token create --run R --scope read|write`) opens the API for one
run: `write` starts, logs, finishes and fails its rollouts, `read` reads them. A rollout
token is made when a rollout starts; it names that rollout in its agent's base URL
(`/r/<token>/v1`), may also log, finish or fail that rollout, and is dead once the rollout
has ended. A token is never written to an event; the process learns each one it makes or
sees (`artstore.redaction.learn`), so that no log line or error shows it either; a
rollout's token is cleaned from what that rollout records (`artstore.serve.rollouts`).
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from sqlalchemy import insert, select, update

from artstore.redaction import learn
from artstore.schema import tables as t

if TYPE_CHECKING:
    from artstore.store import Store

SCOPES = ("read", "write")
_PREFIX = {"run": "ast_run_", "rollout": "ast_rollout_"}


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8", "surrogateescape")).hexdigest()


@dataclass(frozen=True)
class Grant:
    """What a token admits: its kind, scope and run (and rollout for a rollout token)."""

    kind: str  # run | rollout
    scope: str  # read | write
    run: str
    rollout_id: str | None
    expired: bool  # past its expiry, or its rollout ended

    def may(self, scope: str, run: str | None, rollout_id: str | None = None) -> bool:
        """Whether this grant allows `scope` on `run` (and on `rollout_id`, when given)."""
        if scope == "write" and self.scope != "write":
            return False
        if self.kind == "rollout":
            return rollout_id is not None and rollout_id == self.rollout_id
        return run == self.run


async def create_token(
    store: Store,
    *,
    run: str,
    scope: str,
    kind: str = "run",
    rollout_id: str | None = None,
    ttl_s: float | None = None,
    lease_s: float | None = None,
) -> str:
    """A new token (returned once; only its hash is stored); a rollout token's lease."""
    token = _PREFIX[kind] + secrets.token_urlsafe(32)
    if kind == "run":  # a few: learned by the process (a rollout's, by its own redaction)
        learn([token])
    now = datetime.now(UTC)
    row = {
        "token_hash": token_hash(token),
        "kind": kind,
        "scope": scope,
        "run": run,
        "rollout_id": rollout_id,
        "created_at": now,
        "expires_at": now + timedelta(seconds=ttl_s) if ttl_s is not None else None,
        "lease_expires_at": now + timedelta(seconds=lease_s) if lease_s is not None else None,
    }

    async def work(connection) -> None:
        await connection.execute(insert(t.api_tokens).values(**row))

    await store.database.run_write(work)
    return token


async def find_grant(store: Store, token: str) -> Grant | None:
    """What `token` admits, None for a token this store never made."""
    query = select(t.api_tokens).where(t.api_tokens.c.token_hash == token_hash(token))
    async with store.database.read() as connection:
        row = (await connection.execute(query)).first()
    if row is None:
        return None
    if row.kind == "run":
        learn([token])
    expires = row.expires_at
    if expires is not None and expires.tzinfo is None:  # SQLite keeps UTC without a zone
        expires = expires.replace(tzinfo=UTC)
    expired = row.ended_at is not None or (expires is not None and expires <= datetime.now(UTC))
    return Grant(row.kind, row.scope, row.run, row.rollout_id, expired)


async def end_rollout_tokens(store: Store, rollout_id: str) -> None:
    """The tokens of a rollout that ended die."""

    async def work(connection) -> None:
        await connection.execute(
            update(t.api_tokens)
            .where(t.api_tokens.c.rollout_id == rollout_id, t.api_tokens.c.ended_at.is_(None))
            .values(ended_at=datetime.now(UTC))
        )

    await store.database.run_write(work)
