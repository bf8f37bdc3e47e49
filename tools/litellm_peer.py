"""LiteLLM's proxy in front of the local inference server, logging each call: a benchmark peer.

What a user puts in front of vLLM today, with request and response logging on offline:
`litellm --config FILE` with the upstream named as an OpenAI-compatible model and the
callback of `tools/litellm_jsonl_logger.py` writing each call to a JSONL file. No database,
a master key of its own, no network (`LITELLM_LOCAL_MODEL_COST_MAP=True`, telemetry off).

LiteLLM runs from a virtual environment of its own, because `litellm[proxy]`'s
dependencies clash with artstore's: `$ARTSTORE_LITELLM_PYTHON` names its python, else one
is built once under ~/.cache/artstore/litellm-venv (pip, minutes).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import IO

CALLBACK = Path(__file__).with_name("litellm_jsonl_logger.py")
VENV = Path.home() / ".cache" / "artstore" / "litellm-venv"


def litellm_python() -> str:
    """The python of an environment with `litellm[proxy]`; built once when missing."""
    given = os.environ.get("ARTSTORE_LITELLM_PYTHON")
    if given:
        return given
    python = VENV / "bin" / "python"
    if not (VENV / "bin" / "litellm").exists():
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
        # backoff: imported by the proxy, not always installed by the extra.
        install = [str(python), "-m", "pip", "install", "-q", "litellm[proxy]", "backoff"]
        subprocess.run(install, check=True)
    return str(python)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LiteLLMProxy:
    """`litellm --config` in its own process, in `folder`; `base_url` ends in /v1."""

    def __init__(self, python: str, upstream: str, api_key: str, folder: Path) -> None:
        self.python, self.upstream, self.api_key = python, upstream, api_key
        self.folder = folder
        self.log = folder / "litellm-calls.jsonl"
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        self.server: subprocess.Popen | None = None
        # As a user runs it: calls need a key (LiteLLM refuses to start without one).
        self.master_key = f"sk-{secrets.token_hex(16)}"
        self._stderr: IO[str] | None = None

    def _config(self) -> Path:
        shutil.copy(CALLBACK, self.folder / "litellm_jsonl_logger.py")
        config = {
            "model_list": [
                {
                    "model_name": "test-model",
                    "litellm_params": {
                        "model": "openai/test-model",
                        "api_base": self.upstream,
                        "api_key": self.api_key,
                    },
                }
            ],
            "litellm_settings": {
                "callbacks": "litellm_jsonl_logger.proxy_handler_instance",
                "telemetry": False,
            },
            "general_settings": {"master_key": self.master_key},
        }
        path = self.folder / "litellm.yaml"
        path.write_text(json.dumps(config, indent=2))  # JSON is YAML
        return path

    def __enter__(self) -> LiteLLMProxy:
        litellm = str(Path(self.python).parent / "litellm")
        env = {
            **os.environ,
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",
            "ARTSTORE_LITELLM_LOG": str(self.log),
            "LITELLM_LOG": "ERROR",
        }
        env.pop("DATABASE_URL", None)
        self._stderr = open(self.folder / "litellm.err", "w")  # the child's, closed on exit
        command = [litellm, "--config", str(self._config()), "--host", "127.0.0.1"]
        self.server = subprocess.Popen(
            [*command, "--port", str(self.port), "--telemetry", "False"],
            env=env,
            cwd=self.folder,
            stdout=subprocess.DEVNULL,
            stderr=self._stderr,
        )
        try:
            self._wait_until_up()
        except BaseException:
            self.__exit__()
            raise
        return self

    def _wait_until_up(self, deadline_s: float = 180) -> None:
        url = f"http://127.0.0.1:{self.port}/health/liveliness"
        deadline = time.monotonic() + deadline_s
        while time.monotonic() < deadline:
            if self.server is not None and self.server.poll() is not None:
                raise RuntimeError(f"litellm exited: {self.errors()}")
            try:
                with urllib.request.urlopen(url, timeout=2):
                    return
            except OSError:
                time.sleep(0.5)
        raise RuntimeError(f"litellm did not answer at {url}")

    def errors(self) -> str:
        lines = (self.folder / "litellm.err").read_text(errors="replace").strip().splitlines()
        return lines[-1] if lines else "(nothing on stderr)"

    def logged(self) -> int:
        """Calls the callback wrote so far."""
        if not self.log.exists():
            return 0
        return sum(1 for _ in self.log.open(encoding="utf-8"))

    def __exit__(self, *exc: object) -> None:
        if self.server is not None:
            self.server.terminate()
            try:
                self.server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.server.kill()
                self.server.wait()
        if self._stderr is not None:
            self._stderr.close()
