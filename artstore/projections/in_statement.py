"""The projections that the statement inserting their events may write (PostgreSQL).

An append whose projected events are all of the kinds below is one statement that commits
by itself (`InStatement`, artstore.eventstore.records): LangGraph checkpoints and writes
(`checkpoints_in_statement`) and a rollout's LLM calls (`calls_in_statement`: `artstore
serve` answers a call once its record is committed, and a transaction's round trips were
most of that wait). Any other projected event, or one of these that needs the projector,
sends the whole batch to the projector, in a transaction.
"""

from __future__ import annotations

from typing import Any

from artstore.events import LLMCall
from artstore.eventstore.records import StatementPart
from artstore.projections.bulk import calls_in_statement
from artstore.projections.checkpoints import checkpoints_in_statement


def in_statement(rows: list[dict[str, Any]]) -> list[StatementPart] | None:
    """The projection of a batch's projected event rows as parts of their INSERT, or None."""
    calls = [row for row in rows if row["type"] == LLMCall.type]
    others = [row for row in rows if row["type"] != LLMCall.type]
    parts: list[StatementPart] = []
    for rows_of_a_kind, projection in (
        (others, checkpoints_in_statement),
        (calls, calls_in_statement),
    ):
        if rows_of_a_kind:
            found = projection(rows_of_a_kind)
            if found is None:
                return None
            parts.extend(found)
    return parts
