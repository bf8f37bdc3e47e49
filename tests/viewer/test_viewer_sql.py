"""The viewer's SQL page over HTTP, on both databases: a query runs only when its own page
posts it (CSRF token, Origin and Sec-Fetch-Site), within bounds of rows, bytes and time; a
client that goes away cancels its query; `artstore ui` stops on SIGTERM and SIGINT while a
query runs, serves its printed address on `::1`, and asks for its token beyond loopback.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlencode, urlsplit

import httpx
import pytest
from recorded_run import record_run
from waiting import wait_until

import artstore

ROOT = Path(__file__).resolve().parents[2]
PEAK_KIB = 500 * 1024
ARTSTORE = [sys.executable, "-c", "from artstore.cli import main; main()"]
FAILING = "SELECT * FROM no_such_view"  # says so in an error, when it runs
ENDLESS = "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n) SELECT i FROM n"
FOREVER = "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n) SELECT count(*) FROM n"


@pytest.fixture
def recorded_url(database_url: str) -> str:
    async def record() -> None:
        async with await artstore.open_store(database_url) as store:
            await record_run(store)

    asyncio.run(record())
    return database_url


@contextmanager
def background_viewer(url: str, **options: Any) -> Iterator[Any]:
    from artstore.viewer.server import BackgroundViewer

    with BackgroundViewer(url, **options) as viewer:
        yield viewer


def form_token(client: httpx.Client, address: str) -> str:
    page = client.get(address + "sql")
    assert page.status_code == 200
    found = re.search(r'name="csrf_token" value="([^"]+)"', page.text)
    assert found, page.text
    return found.group(1)


def post_query(
    client: httpx.Client, address: str, statement: str, token: str, **headers: str
) -> httpx.Response:
    origin = address.rstrip("/")
    return client.post(
        address + "sql",
        content=urlencode({"q": statement, "csrf_token": token}),
        headers={
            "content-type": "application/x-www-form-urlencoded",
            "origin": origin,
            "sec-fetch-site": "same-origin",
            **headers,
        },
    )


def result_rows(page: str) -> int:
    body = page.split("<tbody>", 1)[1].split("</tbody>", 1)[0] if "<tbody>" in page else ""
    return body.count("<tr>")


# --- GET shows, POST runs, other origins run nothing ---------------------------------------


def test_get_shows_the_form_and_runs_nothing(recorded_url):
    with background_viewer(recorded_url) as viewer, httpx.Client(timeout=120) as client:
        page = client.get(viewer.address + "sql", params={"q": FAILING})
        assert page.status_code == 200
        assert FAILING in page.text  # in the form, ready to run
        assert 'id="sql-error"' not in page.text and 'id="sql-result"' not in page.text


def test_a_query_runs_only_when_its_own_page_posts_it(recorded_url):
    with background_viewer(recorded_url) as viewer, httpx.Client(timeout=120) as client:
        address = viewer.address
        token = form_token(client, address)
        refused = [
            post_query(client, address, FAILING, ""),
            post_query(client, address, FAILING, "not-the-token"),
            post_query(client, address, FAILING, token, origin="http://evil.example"),
            post_query(client, address, FAILING, token, **{"sec-fetch-site": "cross-site"}),
            post_query(client, address, FAILING, token, **{"sec-fetch-site": "same-site"}),
        ]
        for answer in refused:
            assert answer.status_code == 403, answer.text
            assert "no_such_view" not in answer.text  # nothing ran
        ran = post_query(client, address, "SELECT run, status FROM v_runs", token)
        assert ran.status_code == 200
        assert result_rows(ran.text) == 1 and "arith-001" in ran.text
        failed = post_query(client, address, FAILING, token)
        assert failed.status_code == 400 and "no_such_view" in failed.text
        # A client without a browser's headers, with the token, is let in.
        bare = client.post(
            address + "sql",
            content=urlencode({"q": "SELECT 1 AS one", "csrf_token": token}),
            headers={"content-type": "application/x-www-form-urlencoded"},
        )
        assert bare.status_code == 200 and result_rows(bare.text) == 1


# --- bounds ---------------------------------------------------------------------------------


def test_the_page_shows_at_most_its_rows(recorded_url):
    counting = "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 5000) "
    with background_viewer(recorded_url) as viewer, httpx.Client(timeout=120) as client:
        token = form_token(client, viewer.address)
        for statement in (counting + "SELECT i FROM n", ENDLESS):  # the endless one stops too
            page = post_query(client, viewer.address, statement, token)
            assert page.status_code == 200
            assert result_rows(page.text) == 1000
            assert "more than 1000 rows" in page.text


def test_the_page_stops_a_query_at_its_deadline(recorded_url):
    with background_viewer(recorded_url, sql_timeout=2) as viewer:
        with httpx.Client(timeout=300) as client:
            token = form_token(client, viewer.address)
            page = post_query(client, viewer.address, FOREVER, token)
        assert page.status_code == 400
        assert "time limit" in page.text


async def _queries_running(url: str, fragment: str) -> int:
    async with await artstore.open_store(url, read_only=True) as store:
        async with store.database.read() as connection:
            from sqlalchemy import text

            found = await connection.execute(
                text(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                    "AND state = 'active' AND query LIKE :fragment AND pid <> pg_backend_pid()"
                ),
                {"fragment": f"%{fragment}%"},
            )
            return found.scalar()


def _slow_query(dialect: str) -> str:
    return "SELECT pg_sleep(600)" if dialect == "postgresql" else FOREVER


def test_a_client_that_goes_away_cancels_its_query(recorded_url):
    dialect = recorded_url.split(":", 1)[0]
    with background_viewer(recorded_url, sql_timeout=600) as viewer:
        with httpx.Client(timeout=120) as client:
            token = form_token(client, viewer.address)
        host, port = urlsplit(viewer.address).hostname, urlsplit(viewer.address).port
        body = urlencode({"q": _slow_query(dialect), "csrf_token": token}).encode()
        with socket.create_connection((host, port), timeout=120) as connection:
            connection.sendall(
                f"POST /sql HTTP/1.1\r\nHost: {host}:{port}\r\n"
                "Content-Type: application/x-www-form-urlencoded\r\n"
                f"Content-Length: {len(body)}\r\n\r\n".encode()
                + body
            )
            wait_until(lambda: viewer.queries_running() == 1, "the query to start")
            if dialect == "postgresql":
                wait_until(
                    lambda: asyncio.run(_queries_running(recorded_url, "pg_sleep(600)")) == 1,
                    "the server to run it",
                )
        wait_until(lambda: viewer.queries_running() == 0, "the query to be cancelled")
        if dialect == "postgresql":
            wait_until(
                lambda: asyncio.run(_queries_running(recorded_url, "pg_sleep(600)")) == 0,
                "the server to stop it",
            )


# --- `artstore ui` as a process -------------------------------------------------------------


def environment() -> dict[str, str]:
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path}


@contextmanager
def artstore_ui(url: str, *args: str) -> Iterator[tuple[subprocess.Popen, str]]:
    """`artstore ui --port 0 --url URL ARGS` running; (the process, the address it printed)."""
    process = subprocess.Popen(
        [*ARTSTORE, "ui", "--port", "0", "--url", url, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=environment(),
    )
    try:
        line = process.stdout.readline()
        found = re.search(r"(http://\S+/\S*)", line)
        assert found, line + process.stderr.read()
        yield process, found.group(1)
    finally:
        if process.poll() is None:
            process.kill()
        process.wait()


def peak_kib(process: subprocess.Popen) -> int:
    status = Path(f"/proc/{process.pid}/status").read_text()
    return int(re.search(r"VmHWM:\s+(\d+) kB", status).group(1))


def cpu_seconds(process: subprocess.Popen) -> float:
    fields = Path(f"/proc/{process.pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_a_huge_value_is_one_line_and_the_viewer_stays_small(recorded_url):
    dialect = recorded_url.split(":", 1)[0]
    huge = (
        [
            "SELECT zeroblob(120000000) AS big",
            "SELECT replace(hex(zeroblob(1000)), '00', printf('%.*c', 120000, 'x')) AS big",
        ]
        if dialect == "sqlite"
        else ["SELECT repeat('x', 120000000) AS big"]
    )
    with artstore_ui(recorded_url) as (process, address):
        with httpx.Client(timeout=300) as client:
            token = form_token(client, address)
            for statement in huge:
                page = post_query(client, address, statement, token)
                assert page.status_code == 400
                error = re.search(r'id="sql-error">([^<]*)<', page.text).group(1)
                assert "MiB" in error and "\n" not in error.strip()
        assert peak_kib(process) < PEAK_KIB


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_ui_stops_on_a_signal_while_a_query_runs(recorded_url, stop):
    dialect = recorded_url.split(":", 1)[0]
    with artstore_ui(recorded_url, "--sql-timeout", "600") as (process, address):
        with httpx.Client(timeout=600) as client:
            token = form_token(client, address)
            before = cpu_seconds(process)
            waiting = threading.Thread(
                target=lambda: _post_ignoring_errors(client, address, _slow_query(dialect), token),
                daemon=True,
            )
            waiting.start()
            if dialect == "postgresql":
                wait_until(
                    lambda: asyncio.run(_queries_running(recorded_url, "pg_sleep(600)")) == 1,
                    "the query to start",
                )
            else:  # the viewer counts, alone on its CPU
                wait_until(lambda: cpu_seconds(process) > before + 1, "the query to start")
            process.send_signal(stop)
            try:
                process.wait(timeout=120)
            except subprocess.TimeoutExpired:
                pytest.fail(f"artstore ui went on after {stop.name} for 120 s")
            waiting.join(timeout=120)
    if dialect == "postgresql":
        assert asyncio.run(_queries_running(recorded_url, "pg_sleep(600)")) == 0


def _post_ignoring_errors(client: httpx.Client, address: str, statement: str, token: str) -> None:
    with contextlib.suppress(httpx.HTTPError):  # the viewer went away: that is the point
        post_query(client, address, statement, token)


def _ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
    except OSError:
        return False
    return True


@pytest.mark.skipif(not _ipv6_loopback(), reason="this machine has no IPv6 loopback")
def test_ui_on_ipv6_loopback_serves_its_printed_address(recorded_url):
    with artstore_ui(recorded_url, "--host", "::1") as (_, address):
        assert address.startswith("http://[::1]:")
        with httpx.Client(timeout=120) as client:
            assert client.get(address).status_code == 200
            assert client.get(address + "api/runs").json()[0]["run"] == "arith-001"
            token = form_token(client, address)
            assert post_query(client, address, "SELECT 1 AS one", token).status_code == 200


def test_ui_beyond_loopback_asks_for_the_token_it_printed(recorded_url):
    with artstore_ui(recorded_url, "--host", "0.0.0.0") as (_, printed):
        token = re.search(r"[?&]token=([\w-]+)", printed)
        assert token, printed
        port = urlsplit(printed).port
        address = f"http://127.0.0.1:{port}/"
        with httpx.Client(timeout=120) as stranger:
            for path in ("", "api/runs", "sql", "static/viewer.css"):
                assert stranger.get(address + path).status_code == 403
            assert stranger.get(address, params={"token": "guess"}).status_code == 403
        with httpx.Client(timeout=120) as browser:
            assert browser.get(address, params={"token": token.group(1)}).status_code == 200
            # The token is kept as a cookie: the pages and what they fetch need no more.
            assert browser.get(address + "api/runs").status_code == 200
            csrf = form_token(browser, address)
            assert post_query(browser, address, "SELECT 1 AS one", csrf).status_code == 200
