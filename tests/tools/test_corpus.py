"""tools/corpus.py, the corpus of every size measurement (issue 29), and what it is stored as.

The same seed gives the same events and blobs byte for byte; the corpus has the variety
its docstring promises; and a small corpus recorded into each database reads back
exactly (every blob's text, every payload, every message through the views), with the
blob bodies deflated and, on a PostgreSQL with lz4, its large payloads compressed by lz4.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from sqlalchemy import text

sys.path.insert(0, str(Path(__file__).parents[2] / "tools"))

import corpus

from artstore.analysis import query
from artstore.eventstore.blob_deflate import DEFLATE

SMALL = {"rollouts": 16, "groups": 2}  # one train step of 2 groups x 8 rollouts


def messages(blobs: dict[str, str]) -> list[dict]:
    """The LangChain messages among an append's blobs (the other: the tool list)."""
    documents = [json.loads(body) for body in blobs.values()]
    return [d for d in documents if isinstance(d, dict) and "type" in d]


def test_the_same_seed_gives_the_same_bytes_and_another_seed_other_bytes():
    first, counts = corpus.fingerprint(corpus.Corpus(seed=7, **SMALL).appends())
    again, _ = corpus.fingerprint(corpus.Corpus(seed=7, **SMALL).appends())
    other, _ = corpus.fingerprint(corpus.Corpus(seed=8, **SMALL).appends())
    assert first == again != other
    assert counts["llm_calls"] >= 2 * SMALL["rollouts"]


def test_the_corpus_has_the_variety_it_promises():
    calls_per_rollout: list[int] = []
    tool_outputs: list[int] = []
    alternatives: set[int] = set()
    failed_calls = failed_rollouts = 0
    for append in corpus.Corpus(corpus.ROLLOUTS_PER_STEP, seed=3).appends():
        kinds = [event.type for event in append.events]
        if kinds[0] != "rollout.started":
            continue
        calls_per_rollout.append(kinds.count("llm.call"))
        failed_calls += sum(
            e.type == "llm.call" and e.error_type is not None for e in append.events
        )
        failed_rollouts += kinds[-1] == "rollout.failed"
        for message in messages(append.blobs):
            if message["type"] == "tool":
                tool_outputs.append(len(message["data"]["content"].encode()))
            for entry in (
                (message["data"].get("response_metadata") or {})
                .get("logprobs", {})
                .get("content", [])
            ):
                alternatives.add(len(entry["top_logprobs"]))
    assert min(calls_per_rollout) >= 1 and max(calls_per_rollout) <= corpus.MAX_CALLS + 5
    assert max(calls_per_rollout) >= 15  # a long tail, not a fixed length
    assert min(tool_outputs) >= 100 and max(tool_outputs) <= 20_000 and max(tool_outputs) > 8_000
    assert alternatives == {corpus.TOP_LOGPROBS}
    assert failed_calls > 0 and failed_rollouts > 0


async def test_a_recorded_corpus_reads_back_exactly_and_its_bodies_are_compressed(store):
    blobs: dict[str, str] = {}
    tool_contents = set()
    for append in corpus.Corpus(seed=11, **SMALL).appends():
        await store.append(append.stream, append.events, blobs=append.blobs)
        blobs.update(append.blobs)
        tool_contents |= {
            m["data"]["content"] for m in messages(append.blobs) if m["type"] == "tool"
        }
    assert await store.get_blobs(list(blobs)) == blobs  # every text, byte for byte
    rows = await query(store, "SELECT content FROM v_trajectory_messages WHERE role = 'tool'")
    assert {row[0] for row in rows.rows} == tool_contents
    async with store.database.read() as connection:
        codecs = (await connection.execute(text("SELECT codec FROM blobs"))).scalars().all()
        assert sum((codec or "").startswith(DEFLATE) for codec in codecs) > len(codecs) / 2
        if connection.dialect.name == "postgresql":
            await _assert_lz4_where_the_server_has_it(connection)


async def _assert_lz4_where_the_server_has_it(connection) -> None:
    """Large payloads in lz4 (revision 0017), the projections' text in pglz."""
    lz4 = "SELECT 'lz4' = ANY(enumvals) FROM pg_settings WHERE name = 'default_toast_compression'"
    expected = "lz4" if (await connection.execute(text(lz4))).scalar() else "pglz"
    methods = text(
        "SELECT DISTINCT pg_column_compression(data) FROM events "
        "WHERE pg_column_compression(data) IS NOT NULL UNION ALL "
        "SELECT DISTINCT 'content: ' || pg_column_compression(content) FROM trajectory_messages "
        "WHERE pg_column_compression(content) IS NOT NULL"
    )
    found = set((await connection.execute(methods)).scalars())
    assert found == {expected, "content: pglz"}  # pglz where the server has no lz4
