"""A LiteLLM proxy callback writing each call's request and response to a JSONL file.

The peer of artstore's recording in `tools/bench_proxy.py`: LiteLLM's proxy with request
and response logging on, offline (no logging service), as LiteLLM's docs show a custom
callback: a `CustomLogger` instance named in the config's `litellm_settings.callbacks`.
It runs inside LiteLLM's own environment (`tools/litellm_peer.py` copies this file beside
the config it writes), never in artstore's. The file is `$ARTSTORE_LITELLM_LOG`.
"""

from __future__ import annotations

import json
import os
from typing import Any

from litellm.integrations.custom_logger import CustomLogger


class JsonlLogger(CustomLogger):
    """One line per call: the messages sent, the response (a stream: assembled), the time."""

    def __init__(self) -> None:
        super().__init__()
        self.path = os.environ["ARTSTORE_LITELLM_LOG"]

    def _write(self, kwargs: dict, response: Any, start, end, ok: bool) -> None:
        dumped = response.model_dump() if hasattr(response, "model_dump") else str(response)
        line = {
            "ok": ok,
            "model": kwargs.get("model"),
            "stream": bool(kwargs.get("stream")),
            "request": {"messages": kwargs.get("messages")},
            "response": dumped,
            "seconds": (end - start).total_seconds(),
        }
        with open(self.path, "a", encoding="utf-8") as file:
            file.write(json.dumps(line, default=str) + "\n")

    async def async_log_success_event(self, kwargs, response_obj, start_time, end_time):
        self._write(kwargs, response_obj, start_time, end_time, True)

    async def async_log_failure_event(self, kwargs, response_obj, start_time, end_time):
        self._write(kwargs, kwargs.get("exception"), start_time, end_time, False)


proxy_handler_instance = JsonlLogger()
