"""Capture: every LLM call of an agent becomes an event of the current rollout.

`store.rollout(model, scenario=...)` opens a rollout (`artstore.capture.rollout`);
`artstore.langgraph` records LangGraph agents into it.
"""

from artstore.capture.rollout import ArtLogger, Rollout, current_rollout, require_rollout

__all__ = ["ArtLogger", "Rollout", "current_rollout", "require_rollout"]
