"""`artstore archive RUN --to s3://bucket/prefix` and back, against a local S3 server
(moto's, a subprocess of the test on a free port), on SQLite and PostgreSQL."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest
from archive_helpers import run_streams, run_views, stored_events
from recorded_run import RUN, record_run

from artstore.archive import archive_run, restore_run

BUCKET = "artstore-archive-test"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture
def s3_endpoint(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A local S3 server with an empty bucket; botocore finds it by the environment."""
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    endpoint = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or server.poll() is not None:
                    pytest.fail("moto's S3 server did not start")
                time.sleep(0.1)
        for name, value in {
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_ENDPOINT_URL": endpoint,
        }.items():
            monkeypatch.setenv(name, value)
        import s3fs

        s3fs.S3FileSystem.clear_instance_cache()
        s3fs.S3FileSystem().mkdir(BUCKET)
        yield endpoint
    finally:
        server.terminate()
        server.wait(timeout=30)


async def test_a_run_archived_to_s3_comes_back_as_stored(store, s3_endpoint: str):
    import s3fs

    await record_run(store)
    streams = await run_streams(store, RUN)
    events, views = await stored_events(store, streams), await run_views(store, RUN)
    target = f"s3://{BUCKET}/runs"

    archived = await archive_run(store, RUN, target)

    names = sorted(p.rsplit("/", 1)[1] for p in s3fs.S3FileSystem().ls(f"{BUCKET}/runs/{RUN}"))
    assert [name.split("-")[0] for name in names] == ["blobs", "events", "manifest.json"]
    assert await stored_events(store, streams) == []
    restored = await restore_run(store, RUN, target)
    assert restored.manifest_sha256 == archived.manifest_sha256
    assert await stored_events(store, streams) == events
    assert await run_views(store, RUN) == views
