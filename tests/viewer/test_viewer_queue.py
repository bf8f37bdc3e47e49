"""A run's feedback queue in the viewer (`/queue?run=RUN&name=NAME`), on both databases.

The recorded run (recorded_run.py) queues its finished rollouts in groups by policy step,
group and id: r0a, r0b (step 0, g0), r1a (step 0, g1; r1b failed), r2a, r2b (step 1, g2),
then r0v (a validation rollout: no policy step). A rollout leaves NAME's queue once a
`feedback` event by NAME judges it whole; the queue's form posts to the trajectory panel's
address, under the same checks.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlencode

import httpx
import pytest
from browser import chromium, console_errors
from recorded_run import RUN, record_run
from selenium.common.exceptions import WebDriverException
from selenium.webdriver.common.action_chains import ActionChains
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support.ui import WebDriverWait

import artstore
from artstore.viewer.server import BackgroundViewer


@pytest.fixture
def recorded_url(database_url: str) -> str:
    async def record() -> None:
        async with await artstore.open_store(database_url) as store:
            await record_run(store)
            # Judged already, but not whole, or by someone else: still in alice's queue.
            await store.feedback("r0a", label="verbose", call_index=0, name="alice")
            await store.feedback("r0b", score=0.5, name="bob")

    asyncio.run(record())
    return database_url


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with chromium() as driver:
        yield driver


def queue_path(name: str = "alice", after: str | None = None) -> str:
    return "queue?" + urlencode({"run": RUN, "name": name, **({"after": after} if after else {})})


def shown(address: str, path: str) -> tuple[str | None, str]:
    """The rollout the queue page shows (None: none), and the page."""
    page = httpx.get(address + path, timeout=60)
    assert page.status_code == 200, page.text
    found = re.search(r'id="queue-rollout" data-rollout="([^"]+)"', page.text)
    return (found[1] if found else None), page.text


def feedback_events(url: str) -> list[dict[str, Any]]:
    """Every `feedback` event of the store, in order: its stream and its payload."""

    async def read() -> list[Any]:
        async with await artstore.open_store(url, read_only=True) as store:
            return await store.read_all(types=["feedback"])

    return [{"stream": e.stream_id, **e.data} for e in asyncio.run(read())]


def post(address: str, rollout_id: str, fields: dict[str, str], **headers: str) -> httpx.Response:
    return httpx.post(
        f"{address}trajectories/{rollout_id}/feedback",
        content=urlencode(fields),
        headers={"content-type": "application/x-www-form-urlencoded", **headers},
        timeout=60,
    )


def test_the_queue_shows_the_next_rollout_records_skips_and_refuses(recorded_url):
    with BackgroundViewer(recorded_url, allow_feedback=True) as viewer:
        address, own = viewer.address, viewer.address.rstrip("/")
        assert shown(address, queue_path())[0] == "r0a"  # a call's judgement is no whole one
        assert shown(address, queue_path("bob"))[0] == "r0a"
        assert shown(address, queue_path("bob", after="r0a"))[0] == "r1a"  # bob judged r0b
        page = shown(address, queue_path())[1]
        token = re.search(r'name="csrf_token" value="([^"]+)"', page)[1]
        assert 'name="queue" value="arith-001"' in page and "0 of 6 rollouts judged" in page
        assert "read-only view, but for feedback" in page  # the header says it writes
        form = {"score": "1", "label": "right", "comment": "short", "name": "alice"}
        form |= {"queue": RUN, "csrf_token": token}
        for headers, sent in [
            ({"origin": "http://evil.example"}, form),
            ({"sec-fetch-site": "cross-site", "origin": own}, form),
            ({"origin": own}, form | {"csrf_token": "guessed"}),
        ]:
            refused = post(address, "r0a", sent, **headers)
            assert refused.status_code == 403, refused.text
            assert refused.text.startswith("403: the viewer takes feedback from itself only")
        empty = form | {"score": "", "label": "", "comment": ""}
        assert post(address, "r0a", empty, origin=own).status_code == 400
        assert feedback_events(recorded_url)[2:] == []

        done = post(address, "r0a", form, origin=own, **{"sec-fetch-site": "same-origin"})
        assert done.status_code == 303
        assert done.headers["location"] == "/" + queue_path(after="r0a")
        following, page = shown(address, done.headers["location"].lstrip("/"))
        assert following == "r0b" and "1 of 6 rollouts judged" in page
        # Skipped: the next after r0b; the last one skipped, the page offers the start again.
        assert shown(address, queue_path(after="r0b"))[0] == "r1a"
        last, page = shown(address, queue_path(after="r0v"))
        assert last is None and 'id="queue-restart"' in page and "5 not judged" in page
        assert shown(address, queue_path())[0] == "r0b"
    recorded = feedback_events(recorded_url)[2:]
    assert [(e["stream"], e["name"], e["score"], e["label"], e["comment"]) for e in recorded] == [
        ("feedback-r0a", "alice", 1.0, "right", "short")
    ]


def test_a_run_judged_whole_says_nothing_is_left(recorded_url):
    async def judge_all() -> None:
        async with await artstore.open_store(recorded_url) as store:
            for rollout_id in ("r0a", "r0b", "r1a", "r2a", "r2b", "r0v"):
                await store.feedback(rollout_id, comment="seen", name="carol")

    asyncio.run(judge_all())
    with BackgroundViewer(recorded_url) as viewer:
        rollout, page = shown(viewer.address, queue_path("carol"))
        assert rollout is None and "Nothing left: human:carol has judged every rollout" in page
        # Read-only: the queue shows the next rollout, and says how to record feedback.
        rollout, page = shown(viewer.address, queue_path())
        assert rollout == "r0a" and 'id="queue-read-only"' in page
        assert '"readonly">read-only view</span>' in page
        assert 'id="queue-form"' not in page and 'id="queue-skip"' in page
        run_page = httpx.get(viewer.address + "runs/" + RUN, timeout=60).text
        assert 'id="queue-start-form"' not in run_page
        unknown = httpx.get(viewer.address + "queue?run=nope", timeout=60)
        assert unknown.status_code == 404 and "no run &#39;nope&#39; in this store" in unknown.text


def test_feedback_with_the_keyboard_only(browser, recorded_url):
    with BackgroundViewer(recorded_url, allow_feedback=True) as viewer:
        browser.get(viewer.address + "runs/" + RUN)
        browser.find_element("css selector", "#queue-start-form input[name=name]").send_keys(
            "dave", Keys.ENTER
        )
        wait_for_rollout(browser, "r0a")
        ActionChains(browser).send_keys("1", Keys.ENTER).perform()  # score 1, record
        wait_for_rollout(browser, "r0b")
        ActionChains(browser).send_keys("s").perform()  # skip r0b
        wait_for_rollout(browser, "r1a")
        # Score 0, out of the field, to the label, and record.
        ActionChains(browser).send_keys("0", Keys.ESCAPE, "l", "wrong", Keys.ENTER).perform()
        wait_for_rollout(browser, "r2a")
        assert console_errors(browser) == []  # no script refused (CSP), none failed
    recorded = feedback_events(recorded_url)[2:]
    assert [(e["stream"], e["name"], e["score"], e["label"]) for e in recorded] == [
        ("feedback-r0a", "dave", 1.0, None),
        ("feedback-r1a", "dave", 0.0, "wrong"),
    ]


def wait_for_rollout(browser: Any, rollout_id: str) -> None:
    """Wait until the queue page (loaded whole) shows `rollout_id`."""
    WebDriverWait(browser, 60, poll_frequency=0.05, ignored_exceptions=(WebDriverException,)).until(
        lambda d: d.execute_script(
            "const r = document.getElementById('queue-rollout');"
            "return document.readyState === 'complete' && !!r"
            " && r.dataset.rollout === arguments[0]",
            rollout_id,
        )
    )
