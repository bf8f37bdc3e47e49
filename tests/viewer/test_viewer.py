"""`artstore ui` in a real browser (Debian's chromium through Selenium), on both databases.

One store per database holds three runs: the hand-made `arith-001` of recorded_run.py
(two scorers, a re-scoring, failures: every number below is worked out by hand from its
docstring), `legs`, trained for real on the demo task then re-scored and replayed into a
second model, and `<i>xss</i>`, whose model answers with HTML and speaks in two
conversations. The viewer runs in a thread of this process; one browser serves the module.
Each page's screenshot goes to $ARTSTORE_SCREENSHOTS (or a folder of the session).
"""

from __future__ import annotations

import asyncio
import functools
import math
import os
import statistics
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import pytest
from browser import chromium, console_errors, save_screenshot
from recorded_run import RUN as ARITH
from recorded_run import record_run
from trained_run import PROJECT, event_count, in_store, new_model, train_run, train_run_sync

XSS_RUN = "<i>xss</i>"
XSS_ANSWER = '<script>window.__xss = 1</script><img src=x onerror="window.__xss = 2"> 42'


@dataclass
class Viewer:
    url: str  # the store's database URL
    address: str  # http://127.0.0.1:PORT/
    database: str  # "sqlite" or "postgresql"
    screenshots: Path
    art_path: Path


# --- the store and the viewer --------------------------------------------------------------


def xss_policy(request: dict[str, Any], sample_index: int) -> str:
    """A model whose answers are markup, and a summariser."""
    last = request["messages"][-1]["content"]
    if str(last).startswith("Summarise"):
        return f"<b>summary</b> of {len(last)} characters"
    return XSS_ANSWER if sample_index == 0 else "42"


async def two_conversations(scenario: dict[str, Any], thread_id: str) -> dict[str, Any]:
    """An agent that asks, then summarises in a conversation of its own (two histories)."""
    from art.langgraph import init_chat_model

    model = init_chat_model()
    answer = await model.ainvoke([("system", "Answer."), ("user", scenario["question"])])
    summary = await model.ainvoke(
        [("system", "You summarise."), ("user", f"Summarise: {answer.content}")]
    )
    return {"answer": answer.content, "summary": summary.content}


async def record_xss_run(store: Any, art_path: Path) -> None:
    from artstore.art_versions import trainable_model
    from artstore.backends import CheckOnlyBackend
    from artstore.testing.inference_server import LocalInferenceServer
    from artstore.training import TrainingConfig, TrainingFramework

    async with LocalInferenceServer(policy=xss_policy) as server:
        backend = CheckOnlyBackend(
            path=art_path, inference_base_url=server.base_url, inference_api_key=server.api_key
        )
        model = trainable_model(name="xss", project=PROJECT, base_model="Qwen/Qwen2.5-0.5B")
        await model.register(backend)
        await TrainingFramework(store, progress=False).run_training(
            model=model,
            scenarios=[{"question": "<b>What</b> is 6*7?"}],
            agent_function=two_conversations,
            reward_function=lambda s, results, t: [
                float("<script>" in r["answer"]) for r in results
            ],
            config=TrainingConfig(epochs=1, batch_size=1, group_size=2, validation_samples=0),
            run=XSS_RUN,
        )


async def fill_store(url: str, art_path: Path) -> None:
    import artstore
    from artstore.demo.task import strict_reward

    async with await artstore.open_store(url) as store:
        await record_run(store)
        await train_run(
            store, art_path, run="legs", epochs=3, scenarios=4, batch_size=2, group_size=4
        )
        await artstore.rescore(store, "legs", strict_reward, "strict")
        await artstore.replay(
            store, "legs", await new_model(art_path, "agent-strict"), scorer="strict"
        )
        await record_xss_run(store, art_path)


@pytest.fixture(scope="module")
def viewer(module_database_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Viewer]:
    from artstore.viewer.server import BackgroundViewer

    database = module_database_url.split(":", 1)[0]
    art_path = tmp_path_factory.mktemp("art") / ".art"
    asyncio.run(fill_store(module_database_url, art_path))
    shots = Path(os.environ.get("ARTSTORE_SCREENSHOTS") or tmp_path_factory.mktemp("screenshots"))
    with BackgroundViewer(module_database_url, runs_refresh_ms=300, run_refresh_ms=300) as served:
        yield Viewer(module_database_url, served.address, database, shots, art_path)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with chromium() as driver:
        yield driver


@pytest.fixture(autouse=True)
def blank_page(browser: Any) -> None:
    """Each test starts on a blank page, with the console log of the last one read."""
    browser.get("about:blank")
    console_errors(browser)


# --- helpers -------------------------------------------------------------------------------


def wait_for(driver: Any, script: str, *args: Any, timeout: float = 20) -> Any:
    """Wait until `script` returns something truthy in the page; return it."""
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, timeout, poll_frequency=0.05).until(
        lambda d: d.execute_script(script, *args)
    )


def visit(driver: Any, viewer: Viewer, path: str, *, ready: str | None = None) -> None:
    driver.get(viewer.address.rstrip("/") + path)
    wait_for(driver, "return document.readyState === 'complete'")
    if ready:
        wait_for(driver, ready)


def shot(driver: Any, viewer: Viewer, name: str) -> None:
    """A screenshot of the page; the browser reported no error on it (CSP included)."""
    suffix = "" if viewer.database == "sqlite" else f"-{viewer.database}"
    path = save_screenshot(driver, viewer.screenshots, f"viewer-{name}{suffix}")
    assert path.stat().st_size > 10_000
    assert console_errors(driver) == []


def texts(driver: Any, selector: str) -> list[str]:
    from selenium.webdriver.common.by import By

    return [e.text for e in driver.find_elements(By.CSS_SELECTOR, selector)]


def chart_lines(driver: Any, canvas_id: str) -> dict[str, list[list[float]]]:
    """The datasets a chart draws (the ± std bands left out), as {label: [[x, y], ...]}."""
    return driver.execute_script(
        """
        const chart = Chart.getChart(arguments[0]);
        const found = {};
        for (const d of chart.data.datasets.filter((d) => !d.band)) {
          found[d.label] = d.data.map((p) => typeof p === "number" ? p : [p.x, p.y]);
        }
        return found;
        """,
        canvas_id,
    )


def chart_bands(driver: Any, canvas_id: str) -> dict[str, list[list[float]]]:
    return driver.execute_script(
        """
        const chart = Chart.getChart(arguments[0]);
        const found = {};
        for (const d of chart.data.datasets.filter((d) => d.band)) {
          found[d.label] = d.data.map((p) => [p.x, p.y]);
        }
        return found;
        """,
        canvas_id,
    )


def metric_chart(driver: Any, metric: str) -> list[list[Any]]:
    """The train-step metric chart of `metric`: [[model, [[step, value], ...]], ...]."""
    return driver.execute_script(
        """
        const canvas = [...document.querySelectorAll("#metric-charts canvas")]
          .find((c) => c.dataset.metric === arguments[0]);
        return Chart.getChart(canvas).data.datasets.map(
          (d) => [d.label, d.data.map((p) => [p.x, p.y])]);
        """,
        metric,
    )


def click_point(driver: Any, canvas_id: str, dataset: int, index: int) -> None:
    """Click where a chart draws point `index` of `dataset`."""
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By

    x, y = driver.execute_script(
        "const p = Chart.getChart(arguments[0]).getDatasetMeta(arguments[1]).data[arguments[2]];"
        "return [p.x, p.y];",
        canvas_id,
        dataset,
        index,
    )
    canvas = driver.find_element(By.ID, canvas_id)
    size = canvas.size  # offsets are from the element's centre
    ActionChains(driver).move_to_element_with_offset(
        canvas, round(x - size["width"] / 2), round(y - size["height"] / 2)
    ).click().perform()


def chart_ready(canvas_id: str) -> str:
    return f"return !!(window.Chart && Chart.getChart({canvas_id!r}))"


def query(url: str, sql: str) -> list[tuple[Any, ...]]:
    from artstore.analysis import query as run_query

    async def rows(store: Any) -> list[tuple[Any, ...]]:
        return (await run_query(store, sql)).rows

    return in_store(url, rows)


def row_of(driver: Any, run: str) -> dict[str, str]:
    """The cells of the runs page's row of `run`, by column."""
    return driver.execute_script(
        """
        const row = [...document.querySelectorAll("#runs-body tr")]
          .find((r) => r.dataset.run === arguments[0]);
        if (!row) return null;
        const cells = {};
        for (const td of row.children) {
          // the cell's text, without the sparkline's (an <svg> with a <title>)
          cells[td.className.split(" ")[0].slice(2)] = [...td.childNodes]
            .filter((n) => n.nodeName.toLowerCase() !== "svg").map((n) => n.textContent).join("");
        }
        return cells;
        """,
        run,
    )


# --- pages ---------------------------------------------------------------------------------


def test_runs_page_lists_each_run_with_its_numbers(browser, viewer):
    visit(browser, viewer, "/", ready="return document.querySelectorAll('#runs-body tr').length")

    arith = row_of(browser, ARITH)
    # 1 completed step; 3 groups sealed, 2 trained; 6 rollouts finished, r1b failed;
    # failures: r1b and the failed train step; reward of the latest policy step (1):
    # r2a 1.0 and r2b 1.0 by "correct"; tokens: the 9 calls' prompt + completion.
    assert arith["status"] == "failed" and arith["steps"] == "1"
    assert (arith["groups"], arith["rollouts"], arith["failures"]) == ("3 / 2", "6 / 1", "2")
    assert arith["reward"] == "1" and arith["tokens"] == "1230"
    legs = row_of(browser, "legs")
    assert legs["model"] == f"{PROJECT}/agent"
    assert legs["status"] == "finished" and legs["steps"] == "6"
    assert (legs["groups"], legs["rollouts"]) == ("12 / 12", "48 / 0")
    # The reward sparkline: one point per policy step.
    points = browser.execute_script(
        "return [...document.querySelectorAll('#runs-body tr')]"
        ".find((r) => r.dataset.run === 'legs').querySelector('polyline').getAttribute('points')"
    )
    assert len(points.split()) == 6
    xss = row_of(browser, XSS_RUN)
    assert xss["run"] == XSS_RUN  # the name as text, not as markup
    link = browser.execute_script(
        "return [...document.querySelectorAll('#runs-body tr a')].map((a) => a.pathname)"
    )
    assert "/runs/arith-001" in link and "/runs/" + quote(XSS_RUN, safe="/") in link
    shot(browser, viewer, "runs")


def test_run_page_draws_reward_curves_metrics_tokens_and_latency(browser, viewer):
    visit(browser, viewer, f"/runs/{ARITH}", ready=chart_ready("reward-curve"))

    curve = chart_lines(browser, "reward-curve")
    # Latest policy rewards per policy step: step 0 "correct" r0a 1.0, r0b 0.25 (re-scored),
    # r1a 0.5; step 1 r2a 1.0, r2b 1.0. "judge": step 0 r0a 0.8, r0b 0.4, r1a 0.3.
    assert list(curve) == ["correct", "judge"]  # the run's scorer first
    assert curve["correct"] == [[0, pytest.approx(1.75 / 3)], [1, 1.0]]
    assert curve["judge"] == [[0, pytest.approx(0.5)]]
    std = statistics.pstdev([1.0, 0.25, 0.5])
    bands = chart_bands(browser, "reward-curve")
    assert bands["correct +std"][0] == [0, pytest.approx(1.75 / 3 + std)]
    assert bands["correct -std"][1] == [1, 1.0]  # no spread at step 1

    # Tokens of the policy calls per step: step 0 r0a 450/60, r0b 100/40, r1a 120/60,
    # r1b 110/15; step 1 r2a 80/8, r2b 80/12.
    tokens = browser.execute_script(
        "const c = Chart.getChart('tokens-chart'); "
        "return [c.data.labels, c.data.datasets.map((d) => [d.label, d.data])]"
    )
    assert tokens == [
        ["0", "1"],
        [["prompt tokens", [780, 160]], ["completion tokens", [175, 20]]],
    ]
    latency = chart_lines(browser, "latency-chart")
    assert latency["mean LLM latency"] == [[0, pytest.approx(4.55 / 6)], [1, 0.5]]
    assert latency["max LLM latency"] == [[0, 2.0], [1, 0.5]]
    assert latency["train step duration"] == [[0, 12.5]]  # the step from policy step 0

    metrics = browser.execute_script(
        "return [...document.querySelectorAll('#metric-charts canvas')]"
        ".map((c) => c.dataset.metric)"
    )
    assert metrics == ["loss", "reward_mean", "num_groups_trainable"]
    assert metric_chart(browser, "loss") == [["arith/agent-001", [[1, 0.25]]]]

    steps = texts(browser, "#steps-table tbody tr")
    assert "0 → 1" in steps[0] and "completed" in steps[0] and "12.50 s" in steps[0]
    assert "1 → ?" in steps[1] and "RuntimeError: CUDA out of memory" in steps[1]
    groups = texts(browser, "#groups-table tbody tr td:first-child a")
    assert groups == ["g0", "g1", "g2"]
    assert "not trained yet" in texts(browser, "#groups-table tbody tr")[2]
    assert texts(browser, "#consumption-table tbody tr") == ["arith/agent-001 2 1 1 1 correct"]
    failures = texts(browser, "#failures-table tbody tr")
    assert "ToolError" in failures[0] and "the search tool timed out" in failures[0]
    assert "rollout r1b" in failures[0] and "group g1" in failures[0]
    assert "train step" in failures[1] and "run" in failures[2]
    assert console_errors(browser) == []


def test_run_page_of_a_run_trained_twice(browser, viewer):
    visit(browser, viewer, "/runs/legs", ready=chart_ready("reward-curve"))

    # Re-scored as "strict" and replayed into tests/agent-strict on those rewards.
    assert list(chart_lines(browser, "reward-curve")) == ["reward", "strict"]
    assert texts(browser, "#consumption-table tbody tr td:first-child") == [
        f"{PROJECT}/agent",
        f"{PROJECT}/agent-strict",
    ]
    expected = query(
        viewer.url,
        "SELECT policy_step, avg(reward) FROM v_rollouts WHERE run = 'legs' "
        "AND role = 'policy' GROUP BY policy_step ORDER BY policy_step",
    )
    assert chart_lines(browser, "reward-curve")["reward"] == [
        [step, pytest.approx(mean)] for step, mean in expected
    ]
    models = [(label, len(points)) for label, points in metric_chart(browser, "reward_mean")]
    assert models == [(f"{PROJECT}/agent", 6), (f"{PROJECT}/agent-strict", 6)]
    shot(browser, viewer, "run")


def test_group_page_puts_rollouts_side_by_side_with_rewards_and_advantages(browser, viewer):
    visit(browser, viewer, "/groups/g0")

    rollouts = browser.execute_script(
        """
        return [...document.querySelectorAll('#rollouts .rollout')].map((r) => ({
          id: r.dataset.rollout,
          classes: r.className,
          rewards: Object.fromEntries([...r.querySelectorAll('tr[data-scorer]')].map(
            (tr) => [tr.dataset.scorer, [tr.querySelector('.reward').textContent,
                                          tr.querySelector('.advantage').textContent]])),
        }));
        """
    )
    # ART's advantages over the policy rollouts r0a, r0b: correct [1.0, 0.25] and judge
    # [0.8, 0.4] give +1 and -1 (to 3 digits); r0v is a validation rollout: none.
    assert [r["id"] for r in rollouts] == ["r0a", "r0b", "r0v"]
    assert rollouts[0]["rewards"] == {"correct": ["1", "1"], "judge": ["0.8", "1"]}
    assert rollouts[1]["rewards"] == {"correct": ["0.25", "-1"], "judge": ["0.4", "-1"]}
    assert rollouts[2]["rewards"] == {"correct": ["0.5", ""], "judge": ["0.6", ""]}
    assert "validation" in rollouts[2]["classes"]
    assert texts(browser, "#group-consumed tbody td")[:3] == ["arith/agent-001", "1", "correct"]
    # Every rollout links to its trajectory; the conversation is there, side by side.
    links = browser.execute_script(
        "return [...document.querySelectorAll('#rollouts h3 a')].map((a) => a.pathname)"
    )
    assert links == ["/trajectories/r0a", "/trajectories/r0b", "/trajectories/r0v"]
    first = texts(browser, "#rollouts .rollout:first-child .msg")
    assert first[0].endswith("You answer arithmetic questions. Use the tools.")
    assert "search" in first[2]

    group_id = query(viewer.url, "SELECT min(group_id) FROM v_groups WHERE run = 'legs'")[0][0]
    visit(browser, viewer, f"/groups/{group_id[:6]}")  # a prefix leads to the group
    assert browser.current_url.endswith(f"/groups/{group_id}")
    shot(browser, viewer, "group")


def test_trajectory_page_colours_each_token_by_its_logprob(browser, viewer):
    from artstore.viewer.templating import number

    (rollout_id,) = query(
        viewer.url,
        "SELECT min(rollout_id) FROM v_rollouts WHERE run = 'legs' AND num_tool_calls = 2",
    )[0]
    trajectory = in_store(viewer.url, lambda store: store.trajectory(rollout_id))
    tokens = [
        (token.token, token.logprob)
        for item in trajectory.messages_and_choices
        if not isinstance(item, dict)
        for token in item.logprobs.content
    ]

    visit(browser, viewer, f"/trajectories/{rollout_id}")

    shown = browser.execute_script(
        "return [...document.querySelectorAll('.msg.assistant .tokens span')]"
        ".map((s) => [s.textContent, s.title, s.className])"
    )
    assert [text for text, _, _ in shown] == [token for token, _ in tokens]
    for (_, title, css), (_, logprob) in zip(shown, tokens, strict=True):
        assert title.startswith(f"logprob {number(logprob)} ")
        assert css == f"p{min(9, int(math.exp(logprob) * 10))}"
    assert texts(browser, ".toolcall .name") == ["legs_per_animal", "multiply"]
    roles = browser.execute_script(
        "return [...document.querySelectorAll('#history-0 .msg .role-name')]"
        ".map((e) => e.textContent)"
    )
    assert roles == ["system", "user", "assistant", "tool", "assistant", "tool", "assistant"]
    rewards = texts(browser, "#rewards-table tbody tr")
    assert [row.split()[0] for row in rewards] == ["reward", "strict"]
    assert len(texts(browser, "#calls-table tbody tr")) == 3
    shot(browser, viewer, "trajectory")


def test_trajectory_page_shows_every_history_and_never_runs_model_output(browser, viewer):
    (rollout_id,) = query(
        viewer.url,
        f"SELECT rollout_id FROM v_rollouts WHERE run = '{XSS_RUN}' AND reward = 1.0",
    )[0]
    visit(browser, viewer, f"/trajectories/{rollout_id}")

    said = texts(browser, "#history-0 .msg.assistant .tokens")
    assert said == [XSS_ANSWER]  # shown as text
    assert texts(browser, "#history-1 h2") == ["Additional history 1"]
    assert "<b>summary</b>" in texts(browser, "#history-1 .msg.assistant")[0]
    assert "Summarise: " + XSS_ANSWER in texts(browser, "#history-1 .msg.user")[0]
    assert browser.execute_script("return window.__xss === undefined")
    assert (
        browser.execute_script("return document.querySelectorAll('main img, main b').length") == 0
    )
    assert '"answer": "' in texts(browser, "#result")[0]
    assert console_errors(browser) == []

    visit(browser, viewer, "/runs/" + quote(XSS_RUN, safe=""), ready=chart_ready("reward-curve"))
    assert texts(browser, "h1")[0].startswith(XSS_RUN)
    assert browser.execute_script("return document.querySelectorAll('main i').length") == 0


def test_compare_scorers_plots_one_against_the_other(browser, viewer):
    visit(
        browser,
        viewer,
        f"/compare/scorers?run={ARITH}&x=correct&y=judge",
        ready=chart_ready("scorer-scatter"),
    )

    points = chart_lines(browser, "scorer-scatter")
    # Latest rewards of the rollouts scored by both: correct against judge.
    assert points["policy rollouts"] == [[1.0, 0.8], [0.25, 0.4], [0.5, 0.3]]
    assert points["validation rollouts"] == [[0.5, 0.6]]
    pairs = [(1.0, 0.8), (0.25, 0.4), (0.5, 0.6), (0.5, 0.3)]
    expected = statistics.correlation([x for x, _ in pairs], [y for _, y in pairs])
    assert texts(browser, "#correlation") == [f"{expected:.3g}"]

    # A point of one rollout opens its trajectory.
    click_point(browser, "scorer-scatter", 0, 1)
    wait_for(browser, "return location.pathname === '/trajectories/r0b'")

    visit(browser, viewer, "/compare/scorers?run=legs", ready=chart_ready("scorer-scatter"))
    assert texts(browser, "h1") == ["Scorers of legs: reward against strict"]
    # 48 rollouts, few distinct pairs of rewards: a point stands for all that share it.
    counts = browser.execute_script(
        "return Chart.getChart('scorer-scatter').data.datasets[0].data"
        ".map((p) => p.rollout_ids.length)"
    )
    assert sum(counts) == 48 and len(counts) < 48
    biggest = counts.index(max(counts))
    click_point(browser, "scorer-scatter", 0, biggest)
    picked = wait_for(browser, "return document.querySelectorAll('#pairs-table tr.picked').length")
    assert picked == max(counts)
    shot(browser, viewer, "compare-scorers")


def test_compare_runs_draws_both_reward_curves(browser, viewer):
    visit(browser, viewer, f"/compare/runs?a={ARITH}&b=legs", ready=chart_ready("runs-curve"))

    curves = chart_lines(browser, "runs-curve")
    expected = query(
        viewer.url,
        "SELECT policy_step, avg(reward) FROM v_rollouts WHERE run = 'legs' "
        "AND role = 'policy' GROUP BY policy_step ORDER BY policy_step",
    )
    assert curves == {
        f"{ARITH} (correct)": [[0, pytest.approx(1.75 / 3)], [1, 1.0]],
        "legs (reward)": [[step, pytest.approx(mean)] for step, mean in expected],
    }
    assert [row.split()[0] for row in texts(browser, "#compared-table tbody tr")] == [ARITH, "legs"]
    shot(browser, viewer, "compare-runs")


def test_sql_page_runs_a_read_only_query_and_refuses_writes(browser, viewer):
    visit(browser, viewer, "/sql")
    box = browser.find_element("id", "sql-input")
    box.send_keys(
        "SELECT run, status, num_rollouts, num_failed, total_tokens FROM v_runs "
        "ORDER BY num_rollouts"
    )
    browser.find_element("css selector", "#sql-form button").click()
    wait_for(browser, "return !!document.getElementById('sql-result')")

    rows = texts(browser, "#sql-result tbody tr")
    assert rows[0].split() == [XSS_RUN, "finished", "2", "0", rows[0].split()[-1]]
    assert rows[1].split() == [ARITH, "failed", "7", "1", "1230"]
    assert texts(browser, "#sql-count") == ["3 rows"]
    links = browser.execute_script(
        "return [...document.querySelectorAll('#sql-result a')].map((a) => a.pathname)"
    )
    assert "/runs/arith-001" in links  # ids and runs link to their pages
    shot(browser, viewer, "sql")

    before = in_store(viewer.url, event_count)
    for statement, said in [
        ("DELETE FROM events", "refused: artstore sql only reads"),
        ("SELECT 1; DELETE FROM events", "refused"),
    ]:
        visit(browser, viewer, "/sql?q=" + quote(statement))  # fills the form, runs nothing
        assert browser.find_element("id", "sql-input").get_property("value") == statement
        assert texts(browser, "#sql-error") == []
        browser.find_element("css selector", "#sql-form button").click()
        wait_for(browser, "return !!document.getElementById('sql-error')")
        assert texts(browser, "#sql-error")[0].startswith(said)
    assert in_store(viewer.url, event_count) == before


def test_a_page_of_another_site_cannot_run_a_query(browser, viewer, tmp_path):
    """A page served from another origin posts the SQL form to the viewer (with the
    viewer's real token even, as if it had leaked) and loads its SQL page as an image:
    the browser says where the request comes from, and the viewer runs nothing."""
    import http.server
    import re
    import threading
    import urllib.request

    with urllib.request.urlopen(viewer.address + "sql", timeout=60) as answer:
        token = re.search(r'name="csrf_token" value="([^"]+)"', answer.read().decode())[1]
    failing = quote("SELECT * FROM no_such_view")
    (tmp_path / "index.html").write_text(
        f'<img src="{viewer.address}sql?q={failing}">'
        f'<form method="post" action="{viewer.address}sql">'
        '<input name="q" value="SELECT * FROM no_such_view">'
        f'<input name="csrf_token" value="{token}"></form>'
        "<script>setTimeout(() => document.forms[0].submit(), 200)</script>"
    )
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=tmp_path)
    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler) as other_site:
        threading.Thread(target=other_site.serve_forever, daemon=True).start()
        browser.get(f"http://127.0.0.1:{other_site.server_address[1]}/index.html")
        wait_for(browser, "return location.pathname === '/sql'", timeout=60)
        wait_for(browser, "return document.readyState === 'complete'")
        other_site.shutdown()
    shown = browser.find_element("tag name", "body").text
    assert shown.startswith("403: the SQL page runs queries from itself only"), shown
    assert "no_such_view" not in shown
    console_errors(browser)  # the 403 is expected


def test_unknown_ids_say_so_in_one_line(browser, viewer):
    visit(browser, viewer, "/trajectories/nope")
    assert texts(browser, "#error-message") == ["no rollout id starts with 'nope' in this store"]
    visit(browser, viewer, "/runs/nope")
    assert texts(browser, "#error-message") == ["no run 'nope' in this store"]
    visit(browser, viewer, "/groups/g")  # g0, g1, g2
    assert "starts several group ids (g0, g1, g2)" in texts(browser, "#error-message")[0]
    console_errors(browser)  # reads (and so clears) the log: the 404s were expected


def test_looking_writes_nothing(browser, viewer):
    before = in_store(viewer.url, event_count)
    for path in (
        "/",
        f"/runs/{ARITH}",
        "/groups/g1",
        "/compare/runs",
        f"/queue?run={ARITH}",  # read-only: the queue shows, without its form
        "/trajectories/r1b",
    ):
        visit(browser, viewer, path)
    assert texts(browser, "#rollout-error") == ["ToolError: the search tool timed out"]
    assert in_store(viewer.url, event_count) == before


# --- live: these record new runs, so they come last ----------------------------------------


def test_run_page_updates_while_the_run_trains(browser, viewer):
    from artstore.events import GroupSealed, RunStarted, TrainStepCompleted, TrainStepStarted
    from artstore.training.lease import trainer_id

    model = f"{PROJECT}/live"

    async def start(store: Any) -> None:
        await store.append(
            "run-live-steps",
            [
                RunStarted(
                    run="live-steps",
                    project=PROJECT,
                    model="live",
                    config={},
                    scenarios=[],
                    scorer="reward",
                    trainer=trainer_id(),
                )
            ],
        )

    async def step(store: Any) -> None:
        # A group (of no rollout: only the step matters here), then its train step.
        await store.append(
            "group-live-g0",
            [
                GroupSealed(
                    group_id="live-g0",
                    run="live-steps",
                    epoch=0,
                    batch=0,
                    scenario_index=0,
                    rollout_ids=[],
                    validation_rollout_ids=[],
                    failed_rollout_ids=[],
                )
            ],
        )
        await store.append(
            "train-live-steps",
            [
                TrainStepStarted(
                    run="live-steps",
                    model=model,
                    step=0,
                    group_ids=["live-g0"],
                    scorer="reward",
                    trainer=trainer_id(),
                ),
                TrainStepCompleted(
                    run="live-steps",
                    model=model,
                    step=1,
                    group_ids=["live-g0"],
                    scorer="reward",
                    metrics={"loss": 0.5},
                    duration_s=2.0,
                ),
            ],
        )

    in_store(viewer.url, start)
    visit(browser, viewer, "/runs/live-steps", ready=chart_ready("reward-curve"))
    browser.execute_script("window.__still_here = true")
    assert texts(browser, "[data-field=num_train_steps]") == ["0"]
    assert browser.execute_script("return !document.getElementById('no-metrics').hidden")

    in_store(viewer.url, step)

    wait_for(
        browser, "return document.querySelector('[data-field=num_train_steps]').textContent === '1'"
    )
    wait_for(browser, "return document.querySelectorAll('#metric-charts canvas').length === 1")
    assert browser.execute_script(
        "const c = document.querySelector('#metric-charts canvas'); "
        "return [c.dataset.metric, Chart.getChart(c).data.datasets[0].data]"
    ) == ["loss", [{"x": 1, "y": 0.5}]]
    assert browser.execute_script("return window.__still_here === true")  # no reload


def test_runs_page_updates_when_a_run_trains(browser, viewer):
    visit(browser, viewer, "/", ready="return document.querySelectorAll('#runs-body tr').length")
    browser.execute_script("window.__still_here = true")
    assert row_of(browser, "live") is None

    train_run_sync(viewer.url, viewer.art_path, run="live", name="live-agent", epochs=1)

    wait_for(browser, "return document.querySelector('#runs-body tr[data-run=\"live\"]') !== null")
    wait_for(
        browser,
        "const r = document.querySelector('#runs-body tr[data-run=\"live\"]');"
        "return r.querySelector('.c-status').textContent === 'finished'",
    )
    live = row_of(browser, "live")
    assert (live["steps"], live["groups"], live["rollouts"]) == ("2", "2 / 2", "6 / 0")
    assert browser.execute_script("return window.__still_here === true")  # no reload
    assert texts(browser, "#live-note")[0].startswith("live: updated")
