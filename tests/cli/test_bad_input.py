"""One bad input fails only itself, with one clear line, and writes nothing.

The command line: each bad input is refused with exit status non-zero, one line on stderr
and no traceback (none from a thread either), and the folder and the database are what
they were. `export --force` writes regular files only: a symbolic link (dangling or not),
a named pipe, a folder or a device node is refused and left as it is. The library: each
public function refuses a wrong argument with an `InvalidArgumentError` that names it,
before anything is written.

Commands run in this process (typer's runner): a subprocess would import ART each time.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import sqlite3
import stat
import subprocess
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from recorded_run import RUN, record_run
from typer.testing import CliRunner

import artstore
from artstore.errors import InvalidArgumentError
from artstore.exchange import export_atif, export_jsonl, export_otlp

ROOT = os.geteuid() == 0


# --- running a command, and what it left -----------------------------------------------------


def invoke(*args: Any, stdin: bytes | None = None) -> Any:
    """`artstore ARGS...` in this process; an exception in a thread it started fails the test."""
    from artstore.cli import app

    caught: list[Any] = []
    before = set(threading.enumerate())
    hook, threading.excepthook = threading.excepthook, caught.append
    try:
        result = CliRunner().invoke(
            app, [str(a) for a in args], input=stdin, env={"COLUMNS": "200"}
        )
        for thread in set(threading.enumerate()) - before:
            if "_connection_worker_thread" in thread.name:  # aiosqlite's: they end by themselves
                thread.join(timeout=120)
    finally:
        threading.excepthook = hook
    assert not caught, [f"{c.thread.name}: {c.exc_type.__name__}: {c.exc_value}" for c in caught]
    return result


def one_line(result: Any) -> str:
    """The one line a failed command printed on stderr."""
    assert result.exit_code not in (0, None), result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(
        result.exception
    )
    assert "Traceback" not in result.output, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: "), lines[0]
    return lines[0]


def files(folder: Path) -> list[tuple[str, int, int, int]]:
    """Every path under `folder` (links not followed): name, kind and mode, size, mtime.

    A SQLite store's -wal and -shm files are left out: a reader may make them."""
    found = []
    for path in sorted(folder.rglob("*")):
        if path.name.endswith(("-wal", "-shm")):
            continue
        status = path.lstat()
        found.append(
            (str(path.relative_to(folder)), status.st_mode, status.st_size, status.st_mtime_ns)
        )
    return found


def stored_rows(url: str) -> dict[str, int] | None:
    """Rows per table of the database at `url` (None: no SQLite file)."""
    from sqlalchemy import create_engine, inspect, text

    if url.startswith("sqlite"):
        path = Path(url.removeprefix("sqlite:///"))
        if not path.exists():
            return None
        # On read-only media, as artstore reads it (nobody can be writing it there).
        immutable = "" if os.access(path.parent, os.W_OK) else "&immutable=1"
        engine = create_engine(
            "sqlite://",
            creator=lambda: sqlite3.connect(f"file:{path}?mode=ro{immutable}", uri=True),
        )
    else:
        engine = create_engine(url.replace("postgresql://", "postgresql+psycopg://", 1))
    try:
        with engine.connect() as connection:
            return {
                name: connection.execute(text(f'SELECT count(*) FROM "{name}"')).scalar()
                for name in inspect(connection).get_table_names()
            }
    finally:
        engine.dispose()


@contextlib.contextmanager
def unchanged(folder: Path, url: str) -> Iterator[None]:
    """The block changes nothing in `folder` and nothing in the database at `url`."""
    before = files(folder), stored_rows(url)
    yield
    assert (files(folder), stored_rows(url)) == before


@contextlib.contextmanager
def mounted(options: str) -> Iterator[Path]:
    """A tmpfs mounted with `options` (needs root)."""
    if not ROOT:
        pytest.skip("mounting a filesystem needs root")
    where = Path(tempfile.mkdtemp(prefix="artstore-mount-"))
    subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", where], check=True)
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", where], check=False)
        where.rmdir()


# --- inputs ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def good_lines(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    """The lines of a JSONL export of the recorded run (made once, on SQLite)."""
    path = tmp_path_factory.mktemp("export") / "run.jsonl"

    async def export() -> None:
        async with await artstore.open_store(f"sqlite:///{path.with_suffix('.db')}") as store:
            await record_run(store)
            await export_jsonl(store, RUN, path)

    asyncio.run(export())
    return [json.loads(line) for line in path.read_text().splitlines()]


def jsonl(
    path: Path, lines: list[dict[str, Any]], change: Callable[[dict[str, Any]], None]
) -> Path:
    """`lines` with the second one changed, written to `path` (NaN as JSON's `NaN`)."""
    lines = json.loads(json.dumps(lines))
    change(lines[1])
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def _set(*keys: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def change(line: dict[str, Any]) -> None:
        for key in keys[:-1]:
            line = line.setdefault(key, {})
        line[keys[-1]] = value

    return change


# Each: the command's arguments (made from the folder and the good lines), what stdin
# holds, and what the line must say.
BadInput = Callable[[Path, list[dict[str, Any]]], list[Any]]

CLI_CASES: dict[str, tuple[BadInput, bytes | None, str]] = {
    "sql --file, not UTF-8": (
        lambda d, _: ["sql", "--file", _bytes(d / "q.sql", b"SELECT '\xff\xfe' AS x")],
        None,
        "q.sql: not UTF-8 text",
    ),
    "sql --file -, not UTF-8": (lambda d, _: ["sql", "--file", "-"], b"SELECT '\xff'", "not UTF-8"),
    "a JSONL file that is not UTF-8": (
        lambda d, lines: [
            "import",
            _bytes(d / "bytes.jsonl", (json.dumps(lines[0]) + "\n").encode() + b'{"\xff": 1}\n'),
        ],
        None,
        "bytes.jsonl, line 2: not UTF-8 text",
    ),
    "an unknown status": (
        lambda d, lines: ["import", jsonl(d / "s.jsonl", lines, _set("status", value="exploded"))],
        None,
        "line 2: status: Input should be 'finished' or 'failed'",
    ),
    "an unknown role": (
        lambda d, lines: ["import", jsonl(d / "r.jsonl", lines, _set("role", value="boss"))],
        None,
        "line 2: role: Input should be 'policy' or 'validation'",
    ),
    "NaN in a run's config": (
        lambda d, lines: [
            "import",
            jsonl(d / "c.jsonl", lines, _set("run", "config", "lr", value=math.nan)),
            "--run",
            "copy",
        ],
        None,
        "line 2: run.config.lr is NaN",
    ),
    "Infinity in a scenario": (
        lambda d, lines: [
            "import",
            jsonl(d / "sc.jsonl", lines, _set("scenario", value=[math.inf])),
        ],
        None,
        "line 2: scenario.0 is Infinity",
    ),
    "NaN as a reward": (
        lambda d, lines: [
            "import",
            jsonl(
                d / "rw.jsonl",
                lines,
                _set("rewards", value=[{"scorer": "correct", "reward": math.nan}]),
            ),
        ],
        None,
        "line 2: rewards.0.reward is NaN",
    ),
    "a run name that is not UTF-8": (lambda d, _: ["show", "arith\udcff"], None, "not UTF-8 text"),
    "an import's --run that is not UTF-8": (
        lambda d, lines: [
            "import",
            jsonl(d / "ok.jsonl", lines, lambda _: None),
            "--run",
            "\udcff",
        ],
        None,
        "not UTF-8 text",
    ),
    "a query that is not UTF-8": (lambda d, _: ["sql", "SELECT '\udcff'"], None, "not UTF-8 text"),
    "export of a run whose name is not UTF-8": (
        lambda d, _: ["export", "r\udcfe", d / "out.jsonl"],
        None,
        "not UTF-8 text",
    ),
}


def _bytes(path: Path, content: bytes) -> Path:
    path.write_bytes(content)
    return path


@pytest.mark.parametrize("case", list(CLI_CASES))
def test_a_bad_input_is_one_line_and_writes_nothing(
    case: str,
    recorded_url: str,
    good_lines: list[dict[str, Any]],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)
    make_args, stdin, says = CLI_CASES[case]
    args = make_args(tmp_path, good_lines)
    with unchanged(tmp_path, recorded_url):
        result = invoke(*args, "--url", recorded_url, stdin=stdin)
    assert says in one_line(result)


# --- a foreign file: a bad record after good ones imports nothing ------------------------------


@pytest.fixture(scope="module")
def exported_lines(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[str]]:
    """The lines of the recorded run exported as ATIF and as OTLP JSON (made once, on SQLite)."""
    folder = tmp_path_factory.mktemp("foreign")

    async def export() -> None:
        async with await artstore.open_store(f"sqlite:///{folder / 'run.db'}") as store:
            await record_run(store)
            await export_atif(store, RUN, folder / "run.atif.jsonl")
            await export_otlp(store, RUN, folder / "run.otlp.jsonl")

    asyncio.run(export())
    return {fmt: (folder / f"run.{fmt}.jsonl").read_text().splitlines() for fmt in ("atif", "otlp")}


def _valid_json_but_not_the_format(fmt: str) -> str:
    """A JSON line that parses but is no ATIF trajectory (or OTLP export request)."""
    return json.dumps(
        {"schema_version": "ATIF-v1.8", "steps": []} if fmt == "atif" else {"spans": []}
    )


FOREIGN_BAD_LINES: dict[str, tuple[Callable[[str], str], str]] = {
    "not JSON": (lambda _: '{"steps": [', "line 2: not JSON"),
    "JSON of another shape": (_valid_json_but_not_the_format, "line 2: not {format}"),
    "not UTF-8": (lambda _: "\udcff", "line 2: not UTF-8 text"),
}


@pytest.mark.parametrize("bad", list(FOREIGN_BAD_LINES))
@pytest.mark.parametrize("fmt", ["atif", "otlp"])
def test_a_bad_record_after_good_ones_is_one_line_and_imports_nothing(
    fmt: str, bad: str, exported_lines: dict[str, list[str]], recorded_url: str, tmp_path: Path
) -> None:
    make_line, says = FOREIGN_BAD_LINES[bad]
    good = exported_lines[fmt]  # ATIF: a line per rollout; OTLP: one line of all spans
    source = tmp_path / f"mixed.{fmt}.jsonl"
    text = "\n".join([good[0], make_line(fmt), *good[1:]]) + "\n"
    source.write_bytes(text.encode("utf-8", "surrogateescape"))
    with unchanged(tmp_path, recorded_url):
        message = one_line(
            invoke("import", source, "--format", fmt, "--run", "copy", "--url", recorded_url)
        )
    says = says.format(format={"atif": "an ATIF trajectory", "otlp": "OTLP JSON"}[fmt])
    assert f"mixed.{fmt}.jsonl, {says}" in message, message


# --- export --force writes regular files only -----------------------------------------------


def _special_files(folder: Path) -> dict[str, Path]:
    """A path of each kind that is no regular file, for export to refuse."""
    target = folder / "target.jsonl"
    target.write_text("the file a link points to\n")
    (folder / "link.jsonl").symlink_to(target)
    (folder / "dangling.jsonl").symlink_to(folder / "nowhere.jsonl")
    os.mkfifo(folder / "fifo.jsonl")
    (folder / "folder.jsonl").mkdir()
    made = {
        "symbolic link": folder / "link.jsonl",
        "dangling symbolic link": folder / "dangling.jsonl",
        "named pipe": folder / "fifo.jsonl",
        "directory": folder / "folder.jsonl",
    }
    if ROOT:  # the devices /dev/null and /dev/full are, made here: /dev stays as it is
        os.mknod(folder / "null.jsonl", stat.S_IFCHR | 0o666, os.makedev(1, 3))
        os.mknod(folder / "full.jsonl", stat.S_IFCHR | 0o666, os.makedev(1, 7))
        made["null device"] = folder / "null.jsonl"
        made["full device"] = folder / "full.jsonl"
    return made


SAYS = {
    "symbolic link": "is a symbolic link",
    "dangling symbolic link": "is a symbolic link",
    "named pipe": "is a named pipe",
    "directory": "is a directory",
    "null device": "is a character device",
    "full device": "is a character device",
}


@pytest.mark.parametrize("force", [True, False], ids=["force", "no-force"])
def test_export_writes_regular_files_only(
    force: bool, recorded_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    special = _special_files(tmp_path)
    for kind, path in special.items():
        with unchanged(tmp_path, recorded_url):
            result = invoke(
                "export", RUN, path, *(["--force"] if force else []), "--url", recorded_url
            )
            message = one_line(result)
        assert SAYS[kind] in message and "nothing was written" in message, (kind, message)
    assert (tmp_path / "target.jsonl").read_text() == "the file a link points to\n"


def test_export_force_replaces_a_regular_file_and_keeps_its_mode(
    recorded_url: str, tmp_path: Path
) -> None:
    out = tmp_path / "run.jsonl"
    out.write_text("old\n")
    out.chmod(0o600)
    result = invoke("export", RUN, out, "--force", "--url", recorded_url)
    assert result.exit_code == 0, result.output
    assert out.read_text().count("\n") > 1
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    assert sorted(p.name for p in tmp_path.iterdir() if "run" in p.name) == ["run.jsonl"]


def test_a_parquet_export_refuses_a_link_where_a_file_goes(recorded_url: str, tmp_path: Path):
    first = invoke("export", RUN, tmp_path / "out", "--format", "parquet", "--url", recorded_url)
    assert first.exit_code == 0, first.output
    written = sorted((tmp_path / "out").rglob("*.parquet"))
    decoy = tmp_path / "decoy.parquet"
    decoy.write_bytes(b"keep")
    written[0].unlink()
    written[0].symlink_to(decoy)
    with unchanged(tmp_path, recorded_url):
        result = invoke(
            "export", RUN, tmp_path / "out", "--format", "parquet", "--force", "--url", recorded_url
        )
        message = one_line(result)
    assert f"{written[0]} is a symbolic link" in message and "nothing was written" in message
    assert decoy.read_bytes() == b"keep"


def test_an_export_says_in_one_line_where_it_cannot_write(
    recorded_url: str, tmp_path: Path
) -> None:
    os.mkfifo(tmp_path / "pipe")
    (tmp_path / "file").write_text("kept\n")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    cases = [
        (["export", RUN, tmp_path / "pipe", "--format", "parquet", "--force"], "not a directory"),
        (["export", RUN, tmp_path / "file", "--format", "parquet"], "not a directory"),
        (["export", RUN, tmp_path / "dangling", "--format", "parquet"], "not a directory"),
        (["export", RUN, tmp_path / "file" / "run.jsonl"], "is not a directory"),
        (["export", RUN, tmp_path / "missing" / "run.jsonl"], "cannot write"),
    ]
    for args, says in cases:
        with unchanged(tmp_path, recorded_url):
            message = one_line(invoke(*args, "--url", recorded_url))
        assert says in message and "nothing was written" in message, (args, message)


# --- the operating system refuses: one line each, said once -----------------------------------


def test_a_database_under_proc_is_one_line(
    tmp_path: Path, good_lines: list[dict[str, Any]]
) -> None:
    path = "/proc/artstore-test.db"
    try:  # what the system says to creating that file
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL))
        pytest.skip(f"this system lets {path} be created")
    except OSError as exc:
        reason = exc.strerror.lower()
    source = jsonl(tmp_path / "run.jsonl", good_lines, lambda _: None)
    for args in (["db", "upgrade"], ["demo"], ["import", source]):
        message = one_line(invoke(*args, "--url", f"sqlite:///{path}"))
        assert reason in message.lower() and message.count(path) == 1, message
        assert "unable to open database file" not in message, message


def test_a_store_on_a_read_only_filesystem_says_so(
    tmp_path: Path, good_lines: list[dict[str, Any]]
) -> None:
    source = jsonl(tmp_path / "run.jsonl", good_lines, lambda _: None)
    with mounted("size=4m") as media:
        store = f"sqlite:///{media / 'store.db'}"
        assert invoke("import", source, "--url", store).exit_code == 0
        subprocess.run(["mount", "-o", "remount,ro", media], check=True)
        for args in (
            ["db", "upgrade", "--url", f"sqlite:///{media / 'new.db'}"],
            ["import", source, "--run", "copy", "--url", store],
            ["db", "upgrade", "--url", store],
            ["export", RUN, media / "out.jsonl", "--url", store],
        ):
            with unchanged(media, f"sqlite:///{media / 'store.db'}"):
                message = one_line(invoke(*args))
            assert "read-only file system" in message.lower(), (args, message)
            assert "unable to open database file" not in message, message


def test_a_full_disk_is_said_once(tmp_path: Path, good_lines: list[dict[str, Any]]) -> None:
    big = json.loads(json.dumps(good_lines))
    message = {"role": "user", "content": "x" * 2_000_000}  # more than the disk has left
    big[0]["trajectory"]["messages_and_choices"].append(message)
    source = tmp_path / "big.jsonl"
    source.write_text("".join(json.dumps(line) + "\n" for line in big))
    with mounted("size=1m") as disk:
        url = f"sqlite:///{disk / 'store.db'}"
        assert invoke("db", "upgrade", "--url", url).exit_code == 0
        message = one_line(invoke("import", source, "--url", url))
        assert message.count("no space left") == 1, message


# --- the library: every public function names the argument it refuses -----------------------


class Model:
    """What the functions read of an `art.Model`."""

    name = "agent"
    project = "p"
    base_model = "base"
    trainable = False


async def _rollout(store: Any, model: Any, **options: Any) -> None:
    async with store.rollout(model, **options) as rollout:
        rollout.result = "never"


def _group() -> Any:
    import art

    return art.TrajectoryGroup(
        [art.Trajectory(messages_and_choices=[{"role": "user", "content": "q"}], reward=1.0)]
    )


async def _nothing() -> Any:
    return None


LIBRARY_CASES: dict[str, tuple[Callable[[Any], Any], str]] = {
    "open_store(12345)": (lambda s: artstore.open_store(12345), "url"),
    "open_store(b'path')": (lambda s: artstore.open_store(b"x.db"), "url"),
    "open_store with a lone surrogate": (lambda s: artstore.open_store("x\udcff.db"), "url"),
    "start_run: NaN in config": (
        lambda s: artstore.start_run(s, "r", model=Model(), config={"lr": math.nan}),
        "config",
    ),
    "start_run: infinity deep in config": (
        lambda s: artstore.start_run(s, "r", model=Model(), config={"a": [1, {"b": -math.inf}]}),
        "config",
    ),
    "start_run: config not a dict": (
        lambda s: artstore.start_run(s, "r", model=Model(), config=[1]),
        "config",
    ),
    "start_run: a lone surrogate in the run": (
        lambda s: artstore.start_run(s, "r\udc80", model=Model()),
        "run",
    ),
    "start_run: NUL in the run": (lambda s: artstore.start_run(s, "r\x00", model=Model()), "run"),
    "start_run: an empty run": (lambda s: artstore.start_run(s, " ", model=Model()), "run"),
    "start_run: a run that is no str": (lambda s: artstore.start_run(s, 7, model=Model()), "run"),
    "start_run: a scorer with a lone surrogate": (
        lambda s: artstore.start_run(s, "r", model=Model(), scorer="s\udcff"),
        "scorer",
    ),
    "start_run: no store": (lambda s: artstore.start_run(None, "r", model=Model()), "store"),
    "finish_run: a lone surrogate": (lambda s: artstore.finish_run(s, "r\udc80"), "run"),
    "finish_run: an error that is no error": (
        lambda s: artstore.finish_run(s, "r", error=3),
        "error",
    ),
    "rollout(None)": (lambda s: _rollout(s, None), "model"),
    "rollout(object())": (lambda s: _rollout(s, object()), "model"),
    "rollout: a model named by a lone surrogate": (lambda s: _rollout(s, "m\udcff"), "model"),
    "rollout: NaN in the scenario": (
        lambda s: _rollout(s, "m", scenario={"x": math.nan}),
        "scenario",
    ),
    "rollout: a run with a lone surrogate": (lambda s: _rollout(s, "m", run="r\udc80"), "run"),
    "rollout: an empty rollout id": (lambda s: _rollout(s, "m", rollout_id=""), "rollout_id"),
    "rollout: a group id with NUL": (lambda s: _rollout(s, "m", group_id="g\x00"), "group_id"),
    "rollout: an unknown role": (lambda s: _rollout(s, "m", role="boss"), "role"),
    "rollout: a scenario index that is text": (
        lambda s: _rollout(s, "m", scenario_index="3"),
        "scenario_index",
    ),
    "rollout: a policy step that is a float": (
        lambda s: _rollout(s, "m", policy_step=1.5),
        "policy_step",
    ),
    "record_group: a lone surrogate in the run": (
        lambda s: artstore.record_group(s, _group(), run="r\udcff", model=Model()),
        "run",
    ),
    "record_group: a batch that is text": (
        lambda s: artstore.record_group(s, _group(), run="r", model=Model(), batch="1"),
        "batch",
    ),
    "record_group: NaN in the scenario": (
        lambda s: artstore.record_group(s, _group(), run="r", model=Model(), scenario=math.nan),
        "scenario",
    ),
    "durable_rollouts: a run that is no str": (
        lambda s: _nothing() if artstore.durable_rollouts(s, _nothing, run=None) else None,
        "run",
    ),
    "durable_rollouts: a rollout that is no function": (
        lambda s: _nothing() if artstore.durable_rollouts(s, "f", run="r") else None,
        "rollout",
    ),
    "run_groups: a lone surrogate": (lambda s: artstore.run_groups(s, "r\udcff"), "run"),
    "unconsumed_groups: a run that is no str": (
        lambda s: artstore.unconsumed_groups(s, 1, Model()),
        "run",
    ),
    "recording_backend: a lone surrogate": (
        lambda s: _nothing() if artstore.recording_backend(s, object(), run="r\udcff") else None,
        "run",
    ),
    "replay: a lone surrogate": (
        lambda s: artstore.replay(s, "r\udcff", Model(), dry_run=True),
        "run",
    ),
    "rescore: a lone surrogate": (
        lambda s: artstore.rescore(s, "r\udcff", lambda *a: [1.0], "s"),
        "run",
    ),
    "rescore: a scorer with NUL": (
        lambda s: artstore.rescore(s, "r", lambda *a: [1.0], "s\x00"),
        "scorer",
    ),
    "pipeline_trainer: a lone surrogate": (
        lambda s: artstore.pipeline_trainer(
            s, run="r\udcff", model=Model(), backend=object(), rollout_fn=_nothing, scenarios=[]
        ),
        "run",
    ),
    "import_path: a run with a lone surrogate": (
        lambda s: __import__("artstore.exchange").exchange.import_path(s, "x.jsonl", run="\udcff"),
        "run",
    ),
    "trajectories: one id, not a list": (lambda s: s.trajectories("abc"), "rollout_ids"),
    "trajectory: None": (lambda s: s.trajectory(None), "rollout_id"),
    "trajectory: a lone surrogate": (lambda s: s.trajectory("x\udcff"), "rollout_id"),
    "read_stream: a lone surrogate": (lambda s: s.read_stream("run-\udcff"), "stream_id"),
}


@pytest.mark.parametrize("case", list(LIBRARY_CASES))
async def test_a_wrong_argument_is_named_and_nothing_is_written(
    case: str, store: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # a file named by a refused path would be made here
    call, argument = LIBRARY_CASES[case]
    url = str(store.database.url).replace("+aiosqlite", "").replace("+asyncpg", "")
    await store.flush()
    before = await asyncio.to_thread(stored_rows, url)
    with pytest.raises(InvalidArgumentError) as refused:
        await call(store)
    assert refused.value.argument == argument, str(refused.value)
    assert str(refused.value).startswith(argument), str(refused.value)
    assert "\n" not in str(refused.value)
    await store.flush()
    assert await asyncio.to_thread(stored_rows, url) == before
    assert [p.name for p in tmp_path.iterdir() if not p.name.startswith("artstore.db")] == []


async def test_a_path_object_names_a_store(tmp_path: Path) -> None:
    async with await artstore.open_store(tmp_path / "by-path.db") as store:
        await artstore.start_run(store, "r", model=Model(), config={"lr": 1e-5})
    assert (tmp_path / "by-path.db").is_file()


async def test_nan_is_refused_in_every_event_payload(store: Any) -> None:
    """A NaN that pydantic would write as null (a field typed as any JSON) is refused."""
    from artstore.errors import InvalidEventError
    from artstore.events import RunStarted

    event = RunStarted(
        run="r",
        project="p",
        model="m",
        config={"x": math.nan},
        scenarios=[],
        scorer="s",
        trainer="t",
    )
    with pytest.raises(InvalidEventError, match="JSON"):
        await store.append("run-r", [event])
    assert await store.read_all() == []
