"""The demo's task: count legs, with a lookup tool and a multiplication tool.

"How many legs do 7 spiders have?" needs the legs of one spider (`legs_per_animal`) and a
product (`multiply`). The agent is a LangGraph ReAct agent on ART's `init_chat_model`; its
"model" is `demo_policy`, served by the local inference server, which behaves like a
small model that sometimes skips a step, so that a group's rewards have some spread.
"""

from __future__ import annotations

import re
import warnings
from typing import Any

from artstore.art_api import art_module
from artstore.testing.inference_server import ScriptedReply

LEGS = {
    "spider": 8,
    "dog": 4,
    "bird": 2,
    "ant": 6,
    "starfish": 5,
    "snake": 0,
    "crab": 10,
    "cat": 4,
}

SYSTEM_PROMPT = (
    "You answer questions about animals' legs. Look up how many legs one animal has with "
    "legs_per_animal, compute with multiply, and end with 'Final answer: <number>'."
)

_QUESTION = re.compile(r"How many legs do (\d+) (\w+) have\?")


def make_scenarios(count: int = 4) -> list[dict[str, Any]]:
    """`count` questions (a scenario is plain JSON: stored with the run, re-scorable)."""
    animals = list(LEGS)
    scenarios = []
    for index in range(count):
        animal = animals[index % len(animals)]
        number = 3 + (index * 5) % 9
        plural = "starfish" if animal == "starfish" else f"{animal}s"
        scenarios.append(
            {
                "question": f"How many legs do {number} {plural} have?",
                "animal": animal,
                "count": number,
                "answer": number * LEGS[animal],
            }
        )
    return scenarios


# --- the tools and the agent ------------------------------------------------------------


def _tools() -> list[Any]:
    from langchain_core.tools import tool

    @tool
    def legs_per_animal(animal: str) -> str:
        """How many legs one animal of a kind has (e.g. animal="spider")."""
        name = animal.strip().lower().removesuffix("s") if animal.lower() != "starfish" else animal
        if name not in LEGS:
            return f"unknown animal {animal!r}; known: {', '.join(LEGS)}"
        return str(LEGS[name])

    @tool
    def multiply(a: int, b: int) -> str:
        """The product of two whole numbers."""
        return str(a * b)

    return [legs_per_animal, multiply]


async def agent(scenario: dict[str, Any], thread_id: str) -> dict[str, Any]:
    """The LangGraph agent: answers the scenario's question; returns answer and tools used."""
    init_chat_model = art_module("langgraph").init_chat_model

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # create_react_agent's move to langchain.agents
        from langgraph.prebuilt import create_react_agent

        tools = _tools()
        graph = create_react_agent(init_chat_model().bind_tools(tools), tools)
    state = await graph.ainvoke(
        {"messages": [("system", SYSTEM_PROMPT), ("user", scenario["question"])]},
        config={"recursion_limit": 10, "configurable": {"thread_id": thread_id}},
    )
    messages = state["messages"]
    used = [call["name"] for m in messages for call in getattr(m, "tool_calls", None) or []]
    return {"answer": str(messages[-1].content), "tools_used": used}


# --- rewards ------------------------------------------------------------------------------


def _number(answer: str) -> int | None:
    found = re.findall(r"-?\d+", answer.rpartition("Final answer:")[2] or answer)
    return int(found[-1]) if found else None


def reward(scenario: dict[str, Any], results: list[Any], trajectories: list[Any]) -> list[float]:
    """1 for the right number, 0.25 for a wrong one found with the lookup tool, else 0."""
    rewards = []
    for result in results:
        answer = _number((result or {}).get("answer", ""))
        if answer == scenario["answer"]:
            rewards.append(1.0)
        elif "legs_per_animal" in (result or {}).get("tools_used", []):
            rewards.append(0.25)
        else:
            rewards.append(0.0)
    return rewards


def strict_reward(
    scenario: dict[str, Any], results: list[Any], trajectories: list[Any]
) -> list[float]:
    """A stricter scorer for re-scoring: right number and both tools used, else 0."""
    return [
        1.0
        if _number((r or {}).get("answer", "")) == scenario["answer"]
        and {"legs_per_animal", "multiply"} <= set((r or {}).get("tools_used", []))
        else 0.0
        for r in results
    ]


# --- the "model" ------------------------------------------------------------------------


def _text(content: Any) -> str:
    if isinstance(content, list):
        return " ".join(p.get("text", "") if isinstance(p, dict) else str(p) for p in content)
    return content or ""


def demo_policy(request: dict[str, Any], sample_index: int) -> ScriptedReply:
    """What the demo's model answers: the right tool calls, with some typical slips.

    Identical conversations get sample indices 0, 1, 2...: on the first turn every fourth
    sample guesses without tools; after the lookup every second sample forgets to multiply.
    """
    messages = [m for m in request.get("messages") or [] if isinstance(m, dict)]
    last_user = max((i for i, m in enumerate(messages) if m.get("role") == "user"), default=-1)
    question = _text(messages[last_user].get("content")) if last_user >= 0 else ""
    turn = messages[last_user + 1 :]
    calls = {
        call.get("id"): (call.get("function") or {}).get("name")
        for m in turn
        if m.get("role") == "assistant"
        for call in m.get("tool_calls") or []
    }
    results = {
        calls.get(m.get("tool_call_id")): _text(m.get("content"))
        for m in turn
        if m.get("role") == "tool"
    }
    found = _QUESTION.search(question)
    if not found:
        return ScriptedReply("Final answer: I can only count legs.")
    count, plural = int(found.group(1)), found.group(2)
    animal = plural if plural == "starfish" else plural.removesuffix("s")
    if "legs_per_animal" not in results:
        if sample_index % 4 == 3:
            return ScriptedReply(f"Animals mostly have four legs. Final answer: {count * 4}")
        return ScriptedReply(tool_calls=[("legs_per_animal", {"animal": animal})])
    legs = results["legs_per_animal"]
    if "multiply" not in results:
        if sample_index % 2 == 1 or not legs.isdigit():
            return ScriptedReply(f"One {animal} has {legs} legs. Final answer: {legs}")
        return ScriptedReply(tool_calls=[("multiply", {"a": count, "b": int(legs)})])
    return ScriptedReply(
        f"{count} {plural} have {results['multiply']} legs. Final answer: {results['multiply']}"
    )


__all__ = [
    "LEGS",
    "SYSTEM_PROMPT",
    "agent",
    "demo_policy",
    "make_scenarios",
    "reward",
    "strict_reward",
]
