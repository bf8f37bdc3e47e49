"""Capture: every LLM call of an agent becomes an event of the current rollout."""

from artstore.capture.rollout import Rollout, current_rollout, rollout

__all__ = ["Rollout", "current_rollout", "rollout"]
