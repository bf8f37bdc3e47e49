"""Capture: every LLM call of an agent becomes an event of the current rollout.

`store.rollout(model, scenario=...)` opens a rollout (`artstore.capture.rollout`). Inside
it, OpenAI-compatible HTTP calls are recorded from their bytes (`artstore.capture.http`;
`unrecorded()` leaves calls out), and `artstore.langgraph` records LangGraph agents.
`artstore.capture.exchanges` says how an HTTP call is stored and rebuilt.
"""

from artstore.capture.http import unrecorded
from artstore.capture.rollout import ArtLogger, Rollout, current_rollout, require_rollout

__all__ = ["ArtLogger", "Rollout", "current_rollout", "require_rollout", "unrecorded"]
