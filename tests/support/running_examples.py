"""Running the scripts of examples/ as a user would: `python examples/NAME.py --url URL`.

Used by tests/docs/test_examples.py and by the PipelineTrainer example's test
(tests/training/test_pipeline_crash_resume.py).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def start(example: str, url: str, workdir: Path, *args: str) -> subprocess.Popen:
    environment = {
        **os.environ,
        "PYTHONPATH": str(EXAMPLES.parent),
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    }
    environment.pop("WANDB_API_KEY", None)
    return subprocess.Popen(
        [sys.executable, str(EXAMPLES / example), "--url", url, "--art-path", "art", *args],
        cwd=workdir,
        env=environment,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def finish(process: subprocess.Popen) -> str:
    output, _ = process.communicate(timeout=300)
    assert process.returncode == 0, output
    return output
