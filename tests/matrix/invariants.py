"""The invariants every matrix case must keep, one function each.

Each raises AssertionError with a message that names what broke; `broken` runs them all
and returns every message, so a case reports all it broke at once.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

from sqlalchemy import select, text
from support_secrets import places_holding
from training_helpers import projections

from artstore.backends.check_only import CHECKPOINT_FILE, trajectory_digest
from artstore.schema import tables as t
from matrix.child import ACKS, REQUESTS
from matrix.harness import Outcome
from matrix.patterns import MODEL_NAME, PROJECT, RUN
from matrix.served import ROLLOUT_TOKENS

TOKEN_PREFIX = "ast_rollout_"  # every rollout token's (artstore/serve/tokens.py)

NONCE = re.compile(r"Answer ([0-9a-f]{32})")


async def no_acknowledged_event_lost(store: Any, workdir: Path) -> None:
    """Every event whose append the store acknowledged is in the store."""
    acked = set((workdir / ACKS).read_text().split()) if (workdir / ACKS).exists() else set()
    async with store.database.read() as connection:
        stored = set((await connection.execute(select(t.events.c.event_id))).scalars())
    lost = acked - stored
    assert not lost, f"{len(lost)} of {len(acked)} acknowledged events are not in the store"


async def finished_rollout_ids(store: Any) -> list[str]:
    async with store.database.read() as connection:
        query = select(t.rollouts.c.rollout_id).where(t.rollouts.c.status == "finished")
        return list((await connection.execute(query)).scalars())


async def no_trajectory_recorded_twice(store: Any) -> None:
    """No rollout is sealed into two groups, and no two finished rollouts hold the same
    conversation (every answer of the server is unique: the same one twice is a copy)."""
    seals = [e.decode() for e in await store.read_all(limit=1_000_000, types=["group.sealed"])]
    memberships = Counter(r for seal in seals for r in seal.rollout_ids)
    sealed_twice = [r for r, n in memberships.items() if n > 1]
    assert not sealed_twice, f"rollouts sealed into two groups: {sealed_twice}"
    ids = await finished_rollout_ids(store)
    trajectories = await store.trajectories(ids)
    digests = Counter(trajectory_digest(trajectories[i]) for i in ids)
    copies = sum(n - 1 for n in digests.values() if n > 1)
    assert not copies, f"{copies} finished rollouts record a trajectory another one records"


def trained_digests(workdir: Path) -> list[tuple[int, str]]:
    """(step, trajectory digest) of every trajectory the backend's checkpoints say it
    trained: what the trainer received, not what the store says it gave."""
    found = []
    for path in sorted(workdir.glob(f"art/*/models/*/checkpoints/*/{CHECKPOINT_FILE}")):
        record = json.loads(path.read_text())
        for group in record.get("trajectory_digests", []):
            found += [(record["step"], digest) for digest in group]
    return found


async def no_trajectory_trained_twice(store: Any, workdir: Path) -> None:
    """The backend received no trajectory twice, each group is consumed once, and no
    group the store would still hand a trainer (`unconsumed_groups`: what `artstore
    replay` trains next) holds a trajectory the backend trained."""
    import artstore
    from artstore.art_versions import trainable_model

    steps: dict[str, list[int]] = {}
    for step, digest in trained_digests(workdir):
        steps.setdefault(digest, []).append(step)
    twice = {d[:12]: s for d, s in steps.items() if len(s) > 1}
    assert not twice, f"trajectories trained twice (digest: steps): {twice}"
    model = trainable_model(name=MODEL_NAME, project=PROJECT, base_model="test-base")
    left = await artstore.unconsumed_groups(store, RUN, model)
    again = [
        g.metadata.get("artstore_group_id")
        for g in left
        if any(trajectory_digest(t) in steps for t in g.trajectories)
    ]
    assert not again, f"unconsumed groups hold trajectories trained already: {again}"
    async with store.database.read() as connection:
        query = select(t.group_consumptions.c.group_id, t.group_consumptions.c.model)
        consumed = Counter(tuple(row) for row in await connection.execute(query))
    assert all(n == 1 for n in consumed.values()), f"groups consumed twice: {consumed}"


async def projections_equal_a_rebuild(store: Any) -> None:
    """Every projection row, as text, is what a rebuild from the events writes."""
    await store.flush()
    before = await projections(store)
    await store.rebuild_projections()
    after = await projections(store)
    differ = [name for name in before if before[name] != after[name]]
    assert not differ, f"projections that differ from a rebuild: {differ}"


def received_requests(workdir: Path) -> list[dict[str, Any]]:
    """The requests the inference servers logged (a line cut by a kill is left out)."""
    path = workdir / REQUESTS
    lines = path.read_text().splitlines() if path.exists() else []
    found = []
    for line in lines:
        try:
            found.append(json.loads(line))
        except ValueError:
            continue
    return found


async def kept_calls(store: Any) -> list[dict[str, Any]]:
    """The `llm.call` events no later call supersedes (a call recorded whole replaces the
    incomplete one recorded before it), in log order."""
    events = [e.data for e in await store.read_all(limit=1_000_000, types=["llm.call"])]
    superseded = {e["supersedes"] for e in events if e.get("supersedes")}
    return [e for e in events if e["call_id"] not in superseded]


async def answer_nonces(store: Any, calls: list[dict[str, Any]]) -> dict[str, set[str]]:
    """call id -> the server's answers (their nonces) its recorded output holds."""
    bodies = await store.get_blobs({c["output"] for c in calls if c.get("output")})
    return {c["call_id"]: set(NONCE.findall(bodies.get(c.get("output") or "", ""))) for c in calls}


async def calls_recorded_equal_calls_received(store: Any, workdir: Path, outcome: Outcome) -> None:
    """`v_llm_calls` holds the requests the servers received, each once, by number of
    input messages; no answer is in two recorded calls. A request received by a child
    that was killed may be missing (its response died with it), never doubled. A call a
    resumed rollout was served from its earlier attempt's record (`replayed_from`) is a
    copy the server never saw: it is counted with the call it copies, not again."""
    calls = await kept_calls(store)
    copies = {c["call_id"] for c in calls if c.get("replayed_from")}
    async with store.database.read() as connection:
        rows = await connection.execute(text("SELECT call_id, num_input_messages FROM v_llm_calls"))
        recorded = Counter(row.num_input_messages for row in rows if row.call_id not in copies)
    requests = received_requests(workdir)
    received = Counter(r["messages"] for r in requests)
    extra = recorded - received
    assert not extra, f"v_llm_calls holds {dict(recorded)}, the servers got {dict(received)}"
    survived = Counter(r["messages"] for r in requests if r["pid"] not in outcome.killed_pids)
    missing = survived - recorded
    assert not missing, (
        f"calls received by children that were not killed are not recorded: {dict(missing)}"
        f" (recorded {dict(recorded)}, received {dict(received)})"
    )
    nonces = await answer_nonces(store, calls)
    paid = Counter(n for call_id, found in nonces.items() if call_id not in copies for n in found)
    doubled = [n for n, count in paid.items() if count > 1]
    assert not doubled, f"{len(doubled)} answers are recorded in two calls"


async def no_recorded_call_paid_twice(store: Any) -> None:
    """A rollout that resumes an earlier attempt is served the answers that attempt got
    (from HTTP, not failed), in order, each a copy holding the same answer; once finished,
    it was served every one of them (the agents are deterministic: the same answers bring
    the same requests), so none went to the server again; no call is copied twice.

    A resumed rollout may diverge only where it asked another model than the record: a
    trainer started again registers its latest step's name (`name@step`), which workers
    started after it serve."""
    started = [e.data for e in await store.read_all(limit=1_000_000, types=["rollout.started"])]
    resumed = {e["rollout_id"]: e["resumes"] for e in started if e.get("resumes")}
    if not resumed:
        return
    diverged = await _diverged_by_model(store)
    calls: dict[str, list[dict[str, Any]]] = {}  # rollout id -> its llm.call events
    for event in await store.read_all(limit=1_000_000, types=["llm.call"]):
        calls.setdefault(event.stream_id.removeprefix("rollout-"), []).append(event.data)
    nonces = await answer_nonces(store, [call for each in calls.values() for call in each])
    finished = set(await finished_rollout_ids(store))
    for rollout_id, earlier in resumed.items():
        answered = _answered_over_http(calls.get(earlier, []))
        mine = calls.get(rollout_id, [])
        superseded = {c["supersedes"] for c in mine if c.get("supersedes")}
        kept = [c for c in mine if c["call_id"] not in superseded]
        copies = [c for c in kept if c.get("replayed_from")]
        origins = [c["replayed_from"] for c in copies]
        if rollout_id in diverged:
            expected = answered[: diverged[rollout_id]]
        elif rollout_id in finished:
            expected = answered
        else:
            expected = answered[: len(origins)]
        assert origins == expected, f"{rollout_id} resumes {earlier}: copies {origins}/{answered}"
        for copy in copies:
            assert nonces[copy["call_id"]] == nonces[copy["replayed_from"]], (
                f"{copy['call_id']} holds another answer than the call it copies"
            )


async def _diverged_by_model(store: Any) -> dict[str, int]:
    """Rollout id -> the position where it diverged from its record, each checked to have
    differed from the recorded request in its model only (the trainer moved on)."""
    positions = {}
    for event in await store.read_all(limit=1_000_000, types=["llm.replay_diverged"]):
        data = event.data
        assert data["differs"] == ["model"], (
            f"a deterministic agent diverged from its record in {data['differs']}: {data}"
        )
        positions[data["rollout_id"]] = data["index"]
    return positions


def _answered_over_http(calls: list[dict[str, Any]]) -> list[str]:
    """Ids of the calls a resumed attempt serves: recorded from HTTP with the request and
    the answer, not failed; the first at each position."""
    first: dict[int, str] = {}
    for call in calls:
        whole = call.get("request") and call.get("output") and not call.get("error_type")
        if call.get("source") == "http" and whole:
            first.setdefault(call["index"], call["call_id"])
    return [first[i] for i in sorted(first)]


async def no_credential_stored(store: Any, url: str, secret: str, folder: Path) -> None:
    """The API key the agents used (and the model spelled out) is nowhere to be read:
    database, SQLite files, blobs, exports, the viewer's pages."""
    leaks = await places_holding(store, url, RUN, secret, folder, quick=True)
    assert not leaks, f"the inference API key is readable in: {leaks}"


async def no_rollout_token_stored(store: Any, url: str, workdir: Path) -> None:
    """No rollout token `artstore serve` handed out (each names its rollout in the agent's
    base URL) is readable anywhere the API key is looked for: none is, by its prefix."""
    if not (workdir / ROLLOUT_TOKENS).exists():
        return
    folder = workdir / "token-leaks"
    folder.mkdir(exist_ok=True)
    leaks = await places_holding(store, url, RUN, TOKEN_PREFIX, folder, quick=True)
    assert not leaks, f"a rollout token is readable in: {leaks}"


async def broken(store: Any, url: str, workdir: Path, outcome: Outcome, secret: str) -> list[str]:
    """Every invariant the case broke, one line each: [] when it kept them all."""
    checks: dict[str, Awaitable[None]] = {
        "acknowledged event lost": no_acknowledged_event_lost(store, workdir),
        "trajectory recorded twice": no_trajectory_recorded_twice(store),
        "trajectory trained twice": no_trajectory_trained_twice(store, workdir),
        "projections differ from a rebuild": projections_equal_a_rebuild(store),
        "calls recorded differ from calls received": calls_recorded_equal_calls_received(
            store, workdir, outcome
        ),
        "recorded call paid twice": no_recorded_call_paid_twice(store),
        "credential stored": no_credential_stored(store, url, secret, workdir / "leaks"),
        "rollout token stored": no_rollout_token_stored(store, url, workdir),
    }
    found = []
    for name, check in checks.items():
        try:
            await check
        except AssertionError as error:
            found.append(f"{name}: {error}")
    return found
