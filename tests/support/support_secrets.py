"""Looking for a secret wherever artstore keeps or shows data.

    leaks = await places_holding(store, database_url, run, secret, tmp_path)
    assert leaks == []

`places_holding` names each place whose text holds `secret`: any column of any table or
view, a SQLite file (its WAL included), a blob's text or the tokens of a logprob list
joined (a model spells a key over several tokens), a JSONL or parquet export of `run`, a
page of the viewer, or the output of an `artstore` command. Read paths never redact, so
they run in this process: what they show is what the database holds.
"""

from __future__ import annotations

import asyncio
import html
import json
import re
from pathlib import Path
from typing import Any
from urllib.parse import quote

from sqlalchemy import inspect, text


async def places_holding(
    store: Any, database_url: str, run: str, secret: str, folder: Path, *, quick: bool = False
) -> list[str]:
    """The places (names) where `secret` can be read; [] when none. `quick` (for the many
    runs of tests/training/test_guarantee_matrix.py): the viewer's pages rendered in this process,
    and no command run (their output is read from the same places)."""
    await store.flush()
    texts: dict[str, list[str]] = {}
    texts["database"] = await database_texts(store)
    if database_url.startswith("sqlite"):
        path = Path(database_url.removeprefix("sqlite:///"))
        raw = b"".join(p.read_bytes() for p in path.parent.glob(path.name + "*"))
        texts["sqlite files"] = [raw.decode("utf-8", "replace")]
    texts["blobs"] = [spelled for body in await blob_texts(store) for spelled in readings(body)]
    texts["exports"] = await export_texts(store, run, folder)
    rollouts = await rollout_ids(store)
    # In threads: both run event loops of their own.
    if quick:
        texts["viewer"] = await asyncio.to_thread(viewer_pages_in_process, database_url, run)
    else:
        texts["viewer"] = await asyncio.to_thread(viewer_pages, database_url, run, rollouts)
        texts["cli"] = await asyncio.to_thread(command_outputs, database_url, run, rollouts)
    return [
        f"{place}: {len(hits)}, e.g. {excerpt(hits[0], secret)}"
        for place, found in texts.items()
        if (hits := [shown for shown in found if secret in shown])
    ]


def excerpt(shown: str, secret: str) -> str:
    at = shown.index(secret)
    return repr(shown[max(0, at - 150) : at + len(secret) + 30])


def readings(body: str) -> list[str]:
    """A JSON text, and the tokens of each of its logprob lists joined (text and bytes)."""
    try:
        document = json.loads(body)
    except ValueError:
        return [body]
    return [body, *spelled(document)]


def spelled(value: Any) -> list[str]:
    """What every list of logprob entries inside `value` spells, in text and in bytes;
    strings that hold JSON (parquet cells, events) are looked into."""
    if isinstance(value, str) and value[:1] in ("{", "["):
        try:
            return spelled(json.loads(value))
        except ValueError:
            return []
    found: list[str] = []
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, list):
        if value and all(isinstance(e, dict) and "logprob" in e for e in value):
            found.append("".join(str(e.get("token") or "") for e in value))
            joined = b"".join(bytes(e.get("bytes") or []) for e in value)
            found.append(joined.decode("utf-8", "replace"))
        for item in value:
            found += spelled(item)
    return found


async def database_texts(store: Any) -> list[str]:
    """Every row of every table and view, as text."""
    async with store.database.read() as connection:
        names = await connection.run_sync(
            lambda sync: inspect(sync).get_table_names() + inspect(sync).get_view_names()
        )
        rows = []
        for name in names:
            result = await connection.execute(text(f'SELECT * FROM "{name}"'))
            rows += [repr(tuple(row)) for row in result]
    return rows


async def blob_texts(store: Any) -> list[str]:
    """Each blob's text, read back through the blob layer (compact bodies expanded)."""
    from artstore.eventstore.blobs import blob_text

    async with store.database.read() as connection:
        rows = (await connection.execute(text("SELECT body, codec FROM blobs"))).all()
    return [blob_text(row.body, row.codec) for row in rows]


async def rollout_ids(store: Any) -> list[str]:
    async with store.database.read() as connection:
        return list((await connection.execute(text("SELECT rollout_id FROM rollouts"))).scalars())


async def export_texts(store: Any, run: str, folder: Path) -> list[str]:
    """The lines of a JSONL export of `run`, and the rows of its parquet export."""
    import pyarrow.parquet as pq

    from artstore.exchange import export_jsonl, export_parquet

    jsonl = folder / "leak-check.jsonl"
    await export_jsonl(store, run, jsonl, force=True)
    found = [r for line in jsonl.read_text().splitlines() for r in readings(line)]
    parquet = folder / "leak-check-parquet"
    await export_parquet(store, run, parquet, force=True)
    for path in sorted(parquet.rglob("*.parquet")):
        rows = pq.read_table(path).to_pylist()
        found.append(json.dumps(rows, default=str))
        found += spelled(rows)
    return found


def viewer_pages(database_url: str, run: str, rollouts: list[str]) -> list[str]:
    """Every page of the viewer about the store, and the same with its markup removed."""
    import httpx

    from artstore.viewer.server import BackgroundViewer

    paths = ["/", "/api/runs", f"/runs/{quote(run)}", f"/api/runs/{quote(run)}"]
    paths += [f"/trajectories/{rollout}" for rollout in rollouts]
    paths += [f"/compare/scorers?run={quote(run)}", "/compare/runs"]
    paths += [f"/sql?q={quote(f'SELECT * FROM {view}')}" for view in SHOWN_VIEWS]
    # httpx gives up after 5 s by default: a page may take longer on a busy machine.
    with (
        BackgroundViewer(database_url) as viewer,
        httpx.Client(base_url=viewer.address, timeout=120) as web,
    ):
        return page_texts(web, run, paths)


def viewer_pages_in_process(database_url: str, run: str) -> list[str]:
    """The pages of the run, its trajectories and groups, served by the viewer's app in
    this thread (no server, no socket)."""
    from starlette.testclient import TestClient

    from artstore.viewer.app import create_app

    with TestClient(create_app(database_url), base_url="http://127.0.0.1") as web:
        found = re.findall(r"/trajectories/([0-9a-f-]+)", web.get(f"/runs/{quote(run)}").text)
        paths = [f"/runs/{quote(run)}", f"/api/runs/{quote(run)}"]
        paths += [f"/trajectories/{rollout}" for rollout in dict.fromkeys(found)]
        return page_texts(web, run, paths)


def page_texts(web: Any, run: str, paths: list[str]) -> list[str]:
    """Each page of `paths` and of the run's groups, and the same with its markup removed."""
    pages = []
    groups = re.findall(r"/groups/([0-9a-f-]+)", web.get(f"/runs/{quote(run)}").text)
    for path in paths + [f"/groups/{group}" for group in dict.fromkeys(groups)]:
        page = web.get(path)
        assert page.status_code == 200, (path, page.status_code)
        pages += [page.text, html.unescape(re.sub(r"<[^>]*>|\s", "", page.text))]
    return pages


SHOWN_VIEWS = ("v_rollouts", "v_llm_calls", "v_trajectory_messages", "v_groups")


def command_outputs(database_url: str, run: str, rollouts: list[str]) -> list[str]:
    """What `artstore runs`, `show`, `trajectory --logprobs`, `sql` and `export` print,
    stdout and stderr, and the same with the spaces of wrapped lines removed."""
    from typer.testing import CliRunner

    from artstore.cli import app

    commands = [["runs"], ["show", run], ["export", run, "-"]]
    commands += [["trajectory", rollout, "--logprobs"] for rollout in rollouts]
    commands += [["sql", f"SELECT * FROM {view}", "--format", "json"] for view in SHOWN_VIEWS]
    shown = []
    for command in commands:
        result = CliRunner().invoke(app, [*command, "--url", database_url])
        assert result.exit_code == 0, (command, result.output)
        shown += [result.stdout, result.stderr, re.sub(r"[\s│┃|]", "", result.output)]
    return shown
