"""The terminal views: `artstore trajectory`, `artstore group`, id prefixes, tables that fit
80 columns (and plain columns when piped), `stale` runs, the reward sparkline of `show`,
`--version`, shell completion, and `artstore ui` as a process."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import pytest
from recorded_run import RUN, record_run
from trained_run import cli, in_store, one_line_error, train_run_sync

ROOT = Path(__file__).resolve().parents[2]
BOX = set("│┃─━┏┓┗┛╭╮╰╯┡┩")


@pytest.fixture(autouse=True)
def in_tmp(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.chdir(tmp_path)


def environment(**extra: str) -> dict[str, str]:
    """This process's environment for an `artstore` subprocess, running this checkout."""
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path, **extra}


def records(shown: str) -> list[dict[str, str]]:
    """The records a command printed on a narrow terminal: `-[ record N ]-` then
    `name  value` lines (a value may go on over the next lines)."""
    found: list[dict[str, str]] = []
    last, inside = "", False
    for line in shown.splitlines():
        if line.startswith("-[ record "):
            found.append({})
            inside = True
        elif not line.strip():
            inside = False  # a blank line ends the records (a legend may follow)
        elif inside:
            name, _, value = line.rstrip().partition("  ")
            if name.strip():
                last = name.strip()
                found[-1][last] = value.strip()
            else:
                found[-1][last] += value.strip()
    return found


def in_terminal(columns: int, *args: str) -> str:
    """What `artstore ARGS` shows in a terminal (a pseudo-terminal) `columns` wide."""
    import fcntl
    import pty
    import select
    import struct
    import termios

    main_fd, terminal_fd = pty.openpty()
    fcntl.ioctl(terminal_fd, termios.TIOCSWINSZ, struct.pack("HHHH", 40, columns, 0, 0))
    env = environment(COLUMNS=str(columns), TERM="xterm")
    env.pop("NO_COLOR", None)
    command = subprocess.Popen(
        [sys.executable, "-c", "from artstore.cli import main; main()", *args],
        stdin=terminal_fd,
        stdout=terminal_fd,
        stderr=terminal_fd,
        env=env,
        close_fds=True,
    )
    os.close(terminal_fd)  # the child holds it now: its end closes the terminal
    shown = b""
    while True:
        ready, _, _ = select.select([main_fd], [], [], 60)
        if not ready:
            break
        try:
            chunk = os.read(main_fd, 65536)
        except OSError:  # the child has closed the terminal
            break
        if not chunk:
            break
        shown += chunk
    os.close(main_fd)
    assert command.wait(timeout=60) == 0, shown.decode(errors="replace")
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", shown.decode())
    return text.replace("\r\n", "\n")


# --- trajectory and group ----------------------------------------------------------------


def test_trajectory_prints_the_chat(recorded_url):
    result = cli("trajectory", "r0a", "--url", recorded_url, columns=100)

    assert result.exit_code == 0, result.output
    out = result.stdout
    # The conversation of r0a as ART trains on it: system, user, then each call's output
    # and the tool results that followed it.
    for text in (
        "You answer arithmetic questions. Use the tools.",
        "What is 2+2?",
        "→ search",
        '"q": "2+2"',
        "→ calculator",
        "tool · result of c0a0-0",
        "result of search",
        "trainable, 1 token, tool_calls",
    ):
        assert text in out, text
    assert re.search(r"\nrewards +judge=0\.8, correct=1\n", out)  # the latest per scorer
    order = [out.index(role) for role in ("─ system", "─ user", "─ assistant", "─ tool")]
    assert order == sorted(order)


def test_trajectory_as_json(recorded_url):
    result = cli("trajectory", "r0a", "--format", "json", "--url", recorded_url)
    shown = json.loads(result.stdout)

    assert shown["rollout"]["rollout_id"] == "r0a" and shown["rollout"]["scenario"] == {
        "question": "What is 2+2?",
        "answer": "4",
    }
    (history,) = shown["histories"]
    assert [t["role"] for t in history["turns"]] == [
        "system",
        "user",
        "assistant",
        "tool",
        "assistant",
        "tool",
        "tool",
        "assistant",
    ]
    last = history["turns"][-1]
    assert last["content"] == "4" and last["tokens"] == [
        {"token": "4", "logprob": -0.25, "probability": pytest.approx(0.7788007830714049)}
    ]
    assert [(r["scorer"], r["reward"], r["is_latest"]) for r in shown["rewards"]] == [
        ("correct", 1.0, 0),
        ("judge", 0.8, 1),
        ("correct", 1.0, 1),
    ]


def test_group_prints_rollouts_with_rewards_and_advantages(recorded_url):
    table = cli("group", "g0", "--url", recorded_url, columns=160)
    shown = json.loads(cli("group", "g0", "--format", "json", "--url", recorded_url).stdout)

    assert table.exit_code == 0, table.output
    lines = table.stdout.splitlines()
    row = {line.split()[0]: line for line in lines if line[:3] in ("r0a", "r0b", "r0v")}
    assert set(row) == {"r0a", "r0b", "r0v"}
    assert "arith/agent-001" in table.stdout and "correct" in table.stdout
    rollouts = {r["rollout_id"]: r for r in shown["rollouts"]}
    # ART's advantages of [1.0, 0.25] ("correct") and [0.8, 0.4] ("judge"): ±(1 - 1e-6 / std).
    assert rollouts["r0a"]["advantages"] == {
        "correct": pytest.approx(0.375 / (0.375 + 1e-6)),
        "judge": pytest.approx(0.2 / (0.2 + 1e-6)),
    }
    assert rollouts["r0b"]["advantages"]["correct"] == pytest.approx(-0.375 / (0.375 + 1e-6))
    assert rollouts["r0v"]["advantages"] == {}  # validation rollouts train nothing
    assert shown["consumed"][0]["model"] == "arith/agent-001" and shown["consumed"][0]["step"] == 1


def test_ids_may_be_prefixes(recorded_url):
    by_prefix = cli("trajectory", "r1", "--format", "json", "--url", recorded_url)
    assert by_prefix.exit_code == 1  # r1a and r1b
    assert one_line_error(by_prefix) == (
        "error: 'r1' starts several rollout ids (r1a, r1b): give more characters"
    )
    found = cli("trajectory", "r1b", "--format", "json", "--url", recorded_url)
    assert json.loads(found.stdout)["rollout"]["error_type"] == "ToolError"
    group = cli("group", "g", "--url", recorded_url)
    assert one_line_error(group) == (
        "error: 'g' starts several group ids (g0, g1, g2): give more characters"
    )
    missing = cli("group", "x%", "--url", recorded_url)
    assert one_line_error(missing) == "error: no group id starts with 'x%' in this store"


def test_a_real_run_by_the_first_characters_of_its_ids(database_url, tmp_path):
    trained = train_run_sync(database_url, tmp_path / ".art")
    group_id = trained.group_ids[0]

    shown = json.loads(cli("group", group_id[:8], "--format", "json", "--url", database_url).stdout)
    assert shown["group_id"] == group_id
    rollout_id = shown["rollouts"][0]["rollout_id"]
    chat = cli("trajectory", rollout_id[:8], "--logprobs", "--url", database_url)
    assert chat.exit_code == 0, chat.output
    assert rollout_id in chat.stdout and "→ legs_per_animal" in chat.stdout


def test_looking_at_a_store_that_is_not_there_is_one_line(tmp_path):
    result = cli("group", "g0", "--url", f"sqlite:///{tmp_path / 'nowhere.db'}")
    assert one_line_error(result) == f"error: no artstore database at {tmp_path / 'nowhere.db'}"
    assert not (tmp_path / "nowhere.db").exists()


# --- tables that fit, plain when piped ----------------------------------------------------


def test_runs_fits_80_columns_in_a_terminal_and_is_plain_when_piped(database_url, tmp_path):
    train_run_sync(database_url, tmp_path / ".art")
    in_store(database_url, record_run)

    shown = in_terminal(80, "runs", "--url", database_url)

    # Too narrow for the table without cutting a name: one record per run, every value whole.
    lines = shown.splitlines()
    assert all(len(line) <= 80 for line in lines), shown
    runs = records(shown)
    assert [list(r) for r in runs] == [
        ["run", "model", "status", "steps", "groups", "rollouts", "reward", "started (UTC)"]
    ] * len(runs)
    legs = next(r for r in runs if r["run"] == "legs")
    assert [legs[k] for k in ("status", "steps", "groups", "rollouts")] == [
        "finished",
        "4",
        "4/4",
        "12/0",
    ]
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d", legs["started (UTC)"])
    arith = next(r for r in runs if r["run"] == RUN)
    assert arith["model"] == "arith/arith/agent-001"
    assert (arith["status"], arith["groups"], arith["rollouts"]) == ("failed", "3/2", "6/1")

    wide = in_terminal(120, "runs", "--url", database_url)
    header = next(line for line in wide.splitlines() if line.startswith("run "))
    assert " ".join(header.split()) == "run model status steps groups rollouts reward started (UTC)"
    assert any(line.split()[:2] == [RUN, "arith/arith/agent-001"] for line in wide.splitlines())

    piped = cli("runs", "--url", database_url, columns=80)  # not a terminal: piped
    assert piped.exit_code == 0, piped.stderr
    rows = piped.stdout.splitlines()
    assert not BOX & set(piped.stdout)
    assert rows[0].split()[:4] == ["run", "model", "status", "steps"]
    arith = next(line for line in rows if line.startswith(f"{RUN} "))
    assert arith.split()[:3] == [RUN, "arith/arith/agent-001", "failed"]  # nothing cut
    assert all(line == line.rstrip() for line in rows)


def test_show_fits_80_columns_and_draws_the_reward_per_batch(recorded_url):
    shown = in_terminal(80, "show", RUN, "--url", recorded_url)

    assert all(len(line) <= 80 for line in shown.splitlines()), shown
    # Batch 0: r0a 1.0, r0b 0.25 (re-scored), r1a 0.5; batch 1: r2a 1.0, r2b 1.0.
    assert re.search(r"\nreward +▁█  0\.5833 → 1 \(mean per batch, 2 batches\)", shown), shown
    run = json.loads(
        cli("show", RUN, "--section", "run", "--format", "json", "--url", recorded_url).stdout
    )
    assert run["reward_per_batch"] == [
        {"batch": 0, "reward_mean": pytest.approx(1.75 / 3)},
        {"batch": 1, "reward_mean": 1.0},
    ]
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{6}", run["started_at"])


# --- stale runs ---------------------------------------------------------------------------

TRAINER = """
import asyncio, sys
import artstore
from artstore.events import RunStarted
from artstore.training.lease import trainer_lease
from artstore.training.lease import trainer_id

async def main(url):
    async with await artstore.open_store(url) as store:
        await store.append("run-held", [RunStarted(
            run="held", project="tests", model="held", config={}, scenarios=[],
            scorer="reward", trainer=trainer_id())])
        async with trainer_lease(store.database, "held", "tests/held"):
            print("training", flush=True)
            await asyncio.sleep(600)

asyncio.run(main(sys.argv[1]))
"""


def run_status(url: str) -> str:
    listed = json.loads(cli("runs", "--format", "json", "--url", url).stdout)
    return next(run["status"] for run in listed if run["run"] == "held")


def test_a_run_whose_trainer_died_is_stale(database_url):
    trainer = subprocess.Popen(
        [sys.executable, "-c", TRAINER, database_url],
        stdout=subprocess.PIPE,
        text=True,
        env=environment(),
    )
    try:
        assert trainer.stdout.readline() == "training\n"
        assert run_status(database_url) == "running"
    finally:
        trainer.send_signal(signal.SIGKILL)
        trainer.wait()

    # The operating system or the database notices the death at once or nearly.
    deadline = time.monotonic() + 30
    while run_status(database_url) != "stale" and time.monotonic() < deadline:
        time.sleep(0.1)
    assert run_status(database_url) == "stale"
    shown = json.loads(
        cli("show", "held", "--section", "run", "--format", "json", "--url", database_url).stdout
    )
    assert shown["status"] == "stale"
    table = cli("runs", "--url", database_url, columns=120)
    # Piped, the legend goes to stderr: stdout holds only the header and the rows.
    assert "stale: running, but its trainer is gone" in " ".join(table.stderr.split())
    assert len(table.stdout.splitlines()) == 2


# --- the command itself -------------------------------------------------------------------


def test_version_and_completion():
    from artstore import __version__

    assert cli("--version").stdout == f"artstore {__version__}\n"
    # Typer's completion, for the command as installed (its name is part of the script).
    # Typer reads the shell from the process tree unless told to take it as the option's
    # value: under a test runner with no shell above it, it found none ("Shell  not
    # supported").
    script = Path(sys.executable).with_name("artstore")
    completion = subprocess.run(
        [script, "--show-completion", "bash"],
        capture_output=True,
        text=True,
        env=environment(_TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION="1"),
        timeout=60,
    )
    assert completion.returncode == 0, completion.stderr
    assert "_artstore_completion" in completion.stdout and "complete " in completion.stdout


def test_the_command_line_does_not_load_the_web_stack():
    loaded = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, artstore.cli; print(sorted({m.split('.')[0] for m in sys.modules} "
            "& {'starlette', 'uvicorn', 'jinja2', 'art', 'langchain_core'}))",
        ],
        capture_output=True,
        text=True,
        env=environment(),
        timeout=60,
    )
    assert loaded.stdout.strip() == "[]", loaded.stderr


def test_ui_serves_on_loopback_until_interrupted(recorded_url):
    viewer = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "from artstore.cli import main; main()",
            "ui",
            "--port",
            "0",
            "--url",
            recorded_url,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=environment(),
    )
    try:
        line = viewer.stdout.readline()
        found = re.search(r"(http://127\.0\.0\.1:(\d+)/)", line)
        assert found, line + viewer.stderr.read()
        address = found.group(1)
        with urllib.request.urlopen(address + "api/runs", timeout=30) as response:
            assert [run["run"] for run in json.load(response)] == [RUN]
            assert "script-src 'self'" in response.headers["content-security-policy"]
        with urllib.request.urlopen(address + f"runs/{RUN}", timeout=30) as response:
            assert "CUDA out of memory" in response.read().decode()
        # Another host name (DNS rebinding from a web page) is refused.
        request = urllib.request.Request(
            address, headers={"Host": f"evil.example:{found.group(2)}"}
        )
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=30)
        assert refused.value.code == 400
    finally:
        viewer.send_signal(signal.SIGINT)
        _, errors = viewer.communicate(timeout=30)
    assert viewer.returncode == 0, errors


def test_ui_on_a_missing_store_is_one_line(tmp_path):
    result = cli("ui", "--url", f"sqlite:///{tmp_path / 'none.db'}")
    assert result.exit_code == 1
    assert one_line_error(result) == f"error: no artstore database at {tmp_path / 'none.db'}"


def test_show_suggests_close_run_names(recorded_url):
    result = cli("show", f"{RUN}x", "--url", recorded_url)
    assert result.exit_code == 1
    assert " ".join(result.stderr.split()) == (
        f"error: no run '{RUN}x' in this store (see `artstore runs`); did you mean {RUN}?"
    )


def test_sql_prints_records_when_the_rows_do_not_fit_80_columns(recorded_url):
    shown = in_terminal(80, "sql", "SELECT * FROM v_runs", "--url", recorded_url)

    assert all(len(line) <= 80 for line in shown.splitlines()), shown
    [run] = records(shown)
    assert run["run"] == RUN
    # Times and numbers whole, on one line each.
    assert re.fullmatch(r"\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(\.\d+)?(\+00:00)?", run["started_at"])
    assert run["num_rollouts"] == "7"
    assert "1 row" in shown.splitlines()[-1]

    narrow = in_terminal(80, "sql", "SELECT run, status FROM v_runs", "--url", recorded_url)
    assert any(line.split() == [RUN, "│", "failed"] for line in narrow.splitlines()), narrow


def test_a_nested_value_in_a_key_value_cell_reads_as_json() -> None:
    from artstore.cli.output import text

    config = {"epochs": 2, "train_kwargs": {}, "tags": ["a", "b"], "lr": {"warmup": 0.1}}
    assert text(config) == 'epochs=2, train_kwargs={}, tags=["a", "b"], lr={"warmup": 0.1}'
