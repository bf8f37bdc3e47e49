"""`tools/bench_proxy.py` runs to its verdicts on both databases, a few calls each way.

Its figures are not checked (a shared machine moves them); what is checked is that each
column is measured and each target gets a PASS or MISS line. LiteLLM's proxy lives in a
virtual environment of its own (`tools/litellm_peer.py`, built once, which takes minutes)
and takes seconds to start: with it, the run is the long budget's only (ARTSTORE_LONG=1).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from budget import LONG

BENCH = Path(__file__).resolve().parents[2] / "tools" / "bench_proxy.py"


def bench(*arguments: str) -> tuple[int, str]:
    env = {**os.environ, "PYTHONPATH": str(BENCH.parents[1])}
    done = subprocess.run(
        [sys.executable, str(BENCH), "--calls", "3", *arguments],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    return done.returncode, done.stdout + done.stderr


def verdicts(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith(("PASS ", "MISS "))]


def test_artstore_serve_is_measured_against_the_direct_call(database_url: str) -> None:
    code, output = bench("--no-litellm", "--url", database_url)
    assert code in (0, 1), output  # 1: a target missed, on a busy machine
    assert "whole: direct p50" in output and "streamed: direct p50" in output, output
    assert "throughput (16 at a time), calls/s: direct" in output, output
    assert len(verdicts(output)) == 4, output  # added p50 and p99, whole and streamed
    assert "LiteLLM" not in output, output


if LONG:

    def test_litellm_is_measured_beside_it_and_logs_every_call(database_url: str) -> None:
        code, output = bench("--url", database_url)
        assert code in (0, 1), output
        assert "not measured" not in output, output
        assert "LiteLLM's proxy adds p50" in output, output
        assert any(line.endswith("LiteLLM's (target >= 2.0x)") for line in verdicts(output))
        assert "PASS LiteLLM's callback logged 19 of 19 calls" in output, output
