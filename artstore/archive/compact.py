"""Payload texts in a shorter form that reads back as exactly the same text.

Blob hashes (SHA-256) and ids (UUIDs) are random: compressed, they were most of an
archive's bytes, and a run names the same ones again and again (a rollout's id in its
start, its end, its group's rewards and seal; a group's id in each of its rollouts).
In the archive's files a payload names

- a blob the archive holds as `"\\x01N"`: N its place among the archive's blobs;
- an id seen before in the archive as `"\\x02N"`: N its place among the distinct ids in
  the order the events first name them (the first time, it is written as it is).

A raw U+0001 or U+0002 cannot occur in a stored payload (JSON escapes control
characters); a payload that holds one all the same is kept as it is (`refs` false).
Events are shortened and expanded in the same order (the archive's), so the two sides
number the ids alike; the archive checks the round trip before anything is removed.
"""

from __future__ import annotations

import re
from typing import Any

from artstore.errors import ArchiveError

_UUID = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
_NAMED = re.compile(rf'"(?:([0-9a-f]{{64}})|({_UUID}))"')
_SHORT = re.compile(rf'"(?:\x01(\d+)|\x02(\d+)|({_UUID}))"')


class Shortener:
    """Shortens the events of one archive, in its order."""

    def __init__(self, blob_places: dict[str, int]) -> None:
        self.blob_places = blob_places
        self.ids: dict[str, int] = {}

    def event(self, row: dict[str, Any]) -> dict[str, Any]:
        data = row["data"]
        if "\x01" in data or "\x02" in data:
            return {**row, "refs": False}
        return {**row, "data": _NAMED.sub(self._short, data), "refs": True}

    def _short(self, found: re.Match[str]) -> str:
        digest, uuid = found.groups()
        if digest is not None:
            place = self.blob_places.get(digest)
            return found.group(0) if place is None else f'"\x01{place}"'
        seen = self.ids.get(uuid)
        if seen is None:
            self.ids[uuid] = len(self.ids)
            return found.group(0)
        return f'"\x02{seen}"'


class Expander:
    """Expands the events of one archive, in its order (the blobs read first)."""

    def __init__(self, blob_hashes: list[str]) -> None:
        self.blob_hashes = blob_hashes
        self.ids: list[str] = []
        self.known: set[str] = set()

    def event(self, columns: dict[str, Any]) -> dict[str, Any]:
        data = columns.pop("data")
        if columns.pop("refs"):
            try:
                data = _SHORT.sub(self._long, data)
            except IndexError:
                raise ArchiveError(
                    "an event names a blob or id the archive does not hold"
                ) from None
        return {**columns, "data": data}

    def _long(self, found: re.Match[str]) -> str:
        blob, seen, uuid = found.groups()
        if blob is not None:
            return f'"{self.blob_hashes[int(blob)]}"'
        if seen is not None:
            return f'"{self.ids[int(seen)]}"'
        if uuid not in self.known:
            self.known.add(uuid)
            self.ids.append(uuid)
        return found.group(0)
