"""A child process that archives or restores a run and SIGKILLs itself at a named step.

`run_killed(command, url, target, run, point)`: `command` is "archive" or "restore";
`point` is `STEP:N`, the Nth time the library reports STEP (`on_step` of
`artstore.archive.archive_run` / `restore_run`). Nothing in artstore knows of the kill:
it comes from the step callback, the way tests/support/crash_points.py injects its points.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections import Counter

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import artstore
from artstore.archive import archive_run, restore_run

ARCHIVE_POINTS = [
    "read:1",
    "segment:1",
    "segment:2",
    "manifest:1",
    "verified:1",
    "removed:1",  # inside the transaction that deletes, before it commits
    "committed:1",
]
RESTORE_POINTS = ["read:1", "restored:1", "committed:1"]


def run_killed(command: str, url: str, target: str, run: str, point: str) -> None:
    step, _, nth = point.partition(":")
    seen: Counter[str] = Counter()

    def on_step(name: str) -> None:
        seen[name] += 1
        if (name, seen[name]) == (step, int(nth)):
            os.kill(os.getpid(), signal.SIGKILL)

    async def main() -> None:
        async with await artstore.open_store(url, create=False) as store:
            work = archive_run if command == "archive" else restore_run
            await work(store, run, target, on_step=on_step)

    asyncio.run(main())
