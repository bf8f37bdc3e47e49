"""`artstore export --otlp-endpoint` into a real Arize Phoenix, read back through its client.

Long budget only (ARTSTORE_LONG=1): Phoenix's dependencies clash with artstore's, so it
lives in a virtual environment of its own (ARTSTORE_PHOENIX_PYTHON, else one built once
under ~/.cache/artstore/phoenix-venv, which takes minutes), and `phoenix serve` takes
seconds to start. CI checks the OTLP/HTTP path against a receiver in test_otlp.py.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from budget import LONG

if not LONG:  # before importing ART (seconds) for nothing
    pytest.skip("a real Phoenix runs under ARTSTORE_LONG=1 only", allow_module_level=True)

from test_export_import import RUN, _record, cli

from artstore.exchange.otlp import trace_id_of

READ_BACK = """
import json, sys
from phoenix.client import Client
frame = Client(base_url=sys.argv[1]).spans.get_spans_dataframe(project_identifier="default")
print(json.dumps([
    {"name": row["name"], "trace_id": row["context.trace_id"],
     "operation": (row.get("attributes.gen_ai.operation.name") or None)}
    for _, row in frame.iterrows()
], default=str))
"""


def phoenix_python() -> str:
    given = os.environ.get("ARTSTORE_PHOENIX_PYTHON")
    if given:
        return given
    venv = Path.home() / ".cache" / "artstore" / "phoenix-venv"
    python = venv / "bin" / "python"
    if not (venv / "bin" / "phoenix").exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", "arize-phoenix"], check=True)
    return str(python)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until_up(url: str, server: subprocess.Popen, deadline_s: float = 180) -> None:
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        assert server.poll() is None, "phoenix serve exited"
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            time.sleep(0.5)
    raise AssertionError(f"Phoenix did not answer at {url}")


def test_phoenix_receives_the_traces_and_its_client_reads_them(database_url, tmp_path: Path):
    python = phoenix_python()
    port, grpc = free_port(), free_port()
    env = {
        **os.environ,
        "PHOENIX_WORKING_DIR": str(tmp_path / "phoenix"),
        "PHOENIX_PORT": str(port),
        "PHOENIX_GRPC_PORT": str(grpc),
        "PHOENIX_HOST": "127.0.0.1",
    }
    phoenix = str(Path(python).parent / "phoenix")
    server = subprocess.Popen(
        [phoenix, "serve"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        base = f"http://127.0.0.1:{port}"
        wait_until_up(f"{base}/healthz", server)
        asyncio.run(_record(database_url))
        result = cli("export", RUN, "--otlp-endpoint", f"{base}/v1/traces", "--url", database_url)
        assert result.exit_code == 0, result.output
        expected = {f"{trace_id_of(rid):032x}" for rid in ("g0-a", "g0-b", "g0-v", "g1-a")}
        deadline = time.monotonic() + 60
        while True:  # Phoenix ingests asynchronously
            read = subprocess.run(
                [python, "-c", READ_BACK, base], capture_output=True, text=True, check=True
            )
            spans = json.loads(read.stdout)
            traces = {span["trace_id"] for span in spans}
            if expected <= traces or time.monotonic() > deadline:
                break
            time.sleep(1)
        assert expected <= traces
        names = {span["name"] for span in spans}
        assert {"invoke_agent agent", "chat agent", "execute_tool search"} <= names
    finally:
        server.terminate()
        server.wait(timeout=30)
