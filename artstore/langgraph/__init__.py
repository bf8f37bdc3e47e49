"""LangGraph integration: ART's `art.langgraph` API, recording every LLM call to the store.

    from artstore.langgraph import init_chat_model, wrap_rollout

    async def rollout(model, scenario):
        agent = create_react_agent(init_chat_model(), tools)
        await agent.ainvoke({"messages": [("user", scenario["question"])]})
        return art.Trajectory(messages_and_choices=[], reward=...)

    trajectory = await wrap_rollout(store, model, rollout)(model, scenario)

`checkpointer(store)` is LangGraph's checkpoint saver on the event log
(`graph = builder.compile(checkpointer=checkpointer(store))`).

Agents written against `art.langgraph.init_chat_model` are recorded too, unchanged,
inside any `store.rollout(...)` block.
"""

from artstore.capture.rollout import Rollout, current_rollout
from artstore.langgraph.chat_model import RecordedChatModel, init_chat_model
from artstore.langgraph.checkpointer import EventLogSaver, checkpointer
from artstore.langgraph.rollouts import wrap_rollout

__all__ = [
    "EventLogSaver",
    "RecordedChatModel",
    "Rollout",
    "checkpointer",
    "current_rollout",
    "init_chat_model",
    "wrap_rollout",
]
