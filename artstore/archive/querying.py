"""`artstore sql --archived`: the views over archived runs, one query away.

The runs archived under a target are restored into a SQLite file of their own, in a
temporary folder, and the query runs there through the same read-only path as any
`artstore sql` query: the same views, computed by the same projections, so an archived
run answers exactly as it did in the database. The folder is removed afterwards; the
archives are only read.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import orjson

from artstore.archive.files import MANIFEST, run_location
from artstore.errors import ArchiveError

if TYPE_CHECKING:
    from artstore.store import Store


def archived_runs(target: str) -> list[str]:
    """The runs archived under `target` (each folder with a manifest), by name."""
    fs, root = run_location(target, "")
    root = root.rstrip("/")
    if not fs.exists(root):
        raise ArchiveError(f"no archives in {target}")
    runs = []
    for folder in sorted(fs.ls(root, detail=False)):
        manifest = f"{folder.rstrip('/')}/{MANIFEST}"
        if fs.exists(manifest):
            runs.append(orjson.loads(fs.cat_file(manifest))["run"])
    return runs


@asynccontextmanager
async def archived_store(target: str) -> AsyncIterator[Store]:
    """A read-only store holding every run archived under `target`, restored."""
    import artstore
    from artstore.archive import restore_run

    runs = archived_runs(target)
    folder = Path(tempfile.mkdtemp(prefix="artstore-archived-"))
    url = f"sqlite:///{folder / 'archived.db'}"
    try:
        async with await artstore.open_store(url) as store:
            for run in runs:
                await restore_run(store, run, target)
        async with await artstore.open_store(url, read_only=True) as store:
            yield store
    finally:
        shutil.rmtree(folder, ignore_errors=True)
