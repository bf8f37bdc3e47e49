"""An archive's files: zstd parquet segments of a run's events and blobs, and a manifest.

Layout, under the target (a directory, or any URL fsspec opens, `s3://bucket/prefix`):

    <target>/<run, percent-quoted>/events-00000.parquet ...   the events as stored
    <target>/<run, percent-quoted>/blobs-00000.parquet ...    the blobs as stored
    <target>/<run, percent-quoted>/manifest.json              written last

The files hold the rows in a shorter form that reads back as the rows themselves: a blob
without its hash and size (its text's SHA-256 and its body's length), payloads with blob
hashes and repeated ids as places (`compact.py`). The manifest names every file with its
row count, size and SHA-256, and a digest of the rows' content as stored, with the
artstore version and schema revision that wrote it.

The folder always holds a whole archive or none: a directory without a manifest is no
archive; an archive written again writes files of its own (named after the attempt) and
replaces the manifest last, in one piece, and the files no manifest names (an earlier
archive's, or those of a write that was killed) are removed once the new archive is
committed. On a local disk each file is written under a temporary name, synced and
renamed; an object store's PUT is whole or absent.
"""

from __future__ import annotations

import hashlib
import io
import os
import secrets
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

import orjson
import pyarrow as pa
import pyarrow.parquet as pq

from artstore.archive.compact import Expander, Shortener
from artstore.errors import ArchiveError
from artstore.eventstore.blobs import blob_hash, blob_text

FORMAT = "artstore-archive"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
EVENTS_PER_SEGMENT = 50_000
BLOB_BYTES_PER_SEGMENT = 64 * 1024 * 1024
ZSTD_LEVEL = 19  # tools/bench_archive.py: 9 -> 19 took ~12% off the files

# The rows as stored (what the manifest's content digests are over).
EVENT_FIELDS = ("position", "event_id", "stream_id", "version", "type", "data", "recorded_at")
BLOB_FIELDS = ("hash", "body", "size", "codec")
FIELDS = {"events": EVENT_FIELDS, "blobs": BLOB_FIELDS}

# The files' columns.
EVENT_SCHEMA = pa.schema(
    [
        ("position", pa.int64()),  # in the database the run was archived from
        ("event_id", pa.string()),
        ("stream_id", pa.string()),
        ("version", pa.int32()),
        ("type", pa.string()),
        ("data", pa.string()),  # the payload's JSON text, blob hashes as places
        ("refs", pa.bool_()),  # whether `data`'s blob hashes are written as places
        ("recorded_at", pa.timestamp("us", tz="UTC")),
    ]
)
BLOB_SCHEMA = pa.schema([("body", pa.string()), ("codec", pa.string())])
SCHEMAS = {"events": EVENT_SCHEMA, "blobs": BLOB_SCHEMA}


@dataclass(frozen=True)
class Archive:
    """What an archive holds, read back and checked against its manifest."""

    manifest: dict[str, Any]
    manifest_sha256: str
    events: list[dict[str, Any]]
    blobs: list[dict[str, Any]]


def run_location(target: str, run: str) -> tuple[Any, str]:
    """The filesystem and the directory of `run`'s archive under `target`."""
    import fsspec

    fs, root = fsspec.core.url_to_fs(target)
    return fs, f"{root.rstrip('/')}/{quote(run, safe='')}"


def utc(value: datetime) -> datetime:
    # SQLite keeps no zone; artstore writes UTC.
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def content_digest(kind: str, rows: Iterable[dict[str, Any]]) -> str:
    """SHA-256 over the rows' values in order (what a file must read back as)."""
    digest = hashlib.sha256()
    for row in rows:
        values = [row[name] for name in FIELDS[kind]]
        digest.update(orjson.dumps(values, option=orjson.OPT_NAIVE_UTC | orjson.OPT_UTC_Z))
    return digest.hexdigest()


def write_archive(
    target: str,
    run: str,
    events: Sequence[dict[str, Any]],
    blobs: Sequence[dict[str, Any]],
    about: dict[str, Any],
    step: Callable[[str], None],
) -> str:
    """Write the archive, read every file back, check it; the manifest's SHA-256.

    `step(name)` is called after each file is written ("segment"), after the manifest
    ("manifest") and after the check ("verified")."""
    fs, where = run_location(target, run)
    fs.makedirs(where, exist_ok=True)
    # Files of this write's own: an archive written before stays whole (its manifest, its
    # files) until this one's manifest replaces it.
    attempt = secrets.token_hex(4)
    files = []
    shortener = Shortener({blob["hash"]: number for number, blob in enumerate(blobs)})
    for kind, rows, cut in (
        ("events", events, _by_count(EVENTS_PER_SEGMENT)),
        ("blobs", blobs, _by_bytes(BLOB_BYTES_PER_SEGMENT)),
    ):
        for number, segment in enumerate(cut(rows)):
            name = f"{kind}-{attempt}-{number:05d}.parquet"
            data = _parquet(kind, segment, shortener)
            _put(fs, f"{where}/{name}", data)
            files.append(
                {
                    "name": name,
                    "kind": kind,
                    "rows": len(segment),
                    "bytes": len(data),
                    "sha256": hashlib.sha256(data).hexdigest(),
                    "content_sha256": content_digest(kind, segment),
                }
            )
            step("segment")
    manifest = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "run": run,
        **about,
        "num_events": len(events),
        "num_blobs": len(blobs),
        "files": files,
    }
    text = orjson.dumps(manifest, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS)
    _put(fs, f"{where}/{MANIFEST}", text)
    step("manifest")
    archive = read_archive(target, run)
    if archive.manifest != manifest:
        raise ArchiveError(f"the archive of {run!r} read back differs from what was written")
    step("verified")
    return archive.manifest_sha256


def remove_unnamed(target: str, run: str, manifest_sha256: str) -> None:
    """Remove the files of `run`'s folder that its manifest does not name (an earlier
    archive's, or a write's that was killed), if the manifest is still `manifest_sha256`."""
    fs, where = run_location(target, run)
    text = fs.cat_file(f"{where}/{MANIFEST}")
    if hashlib.sha256(text).hexdigest() != manifest_sha256:
        return  # another archive of the run replaced it meanwhile: its files are named there
    named = {MANIFEST, *(file["name"] for file in orjson.loads(text)["files"])}
    for path in fs.ls(where, detail=False):
        if path.rstrip("/").rsplit("/", 1)[-1] not in named:
            fs.rm(path)


def read_archive(target: str, run: str) -> Archive:
    """The archive of `run` under `target`, every file checked against the manifest."""
    fs, where = run_location(target, run)
    try:
        text = fs.cat_file(f"{where}/{MANIFEST}")
    except FileNotFoundError:
        raise ArchiveError(f"no archive of run {run!r} in {target}") from None
    manifest = orjson.loads(text)
    if manifest.get("format") != FORMAT or manifest.get("run") != run:
        raise ArchiveError(f"{where}/{MANIFEST} is not the manifest of an archive of {run!r}")
    if manifest.get("format_version") != FORMAT_VERSION:
        raise ArchiveError(f"archive format {manifest.get('format_version')} is not known here")
    found: dict[str, list[dict[str, Any]]] = {"events": [], "blobs": []}
    # Blobs first: an event's places name them.
    expander: Expander | None = None
    for file in sorted(manifest["files"], key=lambda f: f["kind"] != "blobs"):
        data = fs.cat_file(f"{where}/{file['name']}")
        if hashlib.sha256(data).hexdigest() != file["sha256"] or len(data) != file["bytes"]:
            raise ArchiveError(f"{where}/{file['name']} does not match its checksum")
        kind = file["kind"]
        table = pq.read_table(io.BytesIO(data), schema=SCHEMAS[kind]).to_pylist()
        if kind == "blobs":
            rows = [_blob_row(row) for row in table]
        else:
            expander = expander or Expander([blob["hash"] for blob in found["blobs"]])
            rows = [expander.event(row) for row in table]
        if len(rows) != file["rows"] or content_digest(kind, rows) != file["content_sha256"]:
            raise ArchiveError(f"{where}/{file['name']} does not read back as written")
        found[kind].extend(rows)
    counts = (len(found["events"]), len(found["blobs"]))
    if counts != (manifest["num_events"], manifest["num_blobs"]):
        raise ArchiveError(f"the archive of {run!r} misses files its manifest counts")
    return Archive(manifest, hashlib.sha256(text).hexdigest(), found["events"], found["blobs"])


def _parquet(kind: str, rows: Sequence[dict[str, Any]], shortener: Shortener) -> bytes:
    if kind == "events":
        rows = [shortener.event(row) for row in rows]
    table = pa.Table.from_pylist(list(rows), schema=SCHEMAS[kind])
    out = io.BytesIO()
    pq.write_table(
        table,
        out,
        compression="zstd",
        compression_level=ZSTD_LEVEL,
        use_dictionary=["stream_id", "type", "codec"],
        write_statistics=False,
    )
    return out.getvalue()


def _blob_row(columns: dict[str, Any]) -> dict[str, Any]:
    body, codec = columns["body"], columns["codec"]
    return {
        "hash": blob_hash(blob_text(body, codec)),
        "body": body,
        "size": len(body),
        "codec": codec,
    }


def _by_count(size: int) -> Callable[[Sequence[Any]], Iterable[Sequence[Any]]]:
    def cut(rows: Sequence[Any]) -> Iterable[Sequence[Any]]:
        return (rows[start : start + size] for start in range(0, len(rows), size))

    return cut


def _by_bytes(limit: int) -> Callable[[Sequence[dict[str, Any]]], Iterable[Sequence[Any]]]:
    def cut(rows: Sequence[dict[str, Any]]) -> Iterable[Sequence[Any]]:
        segment: list[dict[str, Any]] = []
        held = 0
        for row in rows:
            if segment and held + len(row["body"]) > limit:
                yield segment
                segment, held = [], 0
            segment.append(row)
            held += len(row["body"])
        if segment:
            yield segment

    return cut


def _put(fs: Any, path: str, data: bytes) -> None:
    """Write a whole file: on a local disk under a temporary name, synced, then renamed."""
    from fsspec.implementations.local import LocalFileSystem

    if not isinstance(fs, LocalFileSystem):
        fs.pipe_file(path, data)  # an object store's PUT: the whole object or none
        return
    partial = f"{path}.partial"
    with open(partial, "wb") as out:
        out.write(data)
        out.flush()
        os.fsync(out.fileno())
    os.replace(partial, path)
    directory = os.open(os.path.dirname(path), os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)
