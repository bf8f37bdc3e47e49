"""What belongs to a run: its streams, their events as stored, and the blobs they name.

A run's streams are `run-<run>`, `train-<run>`, and for each of its rollouts
`rollout-<id>` and `feedback-<id>`, for each of its groups `group-<id>`. The events are
read as stored (the payload's JSON text, not a document parsed and written again), so an
archive holds them byte for byte. Blobs are named by hash in the payloads (a message, a
tool list, a request, a LangGraph value: never inside another blob), so the hashes an
event names are the 64-hex strings of its JSON text.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Text, cast, func, select, union
from sqlalchemy.engine import Connection

from artstore.schema import tables as t

_HASH = re.compile(r'"([0-9a-f]{64})"')
_CHUNK = 500  # ids per IN (...): within both databases' limits on parameters

EVENT_COLUMNS = (
    t.events.c.position,
    t.events.c.event_id,
    t.events.c.stream_id,
    t.events.c.version,
    t.events.c.type,
    cast(t.events.c.data, Text).label("data"),  # the text as stored, not parsed
    t.events.c.recorded_at,
)
BLOB_COLUMNS = (t.blobs.c.hash, t.blobs.c.body, t.blobs.c.size, t.blobs.c.codec)


@dataclass(frozen=True)
class RunMembers:
    """The ids a run's streams are named after, and the streams that hold events."""

    run: str
    rollout_ids: tuple[str, ...]
    group_ids: tuple[str, ...]
    streams: tuple[str, ...]


def chunks(values: Iterable[Any], size: int = _CHUNK) -> Iterator[list[Any]]:
    batch: list[Any] = []
    for value in values:
        batch.append(value)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def run_members(connection: Connection, run: str) -> RunMembers:
    rollout_ids = sorted(
        connection.execute(select(t.rollouts.c.rollout_id).where(t.rollouts.c.run == run)).scalars()
    )
    grouped = union(
        select(t.groups.c.group_id).where(t.groups.c.run == run),
        select(t.rollouts.c.group_id).where(
            t.rollouts.c.run == run, t.rollouts.c.group_id.is_not(None)
        ),
    )
    group_ids = sorted(connection.execute(grouped).scalars())
    named = [f"run-{run}", f"train-{run}"]
    named += [f"{kind}-{i}" for i in rollout_ids for kind in ("rollout", "feedback")]
    named += [f"group-{i}" for i in group_ids]
    streams: set[str] = set()
    for batch in chunks(named):
        query = select(t.events.c.stream_id).where(t.events.c.stream_id.in_(batch)).distinct()
        streams.update(connection.execute(query).scalars())
    return RunMembers(run, tuple(rollout_ids), tuple(group_ids), tuple(sorted(streams)))


def event_rows(connection: Connection, streams: Iterable[str]) -> list[Any]:
    """The streams' events as stored, in position order."""
    found: list[Any] = []
    for batch in chunks(streams):
        query = select(*EVENT_COLUMNS).where(t.events.c.stream_id.in_(batch))
        found.extend(connection.execute(query).all())
    return sorted(found, key=lambda row: row.position)


def extent(connection: Connection, streams: Iterable[str]) -> tuple[int, int]:
    """How many events the streams hold, and the highest position among them."""
    count, highest = 0, 0
    for batch in chunks(streams):
        query = select(func.count(), func.max(t.events.c.position)).where(
            t.events.c.stream_id.in_(batch)
        )
        number, top = connection.execute(query).one()
        count, highest = count + number, max(highest, top or 0)
    return count, highest


def named_hashes(texts: Iterable[str]) -> set[str]:
    """The blob hashes these payloads' JSON texts name."""
    found: set[str] = set()
    for text in texts:
        if '"' in text:
            found.update(_HASH.findall(text))
    return found


def blob_rows(connection: Connection, hashes: Iterable[str]) -> list[Any]:
    """The stored rows (the compact form as it is) of these blobs, those that exist."""
    found: list[Any] = []
    for batch in chunks(sorted(hashes)):
        found.extend(connection.execute(select(*BLOB_COLUMNS).where(t.blobs.c.hash.in_(batch))))
    return sorted(found, key=lambda row: row.hash)


def hashes_named_elsewhere(
    connection: Connection, streams: Iterable[str], candidates: set[str], page: int = 5000
) -> set[str]:
    """Which of `candidates` an event outside `streams` names: one pass over the log."""
    own, named, after = set(streams), set(), 0
    data = cast(t.events.c.data, Text)
    while True:
        rows = connection.execute(
            select(t.events.c.position, t.events.c.stream_id, data)
            .where(t.events.c.position > after)
            .order_by(t.events.c.position)
            .limit(page)
        ).all()
        if not rows:
            return named
        named |= candidates & named_hashes(row[2] for row in rows if row[1] not in own)
        after = rows[-1][0]
