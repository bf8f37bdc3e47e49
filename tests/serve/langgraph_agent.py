"""A LangGraph agent that knows nothing of artstore: given a base URL, it answers in argv.

Run as a subprocess by tests/serve/test_serve_clients.py (it must not import artstore):
`python langgraph_agent.py BASE_URL API_KEY QUESTION stream|whole`.
"""

from __future__ import annotations

import json
import sys

from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.prebuilt import create_react_agent


@tool
def get_weather(zone: str, city: str) -> str:
    """The weather in a city."""
    return f"sunny in {city}"


def main() -> None:
    base_url, api_key, question, mode = sys.argv[1:5]
    model = ChatOpenAI(
        model="test-model", base_url=base_url, api_key=api_key, streaming=mode == "stream"
    )
    agent = create_react_agent(model, [get_weather])
    state = agent.invoke({"messages": [("user", question)]})
    print(json.dumps({"messages": len(state["messages"]), "artstore": "artstore" in sys.modules}))


if __name__ == "__main__":
    main()
