"""Tools whose results are recorded and served back when a rollout is resumed.

    @artstore.recorded_tool
    async def run_in_sandbox(command: str) -> str: ...

By default a resumed rollout (`artstore.capture.replay`) runs the agent's tools again:
they are the agent's own code, and most are cheap and pure. A tool with side effects or
a cost (a sandbox, a paid API, a write) is wrapped in `recorded_tool`: inside a rollout,
each call's result is recorded as a `tool.called` event; in a rollout that resumes an
earlier attempt, the n-th call of a recorded tool is answered with the result the earlier
attempt recorded for its n-th one if the name and arguments are the same (their
fingerprint: `sha256:` of the canonical JSON of `[name, arguments]`), without running the
tool. The first call that differs runs the tool, and so does every later one. Outside a
rollout the tool simply runs.

Arguments and results must be JSON (they are stored, secrets redacted). A call that
raised is recorded with its error and never served back: it runs again.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from artstore.capture.targets import CURRENT_ROLLOUT
from artstore.events import ToolCalled, new_event_id, new_id
from artstore.eventstore.blobs import canonical_json

F = TypeVar("F", bound=Callable[..., Any])


def tool_fingerprint(name: str, arguments: Any) -> str:
    """`sha256:` of the canonical JSON of `[name, arguments]`."""
    return "sha256:" + hashlib.sha256(canonical_json([name, arguments]).encode()).hexdigest()


class ToolReplay:
    """An earlier attempt's tool results, handed out in order until a call differs."""

    def __init__(self, recorded: list[ToolCalled]) -> None:
        self.recorded = [r for r in recorded if r.error_type is None]
        self.position = 0
        self.live = False
        self._lock = threading.Lock()

    def take(self, fingerprint: str) -> ToolCalled | None:
        with self._lock:
            if self.live or self.position >= len(self.recorded):
                self.live = True
                return None
            found = self.recorded[self.position]
            if found.fingerprint != fingerprint:
                self.live = True
                return None
            self.position += 1
            return found


def recorded_tool(function: F | None = None, *, name: str | None = None) -> F:
    """`function` (sync or async) with its results recorded and served back on replay."""
    if function is None:
        return functools.partial(recorded_tool, name=name)  # type: ignore[return-value]
    tool_name = name or getattr(function, "__name__", "tool")
    signature = inspect.signature(function)

    def arguments_of(args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        bound = signature.bind(*args, **kwargs)
        return dict(bound.arguments)

    if inspect.iscoroutinefunction(function):

        @functools.wraps(function)
        async def run_async(*args: Any, **kwargs: Any) -> Any:
            call = _ToolCall.begin(tool_name, arguments_of(args, kwargs))
            if call is None or call.served is not None:
                return call.served.result if call else await function(*args, **kwargs)
            try:
                result = await function(*args, **kwargs)
            except Exception as exc:
                call.failed(exc)
                raise
            call.returned(result)
            return result

        return run_async  # type: ignore[return-value]

    @functools.wraps(function)
    def run(*args: Any, **kwargs: Any) -> Any:
        call = _ToolCall.begin(tool_name, arguments_of(args, kwargs))
        if call is None or call.served is not None:
            return call.served.result if call else function(*args, **kwargs)
        try:
            result = function(*args, **kwargs)
        except Exception as exc:
            call.failed(exc)
            raise
        call.returned(result)
        return result

    return run  # type: ignore[return-value]


class _ToolCall:
    """One call of a recorded tool inside a rollout: served from the record, or run."""

    def __init__(self, rollout: Any, name: str, arguments: Any, fingerprint: str) -> None:
        self.rollout = rollout
        self.name = name
        self.arguments = arguments
        self.fingerprint = fingerprint
        self.served: ToolCalled | None = None

    @classmethod
    def begin(cls, name: str, arguments: dict[str, Any]) -> _ToolCall | None:
        rollout = CURRENT_ROLLOUT.get()
        if rollout is None or rollout.closed or not hasattr(rollout, "tool_replay"):
            return None
        stored = rollout.stored_json(arguments, f"arguments of tool {name}")
        call = cls(rollout, name, stored, tool_fingerprint(name, stored))
        replay = rollout.tool_replay
        found = replay.take(call.fingerprint) if replay is not None else None
        if found is not None:
            call.served = found
            call._record(
                found.model_copy(
                    update={
                        "event_id": new_event_id(),
                        "call_id": new_id(),
                        "replayed_from": found.call_id,
                    }
                )
            )
        return call

    def returned(self, result: Any) -> None:
        stored = self.rollout.stored_json(result, f"result of tool {self.name}")
        self._record(self._event(result=stored))

    def failed(self, exc: Exception) -> None:
        message = self.rollout.redact(str(exc) or repr(exc))
        self._record(self._event(error_type=type(exc).__name__, error_message=message))

    def _event(self, **fields: Any) -> ToolCalled:
        return ToolCalled(
            call_id=new_id(),
            index=0,
            name=self.name,
            fingerprint=self.fingerprint,
            arguments=self.arguments,
            **fields,
        )

    def _record(self, event: ToolCalled) -> None:
        self.rollout.submit_event(self.rollout.number_tool_call(event))
