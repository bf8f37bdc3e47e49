"""What recording LLM calls costs: artstore against ART's own `FileLogger`, side by side.

The workload: 64 rollouts x 6 LLM calls. Each call's output is an assistant message with
200 tokens of logprobs (as ART's vLLM server returns them, and as langchain-openai puts
them in `response_metadata`), a tool call on the first five turns; the conversation grows
each turn (assistant message + tool result), and each call's input is the whole
conversation so far. The LangChain messages are synthesized directly (no HTTP).

The peers:

- `FileLogger`: ART's `art.langgraph.logging.FileLogger`, what `art.langgraph` records with:
  per call, the entry `{"input", "output", "tools"}` appended as a pickle to
  `<thread>.pkl` and as text to `<thread>`; trajectories rebuilt by ART's
  `create_messages_from_logs` (which unpickles the file: only done inside this peer).
  ART 0.5.23's FileLogger writes only the text file and keeps the entries in memory
  (its `create_messages_from_logs` takes the logger): its bytes are the text file's;
- `artstore (sqlite)` / `artstore (postgresql)`: `store.rollout(...)` and
  `rollout.record_llm_call(input, output, tools=...)`; trajectories rebuilt by
  `store.trajectories(ids)`.

The 64 rollouts run concurrently as asyncio tasks with a `sleep(0)` between calls (where
the LLM call would wait), so artstore's writer commits while the "agents" work, as it does
for real agents. Measured:

- bytes stored per rollout. FileLogger: the size of its two files. artstore, stored: the
  length of each `llm.call` / `rollout.*` event's JSON payload plus each blob body it is the
  first to store, as stored (`blobs.size`: the compact form where the blob has one; a blob
  shared with another rollout, such as the tool list, counted once);
  artstore on disk: the database's growth (SQLite file + WAL after a checkpoint;
  `pg_database_size` on PostgreSQL), every projection table and index included;
- time added per LLM call: the time inside `logger.log(...)` / `record_llm_call(...)`,
  the caller-visible cost (median and p99 over the 384 calls);
- time to rebuild all 64 trajectories (best of 3 rounds, the peers interleaved), and the
  same followed by a full collection (`gc.collect()`), which counts the collector work a
  rebuild leaves for later (see below).

It also checks that nothing training needs was lost: every trajectory artstore rebuilds
equals, field by field (Choice objects with their logprobs, tools, additional
histories), the one ART rebuilds from its logs.

The rebuild target is against ART 0.5.18's FileLogger (Python 3.11), which reads its
pickles back. ART 0.5.23's converts the entries it kept in memory (nothing read back,
nothing that outlives the process): artstore's rebuild is slower than that (a FAIL line on
Python 3.13); the equality check holds on both.

Where the rebuild's time went (2026-12-01, 2-core machine shared with other helpers'
benchmarks, load average 5-10; cProfile of `store.trajectories` for the 64 rollouts on
SQLite, and `gc.callbacks` timing each collection): cProfile put ~57% in pydantic
validating the `Choice`s (ART's `convert_langgraph_messages`, 1,792 `validate_python`
calls) and ~33% in `pydantic_core.from_json` (896 blobs, each parsed once), but with the
cyclic collector disabled the same rebuild took ~180-300 ms instead of ~1,900-2,300 ms:
both spent their time in the collector, which those calls trigger by allocating. A
rebuild keeps ~5 tracked objects per output token (a `ChatCompletionTokenLogprob`, its
`__dict__`, its fields-set, its `bytes` and `top_logprobs` lists: ~384k for the 76,800
tokens), and the collector runs a full collection each time survivors grow by a quarter
of the heap (~610k objects here): 3 full collections, ~2 s of the rebuild. ART's path
ran 6 (unpickled messages on top). Validation itself is cheap: the 384 `ChoiceLogprobs`
validate in ~100 ms, where building the same objects in Python without validation
(`object.__new__` and the four pydantic slots, type checks so that the result equals the
validated one) took ~145-390 ms: tried and dropped; ART's own `Choice` construction
stays. Parsing is ~60-100 ms, each blob once (`Choice.model_validate_json` on a choice's
own text would parse and build in one pass, but blobs hold LangChain messages and are
read as documents through `load_blob`, not as a choice's text).

So `store.trajectories` pauses the collector while it builds (`artstore.collector`): no
collection during the build; afterwards, the collector collects those objects at its next
thresholds (a young-generation pass over them, then at most one full collection instead
of three). The second figure counts that full collection right after each rebuild, for
every peer.

Measured 2026-12-01, 2-core machine shared with other helpers (load average 4 to 6),
Python 3.11 / ART 0.5.18, three runs, ms (best of 3 rounds each):

  | run                     | FileLogger | SQLite | PostgreSQL | SQLite / PostgreSQL |
  | before (collector on)   | 2,747      | 2,039  | 1,509      | 1.35x / 1.82x MISS  |
  | after                   | 3,450      | 506    | 454        | 6.81x / 7.59x PASS  |
  | after                   | 2,193      | 252    | 302        | 8.69x / 7.26x PASS  |
  | after, on compact blobs | 2,594      | 376    | 368        | 6.90x / 7.05x PASS  |
  | the same + gc.collect() | 3,041      | 1,070  | 1,156      | 2.84x / 2.63x MISS  |

(+ gc.collect() in the other two runs: 2.95x / 2.87x and 2.75x / 2.48x.) The target is
met on the rebuild itself; counting the full collection that the paused collector leaves
for later, artstore is ~2.5-3x as fast as FileLogger, not 5x: that collection traverses
the whole heap, ~0.7 s here, and the objects ART's `Choice`s are made of cannot be fewer.

Storage (issue 13: stored bytes per rollout <= 10% of FileLogger's, printed as a PASS/MISS
line). The logprobs were most of it: each output's 200 entries written out in full
(`{"token":...,"logprob":...,"bytes":[...],"top_logprobs":[]}`, ~90 characters each,
~105 KiB of the 145 KiB). Blobs holding token logprob lists are now stored in the compact
form of `artstore/eventstore/blob_codec.py` (logprobs as one column; tokens as the
lengths that cut the message's content into them; `bytes` left out where it is the
token's UTF-8; one key order per list), which reads back as the same text: an output
blob of 21.9 KB is stored in 5.1 KB. Measured 2026-12-01, 2-core machine shared with
other sessions (load average 4 to 8), bytes per rollout:

  | | stored | vs FileLogger | on disk SQLite | on disk PostgreSQL |
  |---|---|---|---|---|
  | before, ART 0.5.18 (py311) | 145.2 KiB | 17.0% of 853.2 KiB | 179.9 KiB | 70.9 KiB |
  | after, ART 0.5.18 (py311) | 43.0 KiB | 5.0% (PASS) | 74.3 KiB | 56.8 KiB |
  | before, ART 0.5.23 (py313) | 145.2 KiB | 26.4% of 550.4 KiB | 179.9 KiB | 70.8 KiB |
  | after, ART 0.5.23 (py313) | 43.0 KiB | 7.8% (PASS) | 74.4 KiB | 57.0 KiB |

ART 0.5.23's FileLogger writes only its text file (hence 550 KiB), and rebuilds from the
entries it holds in memory, not from anything stored: its rebuild (160-440 ms) is not a
rebuild from storage, and the "no slower than FileLogger's" check FAILs on that ART,
before this change as after. PostgreSQL compressed the long bodies already (TOAST), so
its disk gains less; SQLite's file also holds the projections (`trajectory_messages`,
`llm_calls`) and indexes. Cost: the compact form is made in the store's writer (~0.9 ms
of CPU per 200-token output, off the caller's path: the median time added per call
stayed 0.37-0.45 ms, within the noise), and each compact blob read is written out as
text again and its hash checked (~0.2 ms per output, ~80 ms of the rebuild of 64
trajectories); the rebuild ratio to FileLogger on ART 0.5.18 was 1.6-2.2x before and
2.0x after, the machine too loaded to see a difference.

Third pass on the rebuild (2026-12-01, 2-core machine, otherwise idle; py-spy and
cProfile of `store.trajectories` on SQLite, Python 3.11 / ART 0.5.18). Found: a compact
blob was expanded to its text (`blob_codec.expand`: the document built, written out by
`blob_json`), the text hashed, then parsed again into the same document: 0.36 ms per
200-token output for the decoding alone, each column decoded again for every entry.
Changed: `StoredBlob.document()` (artstore/eventstore/blobs.py) decodes a compact body
straight to the document (each column once, token entries built with a dict display,
`bytes` lists shared by equal tokens): 0.15 ms per output; the text is still written
out once to check the hash (~55 ms of the 64-trajectory rebuild, kept: no other
document is ever handed out under a blob's hash). What remains of a rebuild is ART's
own `Choice` validation (~30%), that hash check (~15-20%), the young-generation pass over
the new objects when the paused collector resumes (~90 ms, ~15-20%) and the decoding.

The steady-state column: STEADY_REBUILDS rebuilds in a row, the collector on and nothing
collected by hand, each rebuild's result dropped before the next, as a trainer drops a
trained batch: every collection the rebuilds cause, during them or deferred by the
paused collector, falls inside the timed loop. It is the figure the 5x target is checked
on. The "+ gc.collect()" column, printed as information, charges each rebuild a full
traversal of the whole heap (the line above the targets says what that costs with
nothing new in the heap, ~550-690 ms here), which no program pays once per rebuild.

Measured, ms (best round / steady state), Python 3.11 / ART 0.5.18, machine idle:

  | run | FileLogger | SQLite | PostgreSQL | ratio SQLite / PostgreSQL |
  |---|---|---|---|---|
  | 2026-12-01, before | ~2,370 / - | 706 / - | 557 / - | 3.36x / 4.27x (best round) |
  | 2026-12-01, after | 2,214 / 2,680 | 407 / 420 | 457 / 477 | 6.38x / 5.62x steady, PASS |
  | 2026-12-02, after (new machine) | 2,397 / 2,786 | 704 / 757 | 707 / 731 | 3.68x / 3.81x, MISS |
  | 2026-12-02, after, again | 2,189 / 2,600 | 572 / 621 | 587 / 682 | 4.18x / 3.81x, MISS |
  | 2026-12-02, third machine | 1,519 / 1,767 | 296 / 326 | 304 / 325 | 5.41x / 5.43x, PASS |

The same code on a fresh machine of the same kind the next day: FileLogger's rebuild
(unpickling, mostly C) took as long as before, artstore's 1.4-1.7x as long, and so did
its parts measured alone (decoding a 200-token output 0.15 -> 0.24 ms, the eventsourcing
peer of bench_append 59 -> 109 us per commit): what a "5x" means depends on the machine
it runs on. The time added per LLM call (median) was 1.05-1.25 ms there (the "< 1 ms"
check FAILs), ~60% of it pydantic writing the call's input messages as JSON: each call's
input is the whole conversation so far, written again for every call (a message is stored
once, under its hash, but its text has to be made to know the hash). On the third
machine (the last row, a faster one; best round 5.13x / 4.99x) the median time added
per call was 0.52 ms on SQLite and 0.44 ms on PostgreSQL (the "< 1 ms" check PASSes),
and a full collection of the idle heap 504 ms.

Run it from the repository root:

    python tools/bench_capture.py                      # SQLite and PostgreSQL
    python tools/bench_capture.py --databases sqlite

PostgreSQL comes from `--postgres-url`, else `$ARTSTORE_BENCH_POSTGRES_URL`, else
`postgresql://postgres@127.0.0.1:5432/test`; the user must be allowed to create databases.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import inspect
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import psycopg
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.tools import tool
from langchain_core.utils.function_calling import convert_to_openai_tool
from rich.console import Console
from rich.table import Table
from sqlalchemy import select, text
from sqlalchemy.engine import make_url

import artstore
from artstore.eventstore.blobs import canonical_json
from artstore.schema import tables as t
from artstore.testing.inference_server import token_logprobs

ROLLOUTS = 64
TURNS = 6
OUTPUT_TOKENS = 200
REBUILD_TARGET = 5.0  # issue 13: rebuilding trajectories >= 5x as fast as FileLogger
STEADY_REBUILDS = 5  # rebuilds in a row for the steady-state figure
STORAGE_TARGET = 0.10  # issue 13: stored bytes per rollout <= 10% of FileLogger's
DEFAULT_POSTGRES_URL = "postgresql://postgres@127.0.0.1:5432/test"


# --- the workload ---------------------------------------------------------------------------


@tool
def search(query: str, limit: int = 5) -> str:
    """Search the knowledge base."""
    return ""


@tool
def read_document(document_id: str) -> str:
    """Read one document of the knowledge base."""
    return ""


TOOLS = [convert_to_openai_tool(search), convert_to_openai_tool(read_document)]


def assistant_message(rollout: int, turn: int) -> AIMessage:
    """An answer as langchain-openai builds it from ART's vLLM server: 200 tokens of logprobs."""
    words = [f"w{rollout}x{turn}y{i}" for i in range(OUTPUT_TOKENS)]
    content = " ".join(words)
    logprobs = token_logprobs(content)
    assert len(logprobs) == OUTPUT_TOKENS
    last = turn == TURNS - 1
    tool_calls = (
        []
        if last
        else [
            {
                "id": f"call_{uuid.uuid4().hex[:24]}",
                "name": "search",
                "args": {"query": f"question {rollout} step {turn}", "limit": 5},
            }
        ]
    )
    completion_id = f"chatcmpl-{uuid.uuid4().hex}"
    return AIMessage(
        content=content,
        tool_calls=tool_calls,
        id=f"lc_run--{uuid.uuid4()}",
        usage_metadata={
            "input_tokens": 400 * (turn + 1),
            "output_tokens": OUTPUT_TOKENS,
            "total_tokens": 400 * (turn + 1) + OUTPUT_TOKENS,
        },
        response_metadata={
            "token_usage": {
                "prompt_tokens": 400 * (turn + 1),
                "completion_tokens": OUTPUT_TOKENS,
                "total_tokens": 400 * (turn + 1) + OUTPUT_TOKENS,
            },
            "model_name": "agent-001",
            "system_fingerprint": "vllm",
            "id": completion_id,
            "service_tier": None,
            "finish_reason": "stop" if last else "tool_calls",
            "logprobs": {"content": logprobs, "refusal": None},
            "model_provider": "openai",
        },
    )


def tool_result(rollout: int, turn: int, call_id: str) -> ToolMessage:
    text_ = " ".join(f"result {rollout}.{turn}.{i}: a line of a document" for i in range(20))
    return ToolMessage(content=text_, tool_call_id=call_id, id=str(uuid.uuid4()))


@dataclass
class Rollout:
    """The calls of one synthetic rollout: (input messages, output) per turn."""

    index: int
    calls: list[tuple[list[BaseMessage], AIMessage]] = field(default_factory=list)


def synthesize() -> list[Rollout]:
    rollouts = []
    for r in range(ROLLOUTS):
        conversation: list[BaseMessage] = [
            SystemMessage("You are a research agent. Use the tools, then answer.", id="sys"),
            HumanMessage(f"Question number {r}: what does the knowledge base say?", id=f"h{r}"),
        ]
        rollout = Rollout(r)
        for turn in range(TURNS):
            output = assistant_message(r, turn)
            rollout.calls.append((list(conversation), output))
            conversation.append(output)
            if output.tool_calls:
                conversation.append(tool_result(r, turn, output.tool_calls[0]["id"]))
        rollouts.append(rollout)
    return rollouts


# --- measuring ---------------------------------------------------------------------------------


@dataclass
class Result:
    peer: str
    bytes_per_rollout: float
    disk_bytes_per_rollout: float
    call_times_s: list[float]
    record_wall_s: float
    rebuild: Callable[[], Awaitable[dict[int, Any]]]  # all trajectories, by rollout index
    close: Callable[[], Awaitable[None]]
    rebuild_s: float = float("inf")  # best of the rounds
    # best of the rounds of the rebuild followed by a full collection (gc.collect()): the
    # work the rebuild leaves Python's collector, counted (artstore pauses it while building)
    rebuild_collected_s: float = float("inf")
    # mean time per rebuild in a run of STEADY_REBUILDS, the collector on: one per round
    steady_s: list[float] = field(default_factory=list)
    trajectories: dict[int, Any] = field(default_factory=dict)

    @property
    def steady_median_s(self) -> float:
        return statistics.median(self.steady_s)

    @property
    def median_ms(self) -> float:
        return statistics.median(self.call_times_s) * 1000

    @property
    def p99_ms(self) -> float:
        return statistics.quantiles(self.call_times_s, n=100)[98] * 1000


async def run_calls(rollouts: list[Rollout], record) -> tuple[list[float], float]:
    """Every rollout as a task; `record(rollout, input, output)` is the timed call."""
    times: list[float] = []
    clock = time.perf_counter()

    async def one(rollout: Rollout) -> None:
        async with record.rollout(rollout) as recorder:
            for input_messages, output in rollout.calls:
                await asyncio.sleep(0)  # the LLM call: others run meanwhile
                start = time.perf_counter()
                recorder(input_messages, output)
                times.append(time.perf_counter() - start)

    await asyncio.gather(*(one(r) for r in rollouts))
    return times, time.perf_counter() - clock


class FileLoggerPeer:
    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.paths: dict[int, str] = {}
        self.loggers: dict[int, Any] = {}

    def rollout(self, rollout: Rollout):
        from contextlib import asynccontextmanager

        from art.langgraph.logging import FileLogger

        path = str(self.folder / str(uuid.uuid4()))
        self.paths[rollout.index] = path
        logger = FileLogger(path)
        self.loggers[rollout.index] = logger

        @asynccontextmanager
        async def context():
            def record(input_messages, output):
                entry = {"input": input_messages, "output": output, "tools": TOOLS}
                logger.log(str(uuid.uuid4()), entry)

            yield record

        return context()

    def rebuild(self) -> dict[int, Any]:
        import art
        from art.langgraph.llm_wrapper import create_messages_from_logs

        # ART 0.5.18 reads the pickle file back from its path; later ARTs' FileLogger keeps
        # the entries in memory (it writes only the text file) and takes the logger itself.
        takes_logger = "logger" in inspect.signature(create_messages_from_logs).parameters
        return {
            index: create_messages_from_logs(
                self.loggers[index] if takes_logger else path,
                art.Trajectory(messages_and_choices=[]),
            )
            for index, path in self.paths.items()
        }

    def bytes_stored(self) -> int:
        return sum(p.stat().st_size for p in self.folder.iterdir())


async def bench_file_logger(rollouts: list[Rollout], folder: Path) -> Result:
    peer = FileLoggerPeer(folder)
    times, wall = await run_calls(rollouts, peer)
    stored = peer.bytes_stored() / ROLLOUTS

    async def rebuild() -> dict[int, Any]:
        return peer.rebuild()

    async def close() -> None:
        pass

    return Result("FileLogger (ART)", stored, stored, times, wall, rebuild, close)


class ArtstorePeer:
    def __init__(self, store: artstore.Store) -> None:
        self.store = store
        self.ids: dict[int, str] = {}

    def rollout(self, rollout: Rollout):
        from contextlib import asynccontextmanager

        @asynccontextmanager
        async def context():
            async with self.store.rollout("agent-001", scenario={"index": rollout.index}) as r:
                self.ids[rollout.index] = r.id

                def record(input_messages, output):
                    r.record_llm_call(input_messages, output, tools=TOOLS)

                yield record

        return context()


async def bench_artstore(rollouts: list[Rollout], url: str, name: str) -> Result:
    store = await artstore.open_store(url)
    await store.flush()
    disk_before = await disk_size(store)
    peer = ArtstorePeer(store)
    times, wall = await run_calls(rollouts, peer)
    disk_after = await disk_size(store)
    logical = await logical_bytes(store, list(peer.ids.values()))
    ids = [peer.ids[r.index] for r in rollouts]

    async def rebuild() -> dict[int, Any]:
        found = await store.trajectories(ids)
        return {r.index: found[peer.ids[r.index]] for r in rollouts}

    return Result(
        name,
        logical / ROLLOUTS,
        (disk_after - disk_before) / ROLLOUTS,
        times,
        wall,
        rebuild,
        store.close,
    )


async def logical_bytes(store: artstore.Store, rollout_ids: list[str]) -> int:
    """Event payloads of these rollouts, plus the blob bodies they reference (each once, as
    stored)."""
    streams = await store.read_streams(f"rollout-{rollout_id}" for rollout_id in rollout_ids)
    total, hashes = 0, set()
    for recorded in streams.values():
        for event in recorded:
            total += len(canonical_json(event.data))
            if event.type == "llm.call":
                hashes |= {*event.data["input"], event.data["output"], event.data["tools"]}
    async with store.database.read() as connection:
        for start in range(0, len(hashes), 500):
            chunk = sorted(hashes)[start : start + 500]
            query = select(t.blobs.c.size).where(t.blobs.c.hash.in_(chunk))
            total += sum(row.size for row in await connection.execute(query))
    return total


async def disk_size(store: artstore.Store) -> int:
    async with store.database.read() as connection:
        if store.dialect == "postgresql":
            query = text("SELECT pg_database_size(current_database())")
            return (await connection.execute(query)).scalar()
        await connection.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
        path = Path(store.database.url.database)
    return sum(p.stat().st_size for p in path.parent.glob(path.name + "*"))


async def time_rebuilds(results: list[Result], rounds: int) -> None:
    """Each peer's rebuild, `rounds` times, peers interleaved (the machine may be noisy);
    then each peer's steady state: STEADY_REBUILDS rebuilds in a row, `rounds` times."""
    for round_ in range(rounds):
        for result in rotate(results, round_):
            gc.collect()
            start = time.perf_counter()
            trajectories = await result.rebuild()
            elapsed = time.perf_counter() - start
            gc.collect()
            result.rebuild_collected_s = min(
                result.rebuild_collected_s, time.perf_counter() - start
            )
            if elapsed < result.rebuild_s:
                result.rebuild_s, result.trajectories = elapsed, trajectories
            del trajectories
    for round_ in range(rounds):
        for result in rotate(results, round_):
            # The collector on, as in any program, and nothing collected by hand: every
            # collection these rebuilds cause (during them, or deferred by a paused
            # collector to the next allocations) runs inside the timed loop.
            gc.collect()
            start = time.perf_counter()
            for _ in range(STEADY_REBUILDS):
                trajectories = await result.rebuild()
                del trajectories  # dropped before the next, as a trainer drops a trained batch
            result.steady_s.append((time.perf_counter() - start) / STEADY_REBUILDS)


def rotate(results: list[Result], by: int) -> list[Result]:
    by %= len(results)
    return results[by:] + results[:by]


def full_collection_s() -> float:
    """A full collection of this process's heap with nothing new in it: the part of
    "rebuild + gc.collect()" that no rebuild made (the best of three)."""
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        gc.collect()
        best = min(best, time.perf_counter() - start)
    return best


# --- nothing lost -------------------------------------------------------------------------------


def dump_history(messages_and_choices: list[Any]) -> list[Any]:
    from openai.types.chat.chat_completion import Choice

    return [
        ("choice", item.model_dump()) if isinstance(item, Choice) else ("message", dict(item))
        for item in messages_and_choices
    ]


def dump(trajectory: Any) -> Any:
    return (
        dump_history(trajectory.messages_and_choices),
        trajectory.tools,
        [(dump_history(h.messages_and_choices), h.tools) for h in trajectory.additional_histories],
    )


def same_trajectories(ours: Result, arts: Result) -> bool:
    return all(dump(ours.trajectories[i]) == dump(arts.trajectories[i]) for i in range(ROLLOUTS))


# --- the run -------------------------------------------------------------------------------


def create_postgres_database(admin_url: str) -> tuple[str, str]:
    admin = make_url(admin_url).set(drivername="postgresql")
    conninfo = admin.render_as_string(hide_password=False)
    name = f"bench_capture_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(conninfo, autocommit=True) as connection:
        connection.execute(f'CREATE DATABASE "{name}"')
    return conninfo, admin.set(database=name).render_as_string(hide_password=False)


def drop_postgres_database(conninfo: str, url: str) -> None:
    with psycopg.connect(conninfo, autocommit=True) as connection:
        connection.execute(f'DROP DATABASE IF EXISTS "{make_url(url).database}" WITH (FORCE)')


async def main(databases: list[str], postgres_url: str, rounds: int) -> int:
    console = Console(width=160)
    console.print(
        f"{ROLLOUTS} rollouts x {TURNS} LLM calls x {OUTPUT_TOKENS} output tokens with logprobs, "
        "the conversation growing each turn"
    )
    results, idle_collection_s = await measure(databases, postgres_url, rounds)
    print_table(console, results, idle_collection_s)
    return 1 if check_targets(console, results, idle_collection_s) else 0


async def measure(
    databases: list[str], postgres_url: str, rounds: int
) -> tuple[list[Result], float]:
    """Every peer's result (FileLogger's first), and the time of an idle gc.collect()."""
    rollouts = synthesize()
    results: list[Result] = []
    postgres: tuple[str, str] | None = None
    idle_collection_s = float("nan")
    with tempfile.TemporaryDirectory(prefix="bench_capture_") as folder:
        try:
            (Path(folder) / "art").mkdir()
            results.append(await bench_file_logger(rollouts, Path(folder) / "art"))
            if "sqlite" in databases:
                url = f"sqlite:///{Path(folder) / 'artstore.db'}"
                results.append(await bench_artstore(rollouts, url, "artstore (sqlite)"))
            if "postgresql" in databases:
                postgres = create_postgres_database(postgres_url)
                results.append(await bench_artstore(rollouts, postgres[1], "artstore (postgresql)"))
            await time_rebuilds(results, rounds)
            idle_collection_s = full_collection_s()
        finally:
            for result in results:
                await result.close()
            if postgres is not None:
                drop_postgres_database(*postgres)
    return results, idle_collection_s


def print_table(console: Console, results: list[Result], idle_collection_s: float) -> None:
    arts = results[0]
    table = Table(title="Recording LLM calls: bytes, caller-visible time, rebuild time")
    for column in (
        "peer",
        "stored / rollout",
        "on disk / rollout",
        "vs FileLogger",
        "per call median",
        "per call p99",
        "record all (wall)",
        "rebuild 64 trajectories",
        "+ gc.collect()",
        f"steady state ({STEADY_REBUILDS} in a row)",
    ):
        table.add_column(column, justify="left" if column == "peer" else "right")
    for result in results:
        table.add_row(
            result.peer,
            f"{result.bytes_per_rollout / 1024:.1f} KiB",
            f"{result.disk_bytes_per_rollout / 1024:.1f} KiB",
            f"{result.bytes_per_rollout / arts.bytes_per_rollout:.1%}",
            f"{result.median_ms:.3f} ms",
            f"{result.p99_ms:.3f} ms",
            f"{result.record_wall_s:.2f} s",
            f"{result.rebuild_s * 1000:.0f} ms",
            f"{result.rebuild_collected_s * 1000:.0f} ms",
            f"{result.steady_median_s * 1000:.0f} ms",
        )
    console.print(table)
    console.print(
        f"gc.collect() of this process's heap with nothing new in it: "
        f"{idle_collection_s * 1000:.0f} ms (part of every '+ gc.collect()' figure)"
    )


def check_targets(console: Console, results: list[Result], idle_collection_s: float) -> int:
    """Print a PASS, FAIL or MISS line for each check and target; the number of FAILs."""
    arts = results[0]
    failures = 0
    for result in results[1:]:
        checks = [
            (
                "stored bytes per rollout <= 20% of FileLogger's",
                result.bytes_per_rollout <= 0.2 * arts.bytes_per_rollout,
            ),
            ("median time added per LLM call < 1 ms", result.median_ms < 1.0),
            (
                "rebuilding trajectories no slower than FileLogger's",
                result.rebuild_s <= arts.rebuild_s,
            ),
            ("every trajectory equals ART's, field by field", same_trajectories(result, arts)),
        ]
        for label, ok in checks:
            failures += not ok
            console.print(f"{'PASS' if ok else 'FAIL'}  {result.peer}: {label}")
        # Issue 13's targets, printed apart: a MISS is a target not reached, not a failure.
        share = result.bytes_per_rollout / arts.bytes_per_rollout
        console.print(
            f"{'PASS' if share <= STORAGE_TARGET else 'MISS'}  {result.peer}: stored bytes per "
            f"rollout {share:.1%} of FileLogger's (target {STORAGE_TARGET:.0%}; on disk "
            f"{result.disk_bytes_per_rollout / arts.bytes_per_rollout:.1%})"
        )
        speedup = arts.rebuild_s / result.rebuild_s
        console.print(
            f"{'PASS' if speedup >= REBUILD_TARGET else 'MISS'}  {result.peer}: rebuilding "
            f"trajectories {speedup:.2f}x as fast as FileLogger (best round; target "
            f"{REBUILD_TARGET:.0f}x)"
        )
        # The target counts the collector's work: in the steady state every collection
        # the rebuilds cause is timed, the ones artstore's paused collector defers included.
        steady = arts.steady_median_s / result.steady_median_s
        console.print(
            f"{'PASS' if steady >= REBUILD_TARGET else 'MISS'}  {result.peer}: rebuilding "
            f"trajectories {steady:.2f}x as fast as FileLogger in the steady state, every "
            f"collection counted (target {REBUILD_TARGET:.0f}x)"
        )
        collected = arts.rebuild_collected_s / result.rebuild_collected_s
        console.print(
            f"      {result.peer}: rebuilding trajectories, then gc.collect(), {collected:.2f}x "
            f"as fast as FileLogger (each figure holds a full collection of the whole heap: "
            f"{idle_collection_s * 1000:.0f} ms with nothing new)"
        )
    return failures


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--databases", nargs="+", choices=["sqlite", "postgresql"], default=["sqlite", "postgresql"]
    )
    parser.add_argument(
        "--postgres-url",
        default=os.environ.get("ARTSTORE_BENCH_POSTGRES_URL", DEFAULT_POSTGRES_URL),
    )
    parser.add_argument("--rounds", type=int, default=3, help="rebuilds timed per peer (best)")
    return parser.parse_args(argv)


if __name__ == "__main__":
    args = parse_args(sys.argv[1:])
    sys.exit(asyncio.run(main(args.databases, args.postgres_url, args.rounds)))
