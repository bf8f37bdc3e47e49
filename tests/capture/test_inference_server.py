"""The local inference server speaks OpenAI's schema well enough for langchain-openai and ART."""

from __future__ import annotations

import warnings

import httpx
import openai
import pytest
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.tools import tool
from pydantic import BaseModel, Field

from artstore.testing.inference_server import LocalInferenceServer, ScriptedReply


@tool
def get_weather(city: str) -> str:
    """Get the weather for a city."""
    return f"sunny in {city}"


@tool
def get_population(city: str, year: int) -> str:
    """Get the population of a city in a year."""
    return f"{city} had 1000 people in {year}"


class Forecast(BaseModel):
    city: str
    temperature: float = Field(ge=-50, le=60)
    rainy: bool
    tags: list[str]


def _react_agent(model, tools):
    with warnings.catch_warnings():  # create_react_agent is deprecated in LangGraph 1.x
        warnings.simplefilter("ignore")
        from langgraph.prebuilt import create_react_agent

        return create_react_agent(model, tools)


async def test_react_agent_gets_tool_calls_and_logprobs() -> None:
    async with LocalInferenceServer() as server:
        agent = _react_agent(server.chat_model(max_retries=0), [get_weather, get_population])
        result = await agent.ainvoke({"messages": [("user", "Weather in Paris?")]})

    ai = [m for m in result["messages"] if isinstance(m, AIMessage)]
    assert [c["name"] for m in ai for c in m.tool_calls] == ["get_weather", "get_population"]
    assert ai[-1].content.startswith("Final answer: sunny in Weather in Paris")
    for message in ai:
        entries = message.response_metadata["logprobs"]["content"]
        assert entries and all(e["logprob"] < 0 and e["bytes"] for e in entries)
    assert len(server.requests) == 3
    assert "logprobs" not in server.requests[0]  # returned although never asked for


async def test_streaming_carries_tool_calls_and_logprobs() -> None:
    with LocalInferenceServer() as server:
        model = server.chat_model(max_retries=0).bind_tools([get_weather])
        chunks = [chunk async for chunk in model.astream("Weather in Rome?")]
    message = chunks[0]
    for chunk in chunks[1:]:
        message += chunk
    assert [c["name"] for c in message.tool_calls] == ["get_weather"]
    assert message.response_metadata["finish_reason"] == "tool_calls"
    assert message.response_metadata["logprobs"]["content"]


def test_wrong_key_is_rejected_with_401_and_not_echoed() -> None:
    with LocalInferenceServer() as server:
        with pytest.raises(openai.AuthenticationError):
            server.chat_model(api_key="sk-wrong-key", max_retries=0).invoke("hi")
        response = httpx.get(
            f"{server.base_url}/models", headers={"Authorization": "Bearer sk-wrong-key"}
        )
        models = httpx.get(
            f"{server.base_url}/models", headers={"Authorization": f"Bearer {server.api_key}"}
        )
    assert response.status_code == 401
    assert "sk-wrong-key" not in response.text
    assert [m["id"] for m in models.json()["data"]] == ["test-model"]
    assert server.requests == []
    assert server.api_key.startswith("sk-local-") and server.api_key not in repr(server)


@pytest.mark.parametrize("method", ["json_schema", "function_calling"])
async def test_structured_output_satisfies_the_schema(method: str) -> None:
    async with LocalInferenceServer() as server:
        model = server.chat_model(max_retries=0)
        structured = model.with_structured_output(Forecast, method=method, include_raw=True)
        result = await structured.ainvoke("Forecast for Berlin")
    assert result["parsing_error"] is None
    assert isinstance(result["parsed"], Forecast)
    assert result["parsed"].city == "Forecast for Berlin"
    assert result["raw"].response_metadata["logprobs"]["content"]


def test_fail_when_answers_500() -> None:
    def fail_second(request: dict) -> bool:
        return request["messages"][-1]["content"] == "fail me"

    with LocalInferenceServer(fail_when=fail_second) as server:
        model = server.chat_model(max_retries=0)
        assert model.invoke("hello").content == "Final answer: hello"
        with pytest.raises(openai.InternalServerError):
            model.invoke("fail me")
    assert len(server.requests) == 2


def test_repeated_prompts_get_different_answers_and_custom_policy() -> None:
    with LocalInferenceServer() as server:
        model = server.chat_model(max_retries=0)
        answers = [model.invoke("Capital of France?").content for _ in range(3)]
    assert len(set(answers)) == 3

    seen: list[int] = []

    def policy(request: dict, sample_index: int) -> ScriptedReply:
        seen.append(sample_index)
        return ScriptedReply(content=f"reply {sample_index}")

    with LocalInferenceServer(policy=policy) as server:
        model = server.chat_model(max_retries=0)
        assert [model.invoke("same").content for _ in range(2)] == ["reply 0", "reply 1"]
        assert model.invoke("other").content == "reply 0"
    assert seen == [0, 1, 0]


async def test_art_langgraph_wrapper_builds_trainable_trajectory(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    monkeypatch.chdir(tmp_path)  # ART writes .art/langgraph/<thread> under the cwd
    import art
    from art.langgraph.llm_wrapper import add_thread, create_messages_from_logs, init_chat_model
    from openai.types.chat.chat_completion import Choice

    async with LocalInferenceServer() as server:
        thread = add_thread(  # a log path (ART 0.5.18) or a logger (later)
            "thread-1", server.base_url, server.api_key, "test-model"
        )
        tools = [get_weather, get_population]
        agent = _react_agent(init_chat_model().bind_tools(tools), tools)
        await agent.ainvoke({"messages": [HumanMessage("Weather in Oslo?")]})

    trajectory = create_messages_from_logs(thread, art.Trajectory(messages_and_choices=[]))
    choices = [c for c in trajectory.messages_and_choices if isinstance(c, Choice)]
    assert [c.finish_reason for c in choices] == ["tool_calls", "tool_calls", "stop"]
    assert all(c.logprobs and c.logprobs.content for c in choices)
    assert [t["function"]["name"] for t in trajectory.tools] == ["get_weather", "get_population"]


def test_token_ids_when_asked_as_vllm_returns_them() -> None:
    """ART >= 0.5.20's client asks for token ids; exchange training needs them exact."""
    vllm = {"return_token_ids": True, "return_tokens_as_token_ids": True}
    messages = [{"role": "user", "content": "Weather in Rome?"}]
    with LocalInferenceServer(lambda request, index: "Sunny, 24 degrees.") as server:
        client = openai.OpenAI(base_url=server.base_url, api_key=server.api_key)
        plain = client.chat.completions.create(model="m", messages=messages)
        asked = client.chat.completions.create(model="m", messages=messages, extra_body=vllm)
        again = client.chat.completions.create(model="m", messages=messages, extra_body=vllm)
        (choice,) = asked.choices
        follow_up = [
            *messages,
            {"role": "assistant", "content": choice.message.content},
            {"role": "user", "content": "And tomorrow?"},
        ]
        following = client.chat.completions.create(model="m", messages=follow_up, extra_body=vllm)
        stream = client.chat.completions.create(
            model="m", messages=messages, extra_body=vllm, stream=True
        )
        chunks = list(stream)

    assert "prompt_token_ids" not in (plain.model_extra or {})
    assert "token_ids" not in (plain.choices[0].model_extra or {})
    prompt, ids = asked.model_extra["prompt_token_ids"], choice.model_extra["token_ids"]
    assert len(prompt) == asked.usage.prompt_tokens
    assert len(ids) == len(choice.logprobs.content) == asked.usage.completion_tokens
    assert [e.token for e in choice.logprobs.content] == [f"token_id:{i}" for i in ids]
    assert b"".join(bytes(e.bytes) for e in choice.logprobs.content).decode() == (
        "Sunny, 24 degrees."
    )
    assert again.model_extra["prompt_token_ids"] == prompt  # deterministic
    assert again.choices[0].model_extra["token_ids"] == ids
    # A conversation's next prompt starts with this prompt and this completion.
    assert following.model_extra["prompt_token_ids"][: len(prompt) + len(ids)] == prompt + ids
    # Streamed: the first chunk carries the prompt's ids, each chunk its tokens' ids.
    assert chunks[0].model_extra["prompt_token_ids"] == prompt
    streamed = [i for chunk in chunks for c in chunk.choices for i in c.model_extra["token_ids"]]
    assert streamed == ids
