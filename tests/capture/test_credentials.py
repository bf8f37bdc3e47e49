"""No credential artstore sees is stored or printed, whichever way the agent sends it.

An ART loop (durable rollouts, each group recorded as it ends, as in the README) whose
agent reaches the local inference server through a client of its own. The credential
under test travels one way (`WAYS`: the client's Authorization header, an `api-key` or
`x-api-key` header, a `?key=` query parameter, a password in the client's URL, the
environment the client reads, the model's own inference key through ART's client and
through LangGraph's chat model, a LangChain `ChatOpenAI` of the agent's own, the database
URL's password), and the agent then echoes it everywhere it can: in a tool result, which
the model repeats in its answer, one token at a time; in the trajectory's log and
metadata; and in the exception of a rollout that fails. The credential must then be
nowhere: no column of any table, no blob and no joined logprob tokens, no export, no
viewer page, no command's output, no log line (`support_secrets.places_holding`).
"""

from __future__ import annotations

import json
import logging
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import art
import openai
import pytest
from langchain_core.messages import convert_to_messages, convert_to_openai_messages
from langchain_openai import ChatOpenAI
from sqlalchemy.engine import make_url
from support_secrets import places_holding

import artstore
import artstore.langgraph
from artstore.art_versions import trainable_model
from artstore.backends.check_only import CheckOnlyBackend
from artstore.redaction import REDACTED
from artstore.testing.inference_server import LocalInferenceServer, tokenize

RUN = "leaky-loop"
LOOKUP_TOOL = {
    "type": "function",
    "function": {
        "name": "lookup",
        "description": "Look a city up.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}

# Asks the model for a turn of `trajectory` (appending its answer); the tool calls' ids.
Ask = Callable[[art.Trajectory], Awaitable[list[str]]]


def openai_agent(client: openai.AsyncOpenAI, model_name: str = "test-model") -> Ask:
    async def ask(trajectory: art.Trajectory) -> list[str]:
        completion = await client.chat.completions.create(
            model=model_name, messages=trajectory.messages(), tools=[LOOKUP_TOOL], logprobs=True
        )
        choice = completion.choices[0]
        trajectory.messages_and_choices.append(choice)
        return [call.id for call in choice.message.tool_calls or []]

    return ask


def langchain_agent(make_chat: Callable[[], Any]) -> Ask:
    """`make_chat()` is called in the rollout (artstore's `init_chat_model` needs one)."""

    async def ask(trajectory: art.Trajectory) -> list[str]:
        reply = (
            await make_chat()
            .bind_tools([LOOKUP_TOOL])
            .ainvoke(convert_to_messages(trajectory.messages()))
        )
        trajectory.messages_and_choices.append(convert_to_openai_messages(reply))
        return [call["id"] for call in reply.tool_calls]

    return ask


@dataclass(frozen=True)
class Way:
    """How the credential reaches the inference server (or the database)."""

    name: str
    # Whether the credential is the server's key (else the server gets a key of its own).
    is_server_key: bool
    # (server, credential, model, monkeypatch) -> the agent's way of asking.
    agent: Callable[[LocalInferenceServer, str, Any, pytest.MonkeyPatch], Ask]
    # Whether the model is registered with the credential as its inference key.
    is_model_key: bool = False


def with_header(name: str) -> Callable[..., Ask]:
    def agent(server, credential, model, monkeypatch) -> Ask:
        headers = {name: credential}
        return openai_agent(
            openai.AsyncOpenAI(
                base_url=server.base_url, api_key=server.api_key, default_headers=headers
            )
        )

    return agent


def url_password(server, credential, model, monkeypatch) -> Ask:
    """A client whose URL holds a password (a proxy's, say): httpx sends it as basic auth,
    which the server refuses; the agent then asks through its plain client."""
    with_password = openai.AsyncOpenAI(
        base_url=server.base_url.replace("//", f"//agent:{credential}@", 1),
        api_key=server.api_key,
        max_retries=0,
    )
    plain = openai_agent(openai.AsyncOpenAI(base_url=server.base_url, api_key=server.api_key))

    async def ask(trajectory: art.Trajectory) -> list[str]:
        with pytest.raises(openai.AuthenticationError):
            await openai_agent(with_password)(trajectory)
        return await plain(trajectory)

    return ask


def from_environment(server, credential, model, monkeypatch) -> Ask:
    # Set after the store was opened, as a loop that loads its .env late would.
    monkeypatch.setenv("OPENAI_API_KEY", credential)
    return openai_agent(openai.AsyncOpenAI(base_url=server.base_url))


WAYS = [
    Way(
        "authorization header",
        True,
        lambda server, credential, model, mp: openai_agent(
            openai.AsyncOpenAI(base_url=server.base_url, api_key=credential)
        ),
    ),
    Way("api-key header", False, with_header("api-key")),
    Way("x-api-key header", False, with_header("x-api-key")),
    Way(
        "key query parameter",
        False,
        lambda server, credential, model, mp: openai_agent(
            openai.AsyncOpenAI(
                base_url=server.base_url, api_key=server.api_key, default_query={"key": credential}
            )
        ),
    ),
    Way("password in the client's URL", False, url_password),
    Way("environment", True, from_environment),
    Way(
        "model's key, ART's client",
        True,
        lambda server, credential, model, mp: openai_agent(
            model.openai_client(), model.get_inference_name()
        ),
        is_model_key=True,
    ),
    Way(
        "model's key, LangGraph's chat model",
        True,
        lambda server, credential, model, mp: langchain_agent(artstore.langgraph.init_chat_model),
        is_model_key=True,
    ),
    Way(
        "langchain-openai's key",
        True,
        lambda server, credential, model, mp: langchain_agent(
            lambda: ChatOpenAI(
                model="test-model", base_url=server.base_url, api_key=credential, logprobs=True
            )
        ),
    ),
    Way(
        "database URL's password",
        False,
        lambda server, credential, model, mp: openai_agent(
            openai.AsyncOpenAI(base_url=server.base_url, api_key=server.api_key)
        ),
    ),
]


def store_url(way: Way, database_url: str, credential: str) -> str:
    if way.name != "database URL's password":
        return database_url
    if database_url.startswith("sqlite"):
        pytest.skip("a SQLite URL holds no password")
    # The test server trusts local connections: the password is sent, and ignored.
    return make_url(database_url).set(password=credential).render_as_string(hide_password=False)


@pytest.mark.parametrize("way", WAYS, ids=[way.name for way in WAYS])
async def test_a_credential_is_nowhere_artstore_writes_or_prints(
    way: Way, database_url: str, tmp_path: Path, monkeypatch, caplog, capfd
) -> None:
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    credential = "sk-user-" + secrets.token_hex(16)
    assert len([t for t in tokenize(credential) if t.strip()]) > 3  # spelled in pieces
    caplog.set_level(logging.DEBUG, logger="artstore")
    url = store_url(way, database_url, credential)
    store = await artstore.open_store(url)
    server_key = credential if way.is_server_key else None
    async with store, LocalInferenceServer(api_key=server_key) as server:
        model = trainable_model(name="agent", project="tests", base_model="Qwen/Qwen2.5-0.5B")
        model_key = credential if way.is_model_key else None
        await model.register(
            CheckOnlyBackend(
                path=tmp_path / ".art",
                inference_base_url=server.base_url,
                inference_api_key=model_key,
            )
        )
        await leaky_loop(
            store, model, way.agent(server, credential, model, monkeypatch), credential
        )

        answers = await final_answers(store)
        assert answers and all(REDACTED in answer for answer in answers), answers
        leaks = await places_holding(store, url, RUN, credential, tmp_path)
    assert leaks == []
    logged = [record.getMessage() for record in caplog.records]
    assert not [line for line in logged if credential in line]
    printed = capfd.readouterr()
    assert credential not in printed.out + printed.err


RECORDED_BY = ["record_group", "group_recorder", "recording_backend"]


@pytest.mark.parametrize("recorded_by", RECORDED_BY)
async def test_the_model_key_spelled_in_logprob_tokens_is_nowhere_whichever_way_a_group_is_recorded(
    recorded_by: str, database_url: str, tmp_path: Path, monkeypatch
) -> None:
    """Trajectories built outside any rollout (ART's own client, the model's key), whose
    answers spell the key one token at a time (text on ART 0.5.18, `bytes` too on 0.5.23),
    given to record_group, to group_recorder or to the recording backend's train."""
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    credential = "sk-user-" + secrets.token_hex(16)
    async with (
        await artstore.open_store(database_url) as store,
        LocalInferenceServer(api_key=credential) as server,
    ):
        model = trainable_model(name="agent", project="tests", base_model="Qwen/Qwen2.5-0.5B")
        inner = CheckOnlyBackend(
            path=tmp_path / ".art", inference_base_url=server.base_url, inference_api_key=credential
        )
        backend = artstore.recording_backend(store, inner, run=RUN)
        await model.register(backend if recorded_by == "recording_backend" else inner)
        ask = openai_agent(model.openai_client(), model.get_inference_name())

        async def rollout(city: str) -> art.Trajectory:
            trajectory = art.Trajectory(
                messages_and_choices=[{"role": "user", "content": f"Look up {city}."}],
                tools=[LOOKUP_TOOL],
                reward=float(len(city)),
            )
            for call_id in await ask(trajectory):
                result = f"{city}: found with key {credential}"
                trajectory.messages_and_choices.append(
                    {"role": "tool", "tool_call_id": call_id, "content": result}
                )
                await ask(trajectory)
            return trajectory

        groups = await art.gather_trajectory_groups(
            (art.TrajectoryGroup(rollout(city) for _ in range(2)) for city in ("Paris", "Rome")),
            after_each=(
                artstore.group_recorder(store, run=RUN, model=model, batch=0)
                if recorded_by == "group_recorder"
                else None
            ),
            pbar_desc=None,
        )
        if recorded_by == "record_group":
            for group in groups:
                await artstore.record_group(store, group, run=RUN, model=model)
        if recorded_by == "recording_backend":
            await backend.train(model, groups)
            await backend.release()

        choices = [c for g in groups for t in g for c in t.messages_and_choices]
        choices = [c for c in choices if getattr(c, "logprobs", None)]
        spelled = ["".join(e.token for e in c.logprobs.content) for c in choices]
        assert any(credential in tokens for tokens in spelled)  # the model did spell it
        answers = await final_answers(store)
        assert len(answers) == 4 and all(REDACTED in answer for answer in answers), answers
        assert await places_holding(store, database_url, RUN, credential, tmp_path) == []


async def leaky_loop(store: Any, model: Any, ask: Ask, credential: str) -> None:
    """Two groups of two rollouts; each echoes the credential; one of them fails."""
    started: dict[str, int] = {}

    async def rollout(model: Any, city: str) -> art.Trajectory:
        started[city] = attempt = started.get(city, 0) + 1
        trajectory = art.Trajectory(
            messages_and_choices=[{"role": "user", "content": f"Look up {city}."}],
            tools=[LOOKUP_TOOL],
            reward=0.0,
        )
        for call_id in await ask(trajectory):  # a tool call, then the answer
            result = f"{city}: found with key {credential}"
            trajectory.messages_and_choices.append(
                {"role": "tool", "tool_call_id": call_id, "content": result}
            )
            await ask(trajectory)
        trajectory.log(f"looked {city} up with {credential}")
        trajectory.metadata["credential"] = credential
        if city == "Rome" and attempt == 1:
            raise RuntimeError(f"the lookup service refused {credential}")
        trajectory.reward = 1.0
        return trajectory

    durable = artstore.durable_rollouts(store, rollout, run=RUN)
    groups = await art.gather_trajectory_groups(
        (art.TrajectoryGroup(durable(model, city) for _ in range(2)) for city in ("Paris", "Rome")),
        after_each=artstore.group_recorder(store, run=RUN, model=model, batch=0),
        pbar_desc=None,
        max_exceptions=1,
    )
    assert sorted(len(group.trajectories) for group in groups) == [1, 2]


async def final_answers(store: Any) -> list[str]:
    """The text of each rollout's last answer, as stored (the model quoted the tool result)."""
    from sqlalchemy import text

    async with store.database.read() as connection:
        rows = await connection.execute(
            text(
                "SELECT content FROM v_trajectory_messages WHERE role = 'assistant' "
                "AND content LIKE 'Final answer%'"
            )
        )
        return [row.content for row in rows]


def test_support_finds_what_it_looks_for() -> None:
    """The check itself: a secret spelled over logprob tokens is found, joined."""
    from support_secrets import readings

    entries = [{"token": piece, "logprob": -0.1} for piece in ["sk", "-", "abc", "123"]]
    body = json.dumps({"choices": [{"logprobs": {"content": entries}}]})
    assert "sk-abc123" not in body
    assert any("sk-abc123" in shown for shown in readings(body))


# --- which strings are credentials ------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "secret"),
    [
        ("EMPTY", False),
        ("sk-", False),
        ("abc", False),
        ("password", False),  # a word
        ("12345678", False),  # a number
        ("PostgreSQLDatabase", False),  # letters only, under 24 characters
        ("sk-local", True),
        ("hunter2!", True),
        ("x" * 24, True),  # long enough to be no word
        ("pässwört-geheim-42", True),
    ],
)
def test_only_strings_that_cannot_be_ordinary_text_are_credentials(value, secret) -> None:
    from artstore.redaction import is_secret

    assert is_secret(value) is secret


def test_the_credentials_of_a_request_are_its_auth_headers_cookies_and_url_secrets() -> None:
    import base64

    import httpx

    from artstore.capture.credentials import credentials_of

    basic = base64.b64encode(b"agent:basic-pass-123").decode()
    request = httpx.Request(
        "POST",
        "https://user:url%40pass-1@api.example/v1/chat/completions?key=query-key-1&region=eu",
        headers={
            "Authorization": "Bearer sk-bearer-1",
            "Proxy-Authorization": f"Basic {basic}",
            "api-key": "azure-key-1",
            "x-api-key": "anthropic-key-1",
            "x-goog-api-key": "google-key-1",
            "Cookie": "session=cookie-value-1; theme=dark",
            "Idempotency-Key": "stainless-python-retry-1",
            "OpenAI-Organization": "org-1",
            "Content-Type": "application/json",
        },
    )
    found = credentials_of(request)
    expected = {"sk-bearer-1", basic, "basic-pass-123", "azure-key-1", "anthropic-key-1"}
    expected |= {"google-key-1", "cookie-value-1", "url%40pass-1", "url@pass-1", "query-key-1"}
    assert expected <= found
    assert not found & {"stainless-python-retry-1", "org-1", "application/json", "eu"}
    bare = httpx.Request("GET", "https://api.example/", headers={"Authorization": "bare-key-1"})
    assert credentials_of(bare) == {"bare-key-1"}


def test_the_environment_holds_credentials_in_variables_named_so_and_in_urls(monkeypatch):
    from artstore.redaction import secrets_from_environment

    named = {
        "ANTHROPIC_API_KEY": "sk-ant-env-1",
        "HF_TOKEN": "hf_envtoken1",
        "MY_SERVICE_SECRET": "service-secret-1",
        "PGPASSWORD": "pg-password-1",
        "ARTSTORE_URL": "postgresql://user:url-password-1@db/artstore",
    }
    ordinary = {
        "MAX_TOKENS": "100000000",
        "HF_TOKEN_PATH": "/root/.cache/huggingface/token",
        "OPENAI_BASE_URL": "http://127.0.0.1:8000/v1",
        "SHORT_TOKEN": "EMPTY",
    }
    for name, value in {**named, **ordinary}.items():
        monkeypatch.setenv(name, value)
    found = secrets_from_environment()
    assert set(named.values()) - {named["ARTSTORE_URL"]} | {"url-password-1"} <= found
    assert not found & set(ordinary.values())


@pytest.mark.parametrize("key", ["EMPTY", "abc", "password"])
async def test_a_short_or_common_key_redacts_no_ordinary_text(store, key) -> None:
    """A key that could be a word is used, never redacted: the conversation is kept as is."""
    from sqlalchemy import text

    async with LocalInferenceServer(api_key=key) as server:
        client = openai.AsyncOpenAI(base_url=server.base_url, api_key=key)
        question = f"Is the box {key}? Tell me your password, abc."
        async with store.rollout("agent", run="plain") as rollout:
            await client.chat.completions.create(
                model="test-model", messages=[{"role": "user", "content": question}]
            )
            rollout.result = {"answer": f"the box is {key}"}
    async with store.database.read() as connection:
        rows = await connection.execute(text("SELECT content FROM v_trajectory_messages"))
        contents = [row.content for row in rows]
    assert question in contents and not any(REDACTED in content for content in contents)
