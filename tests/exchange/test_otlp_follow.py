"""`artstore export RUN --otlp-endpoint URL --follow`, on SQLite and on PostgreSQL.

The follower runs as a real subprocess against an OTLP/HTTP receiver in the test: it sends
the rollouts that had ended, then each rollout as it finishes or fails (another run's
rollouts and events that end nothing are not sent), stops cleanly on SIGINT and on SIGTERM
with a last line giving the position it got to, and started again `--after` that position
sends only what ended since. No span is sent twice, the spans are those of the file export,
and the store is never written. In-process, `ended_rollouts` (what the follower reads)
yields the rollouts that end after a position, or those that had ended first.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

from command_line import run_artstore
from otlp_receiver import receiver
from sqlalchemy import func, select
from waiting import eventually

import artstore
from artstore.events import (
    GroupSealed,
    RewardsRecorded,
    RolloutFailed,
    RolloutFinished,
    RolloutStarted,
    RunStarted,
)
from artstore.exchange.following import EndedRollouts, ended_rollouts
from artstore.exchange.otlp import export_otlp, trace_id_of
from artstore.schema import tables as t

RUN = "p/live"
OTHER = "p/other"


async def record(store, run: str, *rollout_ids: str, group: str | None = None) -> None:
    """Rollouts of `run` that end at once: those whose id ends in x fail."""
    if await store.stream_version(f"run-{run}") == 0:
        project, _, model = run.partition("/")
        started = RunStarted(
            run=run, project=project, model=model, base_model="base", config={},
            scenarios=[], scorer="correct", trainer="host:1",
        )  # fmt: skip
        await store.append(f"run-{run}", [started])
    for rid in rollout_ids:
        start = RolloutStarted(
            rollout_id=rid, run=run, group_id=group, model="agent",
            started_at=datetime.now(UTC),
        )  # fmt: skip
        end = (
            RolloutFailed(
                rollout_id=rid, error_type="E", error_message="broke", traceback="", duration_s=1
            )
            if rid.endswith("x")
            else RolloutFinished(rollout_id=rid, duration_s=1.0)
        )
        await store.append(f"rollout-{rid}", [start, end])


async def stored_rows(url: str) -> dict[str, int]:
    """The rows of every table, read through a read-only store."""
    async with await artstore.open_store(url, read_only=True) as store:
        async with store.database.read() as connection:
            return {
                table.name: (
                    await connection.execute(select(func.count()).select_from(table))
                ).scalar()
                for table in t.metadata.sorted_tables
            }


def follower(url: str, endpoint: str, log: Path, *options: str) -> subprocess.Popen:
    command = "from artstore.cli import main; main()"
    return subprocess.Popen(
        [sys.executable, "-c", command, "export", RUN, "--otlp-endpoint", endpoint,
         "--follow", *options, "--url", url],
        stdout=subprocess.DEVNULL, stderr=log.open("w"), env={**os.environ, "COLUMNS": "400"},
    )  # fmt: skip


def stopped(process: subprocess.Popen, how: signal.Signals, log: Path) -> str:
    """Its last line, once `how` stopped it (cleanly: exit 0)."""
    process.send_signal(how)
    assert process.wait(timeout=120) == 0, log.read_text()
    return " ".join(log.read_text().splitlines()[-1].split())


def traces(*rollout_ids: str) -> list[str]:
    return [f"{trace_id_of(rid):032x}" for rid in rollout_ids]


async def test_follow_sends_each_rollout_once_as_it_ends(database_url: str, tmp_path: Path):
    log = tmp_path / "follow.log"
    async with await artstore.open_store(database_url) as store:
        await record(store, RUN, "a1", group="g")
        await record(store, RUN, "a2x")
        await record(store, OTHER, "o1")
        with receiver() as (endpoint, received):
            before = await stored_rows(database_url)
            process = follower(database_url, endpoint, log)
            try:
                await eventually(lambda: len(received.roots()) >= 2, "the ended rollouts")
                assert sorted(received.roots()) == sorted(traces("a1", "a2x"))
                assert await stored_rows(database_url) == before  # the catch-up wrote nothing

                await record(store, RUN, "b1", group="g")
                await record(store, OTHER, "o2")
                await store.append("group-g", [_rewards(), _sealed()])  # ends no rollout
                await record(store, RUN, "b2x")
                await eventually(lambda: len(received.roots()) >= 4, "the rollouts as they end")
                written = await stored_rows(database_url)
                last = stopped(process, signal.SIGINT, log)
            finally:
                process.kill()
            assert await stored_rows(database_url) == written
            position = await store.last_position()
            assert last == (
                f"stopped: sent 4 rollouts of run {RUN!r} to {endpoint}, 2 of them failed; up to "
                f"position {position} (--after {position} resumes from there)"
            )

            await record(store, RUN, "c1")  # while no follower runs
            again = follower(database_url, endpoint, log, "--after", str(position))
            try:
                await eventually(lambda: len(received.roots()) >= 5, "the rollout ended since")
                stopped(again, signal.SIGTERM, log)
            finally:
                again.kill()
    sent = traces("a1", "a2x", "b1", "b2x", "c1")
    assert sorted(received.roots()) == sorted(sent)  # each once, the other run's never
    assert len(set(received.spans)) == len(received.spans)
    assert set(received.spans) == await _exported_spans(database_url, tmp_path)


async def test_ended_rollouts_yields_those_that_ended_then_each_as_it_ends(store):
    await record(store, RUN, "a1", group="g")
    await record(store, OTHER, "o1")
    start = await store.last_position()  # what --new-only starts from
    stop = asyncio.Event()
    batches: list[EndedRollouts] = []

    async def follow() -> None:
        async for batch in ended_rollouts(store, RUN, after=start, stop=stop, poll_s=0.05):
            batches.append(batch)

    def ended() -> list[tuple[str, str | None]]:
        return [rid_and_group for batch in batches for rid_and_group in batch.rollouts.items()]

    following = asyncio.create_task(follow())
    await record(store, RUN, "b1", group="g")
    await record(store, OTHER, "o2")
    await record(store, RUN, "b2x")
    await eventually(lambda: len(ended()) >= 2, "the rollouts that ended after the start")
    stop.set()
    await asyncio.wait_for(following, 60)
    assert ended() == [("b1", "g"), ("b2x", None)]  # the other run's left out
    assert batches[-1].position == await store.last_position()

    caught_up = ended_rollouts(store, RUN)  # no position: those that ended, first
    first = await anext(caught_up)
    await caught_up.aclose()
    assert first.rollouts == {"a1": "g", "b1": "g", "b2x": None}
    assert first.position == await store.last_position()


def test_a_refused_request_ends_the_follower_saying_where_to_resume(database_url: str):
    async def recorded() -> None:
        async with await artstore.open_store(database_url) as store:
            await record(store, RUN, "a1")

    asyncio.run(recorded())
    with receiver(refusing=True) as (endpoint, received):
        result = run_artstore(
            "export", RUN, "--otlp-endpoint", endpoint, "--follow", "--url", database_url
        )
        missing = run_artstore(
            "export", "p/none", "--otlp-endpoint", endpoint, "--follow", "--url", database_url
        )
    assert result.exit_code == 1, result.output
    lines = [" ".join(line.split()) for line in result.stderr.splitlines()]
    assert lines[-2:] == [
        f"stopped: sent 0 rollouts of run {RUN!r} to {endpoint}; up to position 0 "
        "(--after 0 resumes from there)",
        f"error: {endpoint}: the OTLP/HTTP endpoint refused the spans",
    ]
    assert received.roots() == traces("a1")  # tried once, refused
    assert missing.exit_code == 1
    assert " ".join(missing.stderr.split()) == (
        "error: no run 'p/none' in this store (see `artstore runs`)"
    )


def _rewards() -> RewardsRecorded:
    return RewardsRecorded(group_id="g", scorer="correct", rewards={"a1": 1.0, "b1": 0.5})


def _sealed() -> GroupSealed:
    return GroupSealed(group_id="g", run=RUN, rollout_ids=["a1", "b1"])


async def _exported_spans(url: str, tmp_path: Path) -> set[tuple[str, str, str, str]]:
    """The spans `export_otlp` writes to a file, as the receiver keeps them."""
    out = tmp_path / "run.otlp.jsonl"
    async with await artstore.open_store(url, read_only=True) as store:
        await export_otlp(store, RUN, out)
    return {
        (span["traceId"], span["spanId"], span["name"], span.get("parentSpanId", ""))
        for line in out.read_text().splitlines()
        for resource in json.loads(line)["resourceSpans"]
        for scope in resource["scopeSpans"]
        for span in scope["spans"]
    }


BAD_OPTIONS = [
    (["--follow", "out.jsonl", "--format", "otlp"], "--follow sends to --otlp-endpoint only"),
    (["--after", "3", "--otlp-endpoint", "http://x/v1/traces"], "apply to --follow only"),
    (
        ["--follow", "--otlp-endpoint", "http://x/v1/traces", "--after", "3", "--new-only"],
        "give --after or --new-only, not both",
    ),
]


def test_follow_options_are_checked_before_the_store_is_opened(database_url: str):
    before = asyncio.run(stored_rows(database_url))
    for options, error in BAD_OPTIONS:
        result = run_artstore("export", RUN, *options, "--url", database_url)
        assert result.exit_code == 2, result.output
        assert error in " ".join(result.stderr.split()), result.output
    assert asyncio.run(stored_rows(database_url)) == before
