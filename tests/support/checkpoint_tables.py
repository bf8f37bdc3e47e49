"""The rows of the LangGraph checkpointer's projection tables, for comparing with a rebuild."""

from __future__ import annotations

from typing import Any

from artstore.schema import tables as t


async def checkpoint_tables(store: Any) -> dict[str, list]:
    """Every row of the checkpoints, channel values and writes tables, in key order."""
    tables = (t.langgraph_checkpoints, t.langgraph_channel_values, t.langgraph_writes)
    async with store.database.read() as connection:
        return {
            table.name: [
                tuple(row)
                for row in await connection.execute(
                    table.select().order_by(*table.primary_key.columns)
                )
            ]
            for table in tables
        }
