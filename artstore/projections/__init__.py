"""Read models built from events: runs, rollouts, LLM calls, groups, rewards, train steps.

`project` runs inside the transaction that appends the events, so the tables are always
exactly as current as the event log; `rebuild` recomputes them from the log alone.
"""

from artstore.projections.handlers import project, projected_types, rebuild

__all__ = ["project", "projected_types", "rebuild"]
