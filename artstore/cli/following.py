"""`artstore export RUN --otlp-endpoint URL --follow`: a run's rollouts sent as they end.

It runs until SIGINT (Ctrl-C) or SIGTERM, finishes the request in flight, and says how far
it got: the position `--after` takes to resume without sending anything again. A request
the endpoint refuses (after the exporter's own retries) ends it with an error, after the
same line.
"""

from __future__ import annotations

import asyncio
import signal
from typing import Any

from artstore.cli.output import counted
from artstore.cli.shared import err_console


async def follow(
    run_name: str, endpoint: str, url: str | None, *, after: int | None, new_only: bool
) -> None:
    import artstore
    from artstore.exchange import FollowSummary, follow_otlp
    from artstore.exchange.source import run_scorer

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    async with await artstore.open_store(url, read_only=True) as store:
        await run_scorer(store, run_name)  # a run that is not there: its error alone
        if new_only:
            after = await store.last_position()
        _say_following(run_name, endpoint, after)
        reached = [FollowSummary(run=run_name, endpoint=endpoint, position=after or 0)]

        def sent(summary: FollowSummary, count: int) -> None:
            reached[0] = summary
            _say_sent(summary, count)

        try:
            reached[0] = await follow_otlp(
                store, run_name, endpoint, after=after, stop=stop, sent=sent
            )
        finally:  # a request refused too: where to resume from, before the error's line
            _say_stopped(reached[0])


def _say_following(run_name: str, endpoint: str, after: int | None) -> None:
    what = (
        "the rollouts that have ended, then each as it ends,"
        if after is None
        else f"each rollout that ends after position {after}"
    )
    err_console.print(
        f"following run {run_name!r}: sending {what} to {endpoint} (Ctrl-C stops)",
        highlight=False,
        soft_wrap=True,
    )


def _say_sent(summary: Any, count: int) -> None:
    err_console.print(
        f"sent {counted(count, 'rollout')} ({summary.rollouts} in all), "
        f"up to position {summary.position}",
        highlight=False,
    )


def _say_stopped(summary: Any) -> None:
    failed = f", {summary.failed_rollouts} of them failed" if summary.failed_rollouts else ""
    err_console.print(
        f"stopped: sent {counted(summary.rollouts, 'rollout')} of run {summary.run!r} to "
        f"{summary.endpoint}{failed}; up to position {summary.position} "
        f"(--after {summary.position} resumes from there)",
        highlight=False,
        soft_wrap=True,
    )
