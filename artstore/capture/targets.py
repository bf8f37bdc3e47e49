"""What the HTTP capture records a call into, and where it finds the caller's.

A call is recorded into the rollout whose block the caller runs in (`artstore.capture.rollout`)
or else into the group being rolled out (`artstore.capture.group`). Both are a `CallTarget`;
the HTTP capture (`artstore.capture.http`) knows them only through this module, so that
neither of them and the capture import each other.
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from artstore.art_versions import captured_exchanges
from artstore.errors import CallAbandonedError

if TYPE_CHECKING:
    from artstore.events import LLMCall
    from artstore.redaction import Redactor

#: The rollout whose block the caller runs in (a `Rollout`), if any.
CURRENT_ROLLOUT: contextvars.ContextVar[CallTarget | None] = contextvars.ContextVar(
    "artstore_current_rollout", default=None
)
#: The group capture the caller runs in (a `GroupCapture`), if any.
CURRENT_GROUP: contextvars.ContextVar[CallTarget | None] = contextvars.ContextVar(
    "artstore_current_group", default=None
)


def current_target() -> CallTarget | None:
    """Where a call made now is recorded: the current rollout, else the open group capture."""
    rollout = CURRENT_ROLLOUT.get()
    if rollout is not None:
        return rollout
    group = CURRENT_GROUP.get()
    return group if group is not None and not group.closed else None


_ABANDONED = "the rollout ended before this call's response arrived"


class CallTarget:
    """What the HTTP capture (`artstore.capture.http`) records a call into: a rollout, or
    the calls of a group being rolled out (`artstore.capture.group`).

    The capture builds each call's event in the thread that saw it end and hands it to
    `submit_call`; `origin` is the asyncio task that sent the request (None in a thread).
    """

    id: str
    redact: Redactor
    closed: bool

    def __init__(self) -> None:
        self.numbering = threading.Lock()  # calls are numbered by whatever thread records
        self._claimed_exchanges: set[int] = set()  # ART exchanges matched to a call
        self.open_calls: set[Any] = set()  # HTTP calls whose response is not complete yet
        # The earlier attempt whose calls are served back: an `artstore.capture.replay`
        # Replay (not imported here: that module records into targets).
        self.replay: Any = None

    def submit_call(
        self,
        make: Callable[[], tuple[LLMCall, dict[str, str], list[str]]],
        origin: asyncio.Task | None = None,
    ) -> asyncio.Future | None:
        raise NotImplementedError

    def capture_failed(self, error: Exception) -> None:
        raise NotImplementedError

    def submit_event(self, event: Any) -> None:
        """Queue another event of the target's stream, from its task or any thread."""
        raise NotImplementedError

    def claim_art_exchange(self, trajectory: Any, endpoint: str, response_id: str | None):
        """The exchange ART captured for this call (the newest unclaimed one with its id)."""
        with self.numbering:
            for exchange in reversed(captured_exchanges(trajectory, endpoint)):
                if id(exchange) in self._claimed_exchanges:
                    continue
                if getattr(exchange.response, "id", None) == response_id:
                    self._claimed_exchanges.add(id(exchange))
                    return exchange
        return None

    def end_open_calls(self) -> None:
        """Calls still open when the block exits, recorded as calls that did not complete:
        a stream nobody read to its end, a request still waiting for its response (the
        server got it, and may have generated its answer: it is part of the record)."""
        with self.numbering:
            open_calls, self.open_calls = list(self.open_calls), set()
        for call in open_calls:
            waiting = call.status is None
            call.finish(CallAbandonedError(_ABANDONED) if waiting else None)
