"""The LLM calls made while a whole group is rolled out, each given to its trajectory.

ART's `PipelineTrainer` calls a rollout function that returns a whole `TrajectoryGroup`
(`make_group_rollout_fn` runs a one-rollout function N times side by side; a function
may also ask once with `n=N` and share the choices out): there is no block per rollout
for the calls to be recorded in. Inside `capture_group(model)`, the HTTP capture
(`artstore.capture.http`) records every call as a rollout's block does, each with the
asyncio task that sent it; once the group is back, `capture.attribute(trajectories)`
says which trajectory each call belongs to:

1. the trajectory whose answer it is: ART captured its response into the trajectory's
   exchanges (the same response id), or the trajectory holds a `Choice` of its response
   (`matching.choice_key`; each Choice is the answer of one call);
2. else the trajectory of the other calls its task made (with `make_group_rollout_fn`,
   each rollout is a task of its own): a failed call, a retry, an answer the agent did
   not keep. The next such call in time decides, else the last one before;
3. else none (a rollout that failed, the group function's own calls): such calls are
   kept apart, by task, for rollouts of their own that are recorded as failed.

A call made inside a rollout's block (the rollout function records its rollouts with
`store.rollout`, `durable_rollouts` or `wrap_rollout`) is that rollout's, not the group's.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from artstore.art_versions import EXCHANGE_ENDPOINTS, captured_exchanges, has_exchange_data
from artstore.capture import http
from artstore.capture.matching import choice_key
from artstore.capture.targets import CURRENT_GROUP, CallTarget
from artstore.documents import exchanges
from artstore.errors import NoRolloutError
from artstore.events import LLMCall
from artstore.redaction import Redactor


def current_group() -> GroupCapture | None:
    """The group capture the caller runs in, if any (and it is still open)."""
    found = CURRENT_GROUP.get()
    return found if found is not None and not found.closed else None


@dataclass
class CapturedCall:
    """One call: its `llm.call` event (index 0 until recorded), its blobs, its task."""

    event: LLMCall
    blobs: dict[str, str]
    origin: asyncio.Task | None


@dataclass
class GroupCalls:
    """The calls of each trajectory (by its position in the group), and the others by task."""

    of_trajectory: dict[int, list[CapturedCall]] = field(default_factory=dict)
    unattributed: list[list[CapturedCall]] = field(default_factory=list)


class GroupCapture(CallTarget):
    """The calls made inside `capture_group`, kept in memory until the group is recorded."""

    def __init__(self, model: Any) -> None:
        super().__init__()
        self.id = "(the rollouts of a group)"  # in log lines
        key = getattr(model, "inference_api_key", None)
        self.redact = Redactor([key], urls=[getattr(model, "inference_base_url", None)])
        self.closed = False
        self.calls: list[CapturedCall] = []
        self.error: Exception | None = None  # a call that could not be recorded

    def submit_call(
        self,
        make: Callable[[], tuple[LLMCall, dict[str, str], list[str]]],
        origin: asyncio.Task | None = None,
    ) -> None:
        if self.closed:
            raise NoRolloutError("the group's rollout function has returned")
        event, blobs, _ = make()
        with self.numbering:
            self.calls.append(CapturedCall(event, blobs, origin))

    def capture_failed(self, error: Exception) -> None:
        if self.error is None:
            self.error = error

    def attribute(self, trajectories: Sequence[Any]) -> GroupCalls:
        """Which trajectory each call belongs to (see the module docstring)."""
        owners = _answers(self.calls, trajectories)
        answered = dict(owners)
        for position, call in enumerate(self.calls):
            if position in owners or call.origin is None:
                continue
            same_task = [p for p in answered if self.calls[p].origin is call.origin]
            later = [p for p in same_task if p > position]
            if same_task:
                owners[position] = answered[min(later) if later else max(same_task)]
        found = GroupCalls()
        by_task: dict[Any, list[CapturedCall]] = {}
        for position, call in enumerate(self.calls):
            if position in owners:
                found.of_trajectory.setdefault(owners[position], []).append(call)
            else:
                by_task.setdefault(call.origin, []).append(call)
        found.unattributed = list(by_task.values())
        return found


@asynccontextmanager
async def capture_group(model: Any) -> AsyncIterator[GroupCapture]:
    """Capture the LLM calls made inside the block (see the module docstring).

    A call that could not be recorded is raised when the block exits, as a rollout's is.
    """
    http.install()
    capture = GroupCapture(model)
    token = CURRENT_GROUP.set(capture)
    try:
        yield capture
    finally:
        CURRENT_GROUP.reset(token)
        capture.end_open_calls()  # streams nobody read to the end: calls that did not complete
        capture.closed = True
    if capture.error is not None:
        raise capture.error


def _answers(calls: list[CapturedCall], trajectories: Sequence[Any]) -> dict[int, int]:
    """Call position -> trajectory, for the calls whose answer a trajectory holds."""
    slots: dict[str, list[int]] = {}  # key -> a trajectory per answer of it, unclaimed
    for index, trajectory in enumerate(trajectories):
        for key in _answer_keys(trajectory):
            slots.setdefault(key, []).append(index)
    owners: dict[int, int] = {}
    task_of: dict[Any, int] = {}  # a task's first trajectory: where its twins go first
    for position, call in enumerate(calls):
        for key in _call_keys(call):
            candidates = slots.get(key)
            if not candidates:
                continue
            preferred = task_of.get(call.origin)
            index = preferred if preferred in candidates else candidates[0]
            candidates.remove(index)
            owners[position] = index
            if call.origin is not None:
                task_of.setdefault(call.origin, index)
            break
    return owners


def _answer_keys(trajectory: Any) -> list[str]:
    """The keys of the answers a trajectory holds: its Choices, its exchanges' responses."""
    from openai.types.chat.chat_completion import Choice

    histories = [trajectory.messages_and_choices]
    histories += [h.messages_and_choices for h in trajectory.additional_histories]
    keys = [f"choice:{choice_key(i)}" for h in histories for i in h if isinstance(i, Choice)]
    if has_exchange_data(trajectory):
        for endpoint in EXCHANGE_ENDPOINTS:
            for exchange in captured_exchanges(trajectory, endpoint):
                response_id = getattr(exchange.response, "id", None)
                if isinstance(response_id, str):
                    keys.append(f"id:{response_id}")
    return keys


def _call_keys(call: CapturedCall) -> list[str]:
    """The keys of a call's answer: its response id, then each choice of its response."""
    event = call.event
    if event.output is None or event.error_type is not None:
        return []  # a failed call answered nothing
    document = json.loads(call.blobs[event.output])
    keys = [f"id:{found}"] if (found := exchanges.response_id(document)) else []
    if event.endpoint != "chat_completions":
        return keys
    request = json.loads(call.blobs[event.request]) if event.request else {}
    try:
        completion = exchanges.chat_completion(
            document, art_client=event.art_client, request_model=request.get("model")
        )
    except Exception:  # a response no client could read: no Choice came of it
        return keys
    return keys + [f"choice:{choice_key(choice)}" for choice in completion.choices]
