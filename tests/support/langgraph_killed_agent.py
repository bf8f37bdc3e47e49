"""A LangGraph agent on artstore's checkpointer, run by tests/langgraph/test_checkpointer_graph.py
in a process of its own and killed with SIGKILL in the middle of a super-step.

    python langgraph_killed_agent.py URL THREAD_ID RUNS_FILE

plan -> (search | lookup, one super-step) -> answer. Each node appends its name to
RUNS_FILE when it starts; `lookup` then waits forever (the test kills the process there,
once `search`'s write is stored), so that the process dies with a super-step half done.
"""

from __future__ import annotations

import asyncio
import operator
import sys
from pathlib import Path
from typing import Annotated, TypedDict

from langgraph.graph import END, START, StateGraph

import artstore
from artstore.langgraph import checkpointer


class State(TypedDict):
    steps: Annotated[list[str], operator.add]


def build(saver, runs: Path, lookup_waits: bool):
    def node(name: str):
        async def run(state: State) -> dict:
            with runs.open("a") as file:
                file.write(name + "\n")
            if name == "lookup" and lookup_waits:
                await asyncio.Event().wait()  # killed here
            return {"steps": [name]}

        return run

    builder = StateGraph(State)
    for name in ("plan", "search", "lookup", "answer"):
        builder.add_node(name, node(name))
    builder.add_edge(START, "plan")
    builder.add_edge("plan", "search")
    builder.add_edge("plan", "lookup")
    builder.add_edge(["search", "lookup"], "answer")
    builder.add_edge("answer", END)
    return builder.compile(checkpointer=saver)


async def main(url: str, thread_id: str, runs: str) -> None:
    async with await artstore.open_store(url) as store:
        graph = build(checkpointer(store), Path(runs), lookup_waits=True)
        await graph.ainvoke({"steps": []}, {"configurable": {"thread_id": thread_id}})


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:4]))
