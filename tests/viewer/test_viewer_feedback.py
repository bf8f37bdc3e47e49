"""The trajectory page's feedback panel, in a real browser, on both databases.

Only a viewer started with `--allow-feedback` shows it and takes its POST; the POST must
come from the viewer's own page (its CSRF token, Origin and Sec-Fetch-Site), as the SQL
page's does. What it records is a reward by `human:NAME`, like `artstore feedback`.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlencode

import httpx
import pytest
from browser import chromium
from recorded_run import record_run
from selenium.common.exceptions import WebDriverException
from selenium.webdriver.support.ui import WebDriverWait

import artstore
from artstore.analysis.sql import query
from artstore.viewer.server import BackgroundViewer


@pytest.fixture
def recorded_url(database_url: str) -> str:
    async def record() -> None:
        async with await artstore.open_store(database_url) as store:
            await record_run(store)

    asyncio.run(record())
    return database_url


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with chromium() as driver:
        yield driver


def human_rewards(url: str) -> list[tuple[Any, ...]]:
    async def read() -> list[tuple[Any, ...]]:
        async with await artstore.open_store(url, read_only=True) as store:
            sql = (
                "SELECT rollout_id, scorer, reward FROM v_rewards "
                "WHERE scorer LIKE 'human:%' ORDER BY id"
            )
            return (await query(store, sql)).rows

    return asyncio.run(read())


def post(address: str, path: str, fields: dict[str, str], **headers: str) -> httpx.Response:
    return httpx.post(
        address.rstrip("/") + path,
        content=urlencode(fields),
        headers={"content-type": "application/x-www-form-urlencoded", **headers},
        timeout=60,
    )


def test_the_panel_records_a_score_as_a_reward_by_human_name(browser, recorded_url):
    with BackgroundViewer(recorded_url, allow_feedback=True) as viewer:
        browser.get(viewer.address + "trajectories/r0b")
        browser.find_element("id", "feedback-score").send_keys("0.75")
        browser.find_element("id", "feedback-label").send_keys("wrong-tool")
        browser.find_element("id", "feedback-comment").send_keys("multiplied instead")
        browser.find_element("id", "feedback-name").send_keys("alice")
        browser.find_element("css selector", "#feedback-form button").click()
        # The POST answers with a redirect to the page again: wait for that new page (an
        # element of the old one goes stale while the browser navigates).
        WebDriverWait(
            browser, 60, poll_frequency=0.05, ignored_exceptions=(WebDriverException,)
        ).until(
            lambda d: d.execute_script(
                "const t = document.getElementById('rewards-table');"
                "return location.hash === '#feedback' && document.readyState === 'complete'"
                " && !!t && t.textContent.includes('human:alice')"
            )
        )
    assert human_rewards(recorded_url) == [("r0b", "human:alice", 0.75)]


def test_a_read_only_viewer_shows_no_panel_and_takes_no_feedback(browser, recorded_url):
    with BackgroundViewer(recorded_url) as viewer:
        browser.get(viewer.address + "trajectories/r0b")
        assert browser.find_elements("id", "feedback-form") == []
        page = httpx.get(viewer.address + "sql", timeout=60).text
        token = re.search(r'name="csrf_token" value="([^"]+)"', page)[1]
        refused = post(
            viewer.address, "/trajectories/r0b/feedback", {"score": "1", "csrf_token": token}
        )
        assert refused.status_code == 403 and "read-only" in refused.text
    assert human_rewards(recorded_url) == []


def test_feedback_comes_only_from_the_viewers_own_page(recorded_url):
    with BackgroundViewer(recorded_url, allow_feedback=True) as viewer:
        page = httpx.get(viewer.address + "trajectories/r0b", timeout=60).text
        token = re.search(r'name="csrf_token" value="([^"]+)"', page)[1]
        fields = {"score": "1", "name": "mallory", "csrf_token": token}
        own = viewer.address.rstrip("/")
        for headers, why in [
            ({"origin": "http://evil.example"}, "another site"),
            ({"sec-fetch-site": "cross-site", "origin": own}, "another site"),
            ({"origin": own}, "token"),  # the token is wrong below
        ]:
            sent = fields if why != "token" else fields | {"csrf_token": "guessed"}
            refused = post(viewer.address, "/trajectories/r0b/feedback", sent, **headers)
            assert refused.status_code == 403, refused.text
            assert refused.text.startswith("403: the viewer takes feedback from itself only")
            assert why in refused.text
        bad = post(
            viewer.address, "/trajectories/r0b/feedback", fields | {"score": "x"}, origin=own
        )
        assert bad.status_code == 400 and "not a number" in bad.text
        assert human_rewards(recorded_url) == []
        done = post(viewer.address, "/trajectories/r0b/feedback", fields, origin=own)
        assert done.status_code == 303 and done.headers["location"].endswith("#feedback")
    assert human_rewards(recorded_url) == [("r0b", "human:mallory", 1.0)]
