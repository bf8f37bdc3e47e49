"""Read models built from events: runs, rollouts, LLM calls, groups, rewards, train steps.

`project` runs inside the transaction that appends the events, so the tables are always
exactly as current as the event log; `rebuild` recomputes them from the log alone.
`SideBySide` says which appends' projections need no order across appends;
`in_statement` which the statement inserting their events may write (PostgreSQL).
"""

from artstore.projections.handlers import project, projected_types, rebuild
from artstore.projections.in_statement import in_statement
from artstore.projections.side_by_side import SideBySide

__all__ = ["SideBySide", "in_statement", "project", "projected_types", "rebuild"]
