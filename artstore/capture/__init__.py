"""Capture: every LLM call of an agent becomes an event of the current rollout.

`store.rollout(model, scenario=...)` opens a rollout (`artstore.capture.rollout`). Inside
it, OpenAI-compatible HTTP calls are recorded from their bytes (`artstore.capture.http`;
`unrecorded()` leaves calls out), and `artstore.langgraph` records LangGraph agents.
`artstore.documents.exchanges` says how an HTTP call is stored and rebuilt,
`artstore.capture.matching` how two records of one call are told to be the same, and
`artstore.capture.group` how the calls of a group rolled out at once (ART's
PipelineTrainer) are given to its trajectories.
"""

from artstore.capture.http import unrecorded
from artstore.capture.rollout import ArtLogger, Rollout, current_rollout, require_rollout

__all__ = ["ArtLogger", "Rollout", "current_rollout", "require_rollout", "unrecorded"]
