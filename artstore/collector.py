"""Python's cyclic garbage collector, paused while artstore builds many objects at once.

Rebuilding trajectories creates hundreds of thousands of small objects that outlive the
call (one `ChatCompletionTokenLogprob`, its dict, its field set and two lists per output
token), and no cycles among them. Left on, the collector runs a full collection each
time the survivors grow by a quarter of the heap: a rebuild of 64 six-call rollouts in a
process already holding ~600k objects ran three, ~80% of its time (cProfile and
`gc.callbacks`, 2026-12-01). Paused, it runs none during the build; once resumed it runs
the collections those objects are due (young generations first, then at most one full
one) at its next threshold, as for any other allocation.

The store's writer pauses it too while it builds and projects one batch (rows, recorded
events and projection rows that all live until the batch commits): recording a
10,000-rollout run spent 5-10% less CPU (tools/bench_queries.py, 2026-12-01).
The collector is process-wide: while paused in the writer's thread, other threads
allocate without collections too, for at most one transaction; the counts carry on, so
the collections they are due run as soon as it resumes.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_lock = threading.Lock()
_depth = 0  # rebuilds now inside `collector_paused` (threads may overlap)
_was_enabled = False  # the collector's state when the first of them began


@contextmanager
def collector_paused() -> Iterator[None]:
    """No automatic collection inside; the collector's earlier state restored after.

    Only for synchronous code: an `await` inside would pause it for every other task too.
    """
    global _depth, _was_enabled
    with _lock:
        if _depth == 0:
            _was_enabled = gc.isenabled()
            gc.disable()
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0 and _was_enabled:
                gc.enable()
