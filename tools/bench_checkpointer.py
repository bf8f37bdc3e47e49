"""LangGraph checkpointers side by side: artstore's against LangGraph's own savers.

What it measures, for each saver, on SQLite and on PostgreSQL, in one run:

- `put/s`: checkpoints stored per second (`put`), each the state of an agent after one
  more step: a conversation of LangChain messages that grows by one message of ~300
  characters per step (as an agent's `messages` channel does), a step counter and a route;
- `writes/s`: `put_writes` per second, one per step (the task's new message and route),
  as LangGraph writes them before the next checkpoint;
- `get/s`: `get_tuple` per second, of the latest checkpoint and of past ones by id, each
  with its pending writes;
- `bytes/checkpoint`: what the database grew by (SQLite: pages in use after a WAL
  checkpoint; PostgreSQL: `pg_database_size`) divided by the checkpoints stored, their
  writes included.

Savers, each in a SQLite file and a PostgreSQL database of its own:

- `artstore`: `artstore.langgraph.checkpointer(store)`, its async methods (what
  `graph.ainvoke` calls);
- `sqlite` / `postgres`: `langgraph-checkpoint-sqlite`'s `SqliteSaver` and
  `langgraph-checkpoint-postgres`'s `PostgresSaver` (sync, what `graph.invoke` calls);
- `aiosqlite` / `apostgres`: their async savers, `AsyncSqliteSaver` and
  `AsyncPostgresSaver`.

Targets, each a PASS or MISS line: artstore at least as fast as each LangGraph saver of
the same database for put and get, and at most as large per checkpoint.

    python tools/bench_checkpointer.py                # both databases, 200 steps, 3 rounds
    python tools/bench_checkpointer.py --databases sqlite --steps 100 --rounds 1
    python tools/bench_checkpointer.py --quick        # a smoke run of a few seconds

Results are in docs/performance.md ("LangGraph checkpoints").
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import secrets
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiosqlite
import psycopg
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.base.id import uuid6
from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver
from sqlalchemy.engine import make_url

import artstore
from artstore.langgraph import checkpointer

DEFAULT_POSTGRES_URL = "postgresql://postgres@127.0.0.1:5432/test"
PEERS = {
    "sqlite": ("artstore", "sqlite", "aiosqlite"),
    "postgresql": ("artstore", "postgres", "apostgres"),
}
WORDS = [
    "the",
    "agent",
    "calls",
    "a",
    "tool",
    "with",
    "arguments",
    "and",
    "reads",
    "the",
    "result",
    "before",
    "it",
    "answers",
    "search",
    "lookup",
    "file",
    "line",
    "error",
    "value",
    "user",
    "question",
    "because",
    "therefore",
    "however",
]
GETS_PER_STEP = 2


@dataclass
class Figures:
    """One saver's measurements over the rounds."""

    puts: list[float] = field(default_factory=list)
    writes: list[float] = field(default_factory=list)
    gets: list[float] = field(default_factory=list)
    grown: int = 0
    checkpoints: int = 0

    def rate(self, name: str) -> float:
        return statistics.median(getattr(self, name))

    @property
    def bytes_per_checkpoint(self) -> float:
        return self.grown / max(self.checkpoints, 1)


class Saver:
    """A saver under test: its async calls (sync savers are called directly) and its size."""

    def __init__(self, saver: BaseCheckpointSaver, is_async: bool, size, close) -> None:
        self.saver, self.is_async, self._size, self._close = saver, is_async, size, close

    async def put(self, *args: Any) -> Any:
        return await self.saver.aput(*args) if self.is_async else self.saver.put(*args)

    async def put_writes(self, *args: Any) -> None:
        if self.is_async:
            await self.saver.aput_writes(*args)
        else:
            self.saver.put_writes(*args)

    async def get(self, config: dict) -> Any:
        return (
            await self.saver.aget_tuple(config) if self.is_async else self.saver.get_tuple(config)
        )

    async def size(self) -> int:
        return await self._size()

    async def close(self) -> None:
        await self._close()


def sqlite_used_bytes(path: Path) -> int:
    """Bytes of the pages in use, everything in the main file (the WAL checkpointed)."""
    with sqlite3.connect(path) as connection:
        connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        page_size, pages, free = (
            connection.execute(f"PRAGMA {name}").fetchone()[0]
            for name in ("page_size", "page_count", "freelist_count")
        )
    return page_size * (pages - free)


async def postgres_size(conninfo: str) -> int:
    async with await psycopg.AsyncConnection.connect(conninfo, autocommit=True) as connection:
        cursor = await connection.execute("SELECT pg_database_size(current_database())")
        return (await cursor.fetchone())[0]  # type: ignore[index]


@dataclass
class Place:
    """Fresh databases: a SQLite file per saver, a PostgreSQL database per saver."""

    postgres_url: str
    folder: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="bench_cp_")))
    created: list[str] = field(default_factory=list)

    def admin(self) -> str:
        url = make_url(self.postgres_url).set(drivername="postgresql")
        return url.render_as_string(hide_password=False)

    def postgres_database(self, peer: str) -> str:
        name = f"bench_cp_{peer}_{secrets.token_hex(4)}"
        with psycopg.connect(self.admin(), autocommit=True) as connection:
            connection.execute(f'CREATE DATABASE "{name}"')
        self.created.append(name)
        url = make_url(self.postgres_url).set(drivername="postgresql", database=name)
        return url.render_as_string(hide_password=False)

    def clean(self) -> None:
        if self.created:
            with psycopg.connect(self.admin(), autocommit=True) as connection:
                for name in self.created:
                    connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        shutil.rmtree(self.folder, ignore_errors=True)


async def open_artstore(database: str, place: Place) -> Saver:
    if database == "sqlite":
        path = place.folder / "artstore.db"
        url = f"sqlite:///{path}"
    else:
        url = place.postgres_database("artstore")
    store = await artstore.open_store(url)

    async def size() -> int:
        await store.flush()
        return sqlite_used_bytes(path) if database == "sqlite" else await postgres_size(url)

    return Saver(checkpointer(store), True, size, store.close)


async def open_langgraph_sqlite(peer: str, place: Place) -> Saver:
    path = place.folder / f"{peer}.db"
    if peer == "sqlite":
        connection = sqlite3.connect(path, check_same_thread=False)
        saver: BaseCheckpointSaver = SqliteSaver(connection)
        saver.setup()

        async def close() -> None:
            connection.close()
    else:
        aconnection = await aiosqlite.connect(path)
        saver = AsyncSqliteSaver(aconnection)
        await saver.setup()

        async def close() -> None:
            await aconnection.close()

    async def size() -> int:
        return sqlite_used_bytes(path)

    return Saver(saver, peer == "aiosqlite", size, close)


async def open_langgraph_postgres(peer: str, place: Place) -> Saver:
    conninfo = place.postgres_database(peer)
    if peer == "postgres":
        connection = psycopg.connect(conninfo, autocommit=True, prepare_threshold=0)
        saver: BaseCheckpointSaver = PostgresSaver(connection)  # type: ignore[arg-type]
        saver.setup()

        async def close() -> None:
            connection.close()
    else:
        aconnection = await psycopg.AsyncConnection.connect(
            conninfo, autocommit=True, prepare_threshold=0
        )
        saver = AsyncPostgresSaver(aconnection)  # type: ignore[arg-type]
        await saver.setup()

        async def close() -> None:
            await aconnection.close()

    async def size() -> int:
        return await postgres_size(conninfo)

    return Saver(saver, peer == "apostgres", size, close)


async def open_saver(database: str, peer: str, place: Place) -> Saver:
    if peer == "artstore":
        return await open_artstore(database, place)
    if database == "sqlite":
        return await open_langgraph_sqlite(peer, place)
    return await open_langgraph_postgres(peer, place)


def message(rng: random.Random, step: int) -> Any:
    text = " ".join(rng.choice(WORDS) for _ in range(50))
    kind = HumanMessage if step % 2 == 0 else AIMessage
    return kind(content=text, id=str(uuid.UUID(int=rng.getrandbits(128))))


def checkpoint(step: int, values: dict[str, Any]) -> dict[str, Any]:
    return {
        "v": 4,
        "id": str(uuid6(clock_seq=step)),
        "ts": datetime.now(UTC).isoformat(),
        "channel_values": values,
        "channel_versions": {name: step + 1 for name in values},
        "versions_seen": {"agent": {"messages": step}, "__input__": {}},
        "updated_channels": list(values),
    }


async def run_round(saver: Saver, steps: int, seed: int, figures: Figures) -> None:
    """One thread of `steps` checkpoints, each after a `put_writes`; then the gets."""
    rng = random.Random(seed)
    thread = {"thread_id": f"bench-{seed}", "checkpoint_ns": ""}
    config: dict[str, Any] = {"configurable": dict(thread)}
    conversation: list[Any] = []
    stored: list[dict] = []
    put_s = writes_s = 0.0
    before = await saver.size()
    for step in range(steps):
        new = message(rng, step)
        if stored:
            started = time.perf_counter()
            await saver.put_writes(config, [("messages", [new]), ("route", "agent")], str(step))
            writes_s += time.perf_counter() - started
        conversation = [*conversation, new]
        values = {"messages": conversation, "step": step, "route": "agent"}
        metadata = {"source": "loop", "step": step, "parents": {}}
        started = time.perf_counter()
        config = await saver.put(
            config, checkpoint(step, values), metadata, {k: step + 1 for k in values}
        )
        put_s += time.perf_counter() - started
        stored.append(config)
    figures.grown += await saver.size() - before
    figures.checkpoints += steps
    figures.puts.append(steps / put_s)
    figures.writes.append((steps - 1) / max(writes_s, 1e-9))
    figures.gets.append(await measure_gets(saver, stored, thread, rng))


async def measure_gets(saver: Saver, stored: list[dict], thread: dict, rng: random.Random) -> float:
    latest = {"configurable": dict(thread)}
    wanted = [latest if n % 2 else rng.choice(stored) for n in range(len(stored) * GETS_PER_STEP)]
    started = time.perf_counter()
    for config in wanted:
        found = await saver.get(config)
        assert found is not None and found.checkpoint["channel_values"]["messages"]
    return len(wanted) / (time.perf_counter() - started)


async def measure(database: str, place: Place, steps: int, rounds: int) -> dict[str, Figures]:
    figures = {peer: Figures() for peer in PEERS[database]}
    savers = {peer: await open_saver(database, peer, place) for peer in PEERS[database]}
    try:
        peers = list(savers)
        for number in range(rounds):
            order = peers[number % len(peers) :] + peers[: number % len(peers)]
            for peer in order:
                await run_round(savers[peer], steps, 1000 * number + 1, figures[peer])
    finally:
        for saver in savers.values():
            await saver.close()
    return figures


def report(database: str, figures: dict[str, Figures]) -> list[str]:
    lines = [
        f"{database}: {'saver':<10} {'put/s':>9} {'writes/s':>9} {'get/s':>9} {'bytes/ckpt':>11}"
    ]
    for peer, f in figures.items():
        lines.append(
            f"{database}: {peer:<10} {f.rate('puts'):>9,.0f} {f.rate('writes'):>9,.0f} "
            f"{f.rate('gets'):>9,.0f} {f.bytes_per_checkpoint:>11,.0f}"
        )
    ours = figures["artstore"]
    for peer, f in figures.items():
        if peer == "artstore":
            continue
        for what, mine, theirs, better in (
            ("put/s", ours.rate("puts"), f.rate("puts"), mine_higher),
            ("get/s", ours.rate("gets"), f.rate("gets"), mine_higher),
            ("bytes/checkpoint", ours.bytes_per_checkpoint, f.bytes_per_checkpoint, mine_lower),
        ):
            verdict = "PASS" if better(mine, theirs) else "MISS"
            lines.append(
                f"{verdict} {database} {what}: artstore {mine:,.0f} vs {peer} {theirs:,.0f} "
                f"({mine / theirs:.2f}x)"
            )
    return lines


def mine_higher(mine: float, theirs: float) -> bool:
    return mine >= theirs


def mine_lower(mine: float, theirs: float) -> bool:
    return mine <= theirs


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--databases", nargs="+", choices=list(PEERS), default=list(PEERS))
    parser.add_argument("--steps", type=int, default=200, help="checkpoints per thread")
    parser.add_argument("--rounds", type=int, default=3, help="threads per saver (medians)")
    postgres_url = os.environ.get("ARTSTORE_BENCH_POSTGRES_URL", DEFAULT_POSTGRES_URL)
    parser.add_argument("--postgres-url", default=postgres_url)
    parser.add_argument("--quick", action="store_true", help="a smoke run: 20 steps, 1 round")
    args = parser.parse_args(argv)
    if args.quick:
        args.steps, args.rounds = 20, 1
    return args


async def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    place = Place(args.postgres_url)
    print(
        f"{args.steps} steps per thread, {args.rounds} round(s), medians; "
        f"the conversation grows to {args.steps} messages"
    )
    try:
        for database in args.databases:
            figures = await measure(database, place, args.steps, args.rounds)
            print("\n".join(report(database, figures)), flush=True)
    finally:
        place.clean()
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
