"""Comparing two runs of one conversation against the local inference server, which makes
its ids (tool calls, completions) and times anew for each call."""

from __future__ import annotations

import json
import re
from typing import Any

_IDS = re.compile(r"(call_[0-9a-f]{24}|chatcmpl-[0-9a-f]{32})")


def without_ids(value: Any) -> Any:
    """`value` as JSON with the ids and times the upstream makes anew for each call
    replaced: two runs of one conversation differ in those alone."""
    text = _IDS.sub("ID", json.dumps(value, sort_keys=True, default=str))
    return re.sub(r'"created": \d+', '"created": 0', text)
