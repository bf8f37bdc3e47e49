"""The rollouts this server process records: started, fed calls, logged, ended.

Each is an `artstore.capture.rollout.Rollout`, the recorder of `store.rollout(...)`,
opened with `open_rollout` and ended with its `finish()` or `fail()`: the same events,
checks and redaction as in-process. Its calls arrive as HTTP requests to the proxy
(`artstore.serve.proxy`), so a rollout lives in the process that started it; the rollout
token held here maps a request to it without a query. Rewards, one per scorer, are
recorded as `rewards.recorded` of the rollout's group, before `rollout.finished`.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from sqlalchemy import select

from artstore.arguments import check_json
from artstore.capture.replay import Replay, load_replay
from artstore.capture.rollout import Rollout, open_rollout, rollout_stream
from artstore.errors import InvalidArgumentError
from artstore.events import RewardsRecorded, RolloutFinished, new_id
from artstore.groups import group_stream
from artstore.names import check_name
from artstore.redaction import Redactor
from artstore.schema import tables as t
from artstore.serve import tokens
from artstore.serve.errors import Refused
from artstore.workers.claims import rollout_check
from artstore.workers.worker import abandon_rollout

# Why an attempt ended when a new rollout resumed it (its agent started again).
RESUMED = "a new rollout resumes this one: its agent started again"

if TYPE_CHECKING:
    from artstore.store import Store


class AgentFailure(Exception):
    """What an agent reported as the reason its rollout failed (`POST .../fail`)."""

    @staticmethod
    def named(error_type: str, message: str) -> AgentFailure:
        """An AgentFailure whose type is named `error_type`, as `rollout.failed` records it
        (the recorder names an exception's type, as for one raised in-process)."""
        kind = type(error_type[:100] or "AgentError", (AgentFailure,), {})
        return kind(message)


@dataclass
class Served:
    """One rollout served here: its recorder, run, group and token."""

    recorder: Rollout
    run: str
    group_id: str
    token_hash: str
    calls: set[asyncio.Task] = field(default_factory=set)  # relayed now
    ending: bool = False
    check: Any = None  # a worker's claim: its end is written only while the lease holds


class Rollouts:
    """The rollouts this process serves, by id and by the hash of their token."""

    def __init__(self, store: Store, upstream: str, lease_s: float) -> None:
        self.store = store
        self.upstream = upstream
        self.lease_s = lease_s
        self.by_id: dict[str, Served] = {}
        self.by_token: dict[str, Served] = {}

    async def start(self, run: str, body: dict[str, Any]) -> tuple[Served, str]:
        """Start a rollout in `run` from the API's JSON body; (it, its token)."""
        model = body.get("model")
        if not isinstance(model, str) or not model:
            raise Refused(400, "invalid_request", "`model` must be the model's name (a string)")
        group_id = body.get("group_id") or new_id()
        role = body.get("role", "policy")
        try:
            check_name("group_id", group_id)
            check_json("scenario", body.get("scenario"))
            if role not in ("policy", "validation"):
                raise InvalidArgumentError("role", "must be policy or validation")
            index, served_name = body.get("scenario_index"), body.get("inference_model_name")
            if index is not None and (not isinstance(index, int) or isinstance(index, bool)):
                raise InvalidArgumentError("scenario_index", "must be a whole number")
            check_name("inference_model_name", served_name, optional=True)
        except (InvalidArgumentError, ValueError) as exc:
            raise Refused(400, "invalid_request", _first_line(exc)) from None
        replay = await self._replay_of(run, body.get("resumes"))
        rollout_id = new_id()
        token = await tokens.create_token(
            self.store,
            run=run,
            scope="write",
            kind="rollout",
            rollout_id=rollout_id,
            lease_s=self.lease_s,
        )
        described = SimpleNamespace(
            name=model,
            inference_base_url=self.upstream,
            inference_api_key=None,
            inference_model_name=body.get("inference_model_name") or model,
        )
        recorder = open_rollout(
            self.store.events,
            described,
            scenario=body.get("scenario"),
            run=run,
            group_id=group_id,
            scenario_index=body.get("scenario_index"),
            role=role,
            rollout_id=rollout_id,
            replay=replay,
        )
        return await self._serve(recorder, run, group_id, token), token

    async def _replay_of(self, run: str, resumes: Any) -> Replay | None:
        """The calls of the attempt a new rollout resumes (`resumes`: a rollout of `run`
        that did not finish), to serve back; that attempt, if still running, ends first:
        failed here if this process serves it, else recorded as abandoned."""
        if resumes is None:
            return None
        try:
            check_name("resumes", resumes)
        except (InvalidArgumentError, ValueError) as exc:
            raise Refused(400, "invalid_request", _first_line(exc)) from None
        row = await rollout_row(self.store, resumes)
        if row is None or row.run != run:
            raise Refused(404, "not_found", f"run {run!r} has no rollout {resumes!r} to resume")
        if row.status == "finished":
            raise Refused(409, "rollout_finished", f"rollout {resumes} finished: nothing to resume")
        earlier = self.by_id.get(resumes)
        if earlier is not None and not earlier.ending:
            await self.fail(earlier, {"error": {"type": "RolloutResumed", "message": RESUMED}})
        elif row.status == "running":
            await abandon_rollout(self.store, resumes, RESUMED)
        return await load_replay(self.store.events, rollout_stream(resumes), resumes)

    async def start_claimed(
        self, claim: Any, settings: dict[str, Any], scenario: Any, resumes: str | None = None
    ) -> tuple[Served, str]:
        """Start the rollout of a worker's claimed slot, fenced by the claim: its start,
        finish and failure are written only while the claim's lease holds. `resumes`: the
        slot's earlier rollout, abandoned, whose recorded answers are served back."""
        replay = None
        if resumes is not None:
            replay = await load_replay(self.store.events, rollout_stream(resumes), resumes)
        token = await tokens.create_token(
            self.store,
            run=claim.run,
            scope="write",
            kind="rollout",
            rollout_id=claim.rollout_id,
            lease_s=self.lease_s,
        )
        described = SimpleNamespace(
            name=settings["name"],
            inference_base_url=self.upstream,
            inference_api_key=None,
            inference_model_name=settings.get("inference_model_name") or settings["name"],
        )
        check = rollout_check(claim)
        recorder = open_rollout(
            self.store.events,
            described,
            scenario=scenario,
            run=claim.run,
            group_id=claim.group_id,
            scenario_index=claim.scenario_index,
            role=claim.role,
            policy_step=claim.policy_step if claim.role == "policy" else None,
            rollout_id=claim.rollout_id,
            check=check,
            replay=replay,
        )
        return await self._serve(recorder, claim.run, claim.group_id, token, check), token

    async def forget(self, rollout_id: str) -> None:
        """Stop serving a rollout recorded as ended elsewhere (abandoned, given back)."""
        served = self.by_id.get(rollout_id)
        if served is not None and not served.ending:
            served.ending = True
            served.recorder.end_open_calls()
            served.recorder.closed = True
            await self._ended(served)

    async def _serve(
        self, recorder: Rollout, run: str, group_id: str, token: str, check: Any = None
    ) -> Served:
        # Its token is cleaned from what it records, not learned by the whole process.
        recorder.redact = Redactor(own=[token])
        served = Served(recorder, run, group_id, tokens.token_hash(token), check=check)
        self.by_id[recorder.id] = served
        self.by_token[served.token_hash] = served
        try:
            await recorder.settle()  # acknowledged once `rollout.started` is stored
        except BaseException:
            self._forget(served)
            with contextlib.suppress(Exception):  # a refused start leaves no live token
                await tokens.end_rollout_tokens(self.store, recorder.id)
            raise
        return served

    def get(self, rollout_id: str) -> Served | None:
        return self.by_id.get(rollout_id)

    async def finish(self, served: Served, body: dict[str, Any]) -> None:
        """`rollout.finished` with the result, metrics and logs; rewards before it."""
        rewards, result = _rewards(body.get("rewards")), body.get("result")
        metrics, metadata = _mapping(body, "metrics"), _mapping(body, "metadata")
        logs = _lines(body.get("logs"))
        try:
            check_json("result", result)
            RolloutFinished(
                rollout_id=served.recorder.id,
                duration_s=0.0,
                result=result,
                metrics=metrics,
                metadata=metadata,
                logs=logs,
            )
        except (InvalidArgumentError, ValueError) as exc:
            raise Refused(400, "invalid_request", _first_line(exc)) from None
        recorder = served.recorder
        await self._end(served)
        recorder.result = result
        recorder.metrics.update(metrics)
        recorder.metadata.update(metadata)
        recorder.logs.extend(logs)
        try:
            for scorer, reward in rewards.items():
                scored = RewardsRecorded(
                    group_id=served.group_id, scorer=scorer, rewards={recorder.id: reward}
                )
                await self.store.append(group_stream(served.group_id), [scored])
            await recorder.finish(served.check)
        except BaseException as exc:
            await recorder.fail(exc, served.check)
            raise
        finally:
            await self._ended(served)

    async def fail(self, served: Served, body: dict[str, Any]) -> None:
        """`rollout.failed` with the error the agent reports."""
        error = body.get("error")
        if isinstance(error, dict):
            error_type, message = error.get("type"), error.get("message")
        else:
            error_type, message = "AgentError", error
        if not isinstance(message, str) or not message:
            raise Refused(400, "invalid_request", "`error` must be a message (or type+message)")
        served.recorder.logs.extend(_lines(body.get("logs")))
        await self._end(served)
        try:
            await served.recorder.fail(
                AgentFailure.named(str(error_type or "AgentError"), message), served.check
            )
        finally:
            await self._ended(served)

    async def stop(self, reason: str) -> None:
        """Every rollout still open fails with `reason` (the server is stopping)."""
        for served in list(self.by_id.values()):
            if served.ending:
                continue
            await self._end(served)
            try:
                await served.recorder.fail(
                    AgentFailure.named("ServerStopped", reason), served.check
                )
            finally:
                await self._ended(served)

    async def _end(self, served: Served) -> None:
        """No new calls; the calls being relayed end first (a stream: as incomplete)."""
        if served.ending:
            raise Refused(409, "rollout_ended", f"rollout {served.recorder.id} has ended")
        served.ending = True
        recorder = served.recorder
        recorder.end_open_calls()
        recorder.closed = True
        if served.calls:
            await asyncio.wait(list(served.calls))

    async def _ended(self, served: Served) -> None:
        self._forget(served)
        await tokens.end_rollout_tokens(self.store, served.recorder.id)

    def _forget(self, served: Served) -> None:
        self.by_id.pop(served.recorder.id, None)
        self.by_token.pop(served.token_hash, None)


async def rollout_row(store: Store, rollout_id: str) -> Any:
    """The rollouts projection's row of a rollout (status, run), or None."""
    query = select(t.rollouts.c.rollout_id, t.rollouts.c.run, t.rollouts.c.status).where(
        t.rollouts.c.rollout_id == rollout_id
    )
    async with store.database.read() as connection:
        return (await connection.execute(query)).first()


def _rewards(value: Any) -> dict[str, float]:
    """Rewards by scorer, checked: {scorer name: number}."""
    value = value or {}
    if not isinstance(value, dict) or not all(
        isinstance(v, int | float) and not isinstance(v, bool) for v in value.values()
    ):
        raise Refused(400, "invalid_request", "`rewards` must map scorer names to numbers")
    try:
        for scorer in value:
            check_name("scorer", scorer)
    except (InvalidArgumentError, ValueError) as exc:
        raise Refused(400, "invalid_request", _first_line(exc)) from None
    return {scorer: float(reward) for scorer, reward in value.items()}


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def _mapping(body: dict[str, Any], key: str) -> dict[str, Any]:
    value = body.get(key) or {}
    if not isinstance(value, dict):
        raise Refused(400, "invalid_request", f"`{key}` must be an object")
    return value


def _lines(value: Any) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(line, str) for line in value):
        raise Refused(400, "invalid_request", "`logs` must be a list of strings")
    return value
