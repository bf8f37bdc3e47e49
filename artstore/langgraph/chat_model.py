"""`artstore.langgraph.init_chat_model`'s chat model: ART's `LoggingLLM`, recorded to the store.

It behaves as ART's `art.langgraph` wrapper does: a `ChatOpenAI` (temperature 1.0) pointed
at the rollout model's inference URL, tools converted with `convert_to_openai_tool` and
recorded with each call, structured output through `bind_tools([schema])` and
`schema.model_validate(tool_calls[0]["args"])`, string tool-call arguments parsed as JSON.
Every call becomes an `llm.call` event of the rollout current *at call time*.

Its calls are recorded once, as LangChain messages. The HTTP capture of the rollout
(`artstore.capture.http.attempts`) records only the requests of a call that failed (its
client's SDK may send several); the record of a failed call supersedes the last one.

What it does that ART's wrapper does not:

- times every call (`latency_s`) and records failed calls with their exception (then
  re-raises it);
- `with_retry(...)` retries (ART's returns the model unchanged); each failed attempt is
  recorded;
- `bind_tools` keeps a structured output and `with_structured_output` keeps bound tools
  (ART's drops the first);
- `with_config` returns a new model (ART's changes the model in place) and the inference
  URL, key and model name are taken from the current rollout on every call, so one model
  object can serve many rollouts (ART needs `with_config` for that);
- `with_structured_output(..., include_raw=True)` is supported; a missing tool call is an
  `OutputParserException` naming the schema rather than a pydantic error about `None`.
"""

from __future__ import annotations

import asyncio
import json
import random
import threading
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from langchain_core.exceptions import OutputParserException
from langchain_core.messages import AIMessage
from langchain_core.runnables import Runnable, RunnableConfig
from langchain_core.runnables.config import merge_configs
from langchain_core.utils.function_calling import convert_to_openai_tool
from pydantic import BaseModel

from artstore.capture.http import attempts
from artstore.capture.rollout import Rollout, require_rollout

CALL_TIMEOUT_S = 10 * 60  # as ART's wrapper: an async call that takes longer fails
DEFAULT_TEMPERATURE = 1.0  # as ART's wrapper: sample from the policy as trained


class RetryPolicy:
    """`Runnable.with_retry`'s parameters, applied by the model itself."""

    def __init__(
        self,
        retry_if_exception_type: tuple[type[BaseException], ...] = (Exception,),
        wait_exponential_jitter: bool = True,
        exponential_jitter_params: dict[str, float] | None = None,
        stop_after_attempt: int = 3,
    ) -> None:
        self.retry_if_exception_type = tuple(retry_if_exception_type)
        self.wait_exponential_jitter = wait_exponential_jitter
        self.jitter = {"initial": 1.0, "max": 60.0, "exp_base": 2.0, "jitter": 1.0, "min": 0.0}
        self.jitter.update(exponential_jitter_params or {})
        self.stop_after_attempt = max(1, stop_after_attempt)

    def should_retry(self, attempt: int, error: BaseException) -> bool:
        return attempt < self.stop_after_attempt and isinstance(error, self.retry_if_exception_type)

    def wait_s(self, attempt: int) -> float:
        """tenacity's `wait_exponential_jitter` after the `attempt`-th failure."""
        if not self.wait_exponential_jitter:
            return 0.0
        p = self.jitter
        wait = p["initial"] * p["exp_base"] ** (attempt - 1) + random.uniform(0, p["jitter"])
        return max(p["min"], min(p["max"], wait))


NO_RETRY = RetryPolicy(stop_after_attempt=1)


class RecordedChatModel(Runnable[Any, Any]):
    """A chat model whose every call is an `llm.call` event of the current rollout.

    Made by `artstore.langgraph.init_chat_model`; `bind_tools`, `with_structured_output`,
    `with_config` and `with_retry` return new models, as LangChain's do.
    """

    def __init__(
        self,
        settings: dict[str, Any] | None = None,
        *,
        tools: Sequence[Any] = (),
        tool_options: dict[str, Any] | None = None,
        schema: Any = None,
        include_raw: bool = False,
        retry: RetryPolicy = NO_RETRY,
        config: RunnableConfig | None = None,
    ) -> None:
        self.settings = dict(settings or {})
        self.bound_tools = list(tools)
        self.tool_options = dict(tool_options or {})
        self.schema = schema
        self.include_raw = include_raw
        self.retry = retry
        self.config = config
        strict = self.tool_options.get("strict")
        offered = [*self.bound_tools, *([schema] if schema is not None else [])]
        # What the model is offered, as ART records it (`tools` of the trajectory).
        self.tools: list[dict[str, Any]] | None = (
            [convert_to_openai_tool(t, strict=strict) for t in offered] if offered else None
        )
        self._schema_name = self.tools[-1]["function"]["name"] if schema is not None else None
        self._clients: dict[tuple[Any, ...], Runnable] = {}
        self._clients_lock = threading.Lock()

    def _copy(self, **changes: Any) -> RecordedChatModel:
        fields: dict[str, Any] = {
            "settings": self.settings,
            "tools": self.bound_tools,
            "tool_options": self.tool_options,
            "schema": self.schema,
            "include_raw": self.include_raw,
            "retry": self.retry,
            "config": self.config,
        }
        return RecordedChatModel(**(fields | changes))

    def __repr__(self) -> str:  # never the API key
        tools = [t["function"]["name"] for t in self.tools or []]
        return f"RecordedChatModel(tools={tools}, structured_output={self._schema_name!r})"

    # --- what LangChain and LangGraph call ----------------------------------------------

    def bind_tools(self, tools: Sequence[Any], **options: Any) -> RecordedChatModel:
        """Offer `tools` (anything `convert_to_openai_tool` takes) on every call.

        `options` (`tool_choice`, `strict`, `parallel_tool_calls`) go to
        `ChatOpenAI.bind_tools`. A structured output set before is kept.
        """
        return self._copy(tools=list(tools), tool_options=options)

    def with_structured_output(
        self, schema: Any, *, include_raw: bool = False, method: str = "function_calling", **_: Any
    ) -> RecordedChatModel:
        """Answer with `schema` (a pydantic model, or a JSON schema / TypedDict for a dict).

        As ART: the schema is offered as a tool and the first call of it is parsed.
        """
        if method != "function_calling":
            raise ValueError(
                f"artstore records structured output through tool calls, as ART does; "
                f"method={method!r} is not supported (use 'function_calling')"
            )
        return self._copy(schema=schema, include_raw=include_raw)

    def with_config(self, config: RunnableConfig | None = None, **kwargs: Any) -> RecordedChatModel:
        """A model whose calls run with `config` (callbacks, tags, ...) merged in."""
        return self._copy(config=merge_configs(self.config, config, kwargs))  # type: ignore[arg-type]

    def with_retry(
        self,
        *,
        retry_if_exception_type: tuple[type[BaseException], ...] = (Exception,),
        wait_exponential_jitter: bool = True,
        exponential_jitter_params: dict[str, float] | None = None,
        stop_after_attempt: int = 3,
        **_: Any,
    ) -> RecordedChatModel:
        """Retry a failed call (or an unparsable structured output) like `Runnable.with_retry`.

        Each failed attempt is recorded as a failed `llm.call` with its exception.
        """
        policy = RetryPolicy(
            retry_if_exception_type,
            wait_exponential_jitter,
            exponential_jitter_params,  # type: ignore[arg-type]
            stop_after_attempt,
        )
        return self._copy(retry=policy)

    def invoke(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> Any:
        rollout = require_rollout("an artstore chat model call")
        served = rollout.served_answer(input, self.tools)  # a resumed rollout's earlier answer
        if served is not None:
            return self._parse(served)
        client = self._client(rollout)
        attempt = 0
        while True:
            attempt += 1
            started, clock = datetime.now(UTC), time.perf_counter()
            try:
                with attempts() as sent:  # recorded here, as LangChain messages (see _record)
                    output = client.invoke(input, config=self._config(config), **kwargs)
            except Exception as exc:
                self._record(rollout, input, None, started, clock, exc, sent)
                if not self.retry.should_retry(attempt, exc):
                    raise
                time.sleep(self.retry.wait_s(attempt))
                continue
            self._record(rollout, input, output, started, clock, None, sent)
            try:
                return self._parse(output)
            except OutputParserException as exc:
                if not self.retry.should_retry(attempt, exc):
                    raise
                time.sleep(self.retry.wait_s(attempt))

    async def ainvoke(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> Any:
        rollout = require_rollout("an artstore chat model call")
        served = rollout.served_answer(input, self.tools)  # a resumed rollout's earlier answer
        if served is not None:
            return self._parse(served)
        client = self._client(rollout)
        attempt = 0
        while True:
            attempt += 1
            started, clock = datetime.now(UTC), time.perf_counter()
            try:
                with attempts() as sent:  # recorded here, as LangChain messages (see _record)
                    output = await asyncio.wait_for(
                        client.ainvoke(input, config=self._config(config), **kwargs),
                        timeout=CALL_TIMEOUT_S,
                    )
            except (Exception, asyncio.CancelledError) as exc:
                self._record(rollout, input, None, started, clock, exc, sent)
                if isinstance(exc, asyncio.CancelledError) or not self.retry.should_retry(
                    attempt, exc
                ):
                    raise
                await asyncio.sleep(self.retry.wait_s(attempt))
                continue
            self._record(rollout, input, output, started, clock, None, sent)
            try:
                return self._parse(output)
            except OutputParserException as exc:
                if not self.retry.should_retry(attempt, exc):
                    raise
                await asyncio.sleep(self.retry.wait_s(attempt))

    # --- inside ---------------------------------------------------------------------------

    def _client(self, rollout: Rollout) -> Runnable:
        """The `ChatOpenAI` (tools bound) for the rollout's inference endpoint, made once."""
        key = (rollout.inference_base_url, rollout.inference_api_key, rollout.inference_model_name)
        client = self._clients.get(key)
        if client is None:
            from langchain_openai import ChatOpenAI

            settings = {"temperature": DEFAULT_TEMPERATURE, **self.settings}
            client = ChatOpenAI(
                base_url=rollout.inference_base_url,  # type: ignore[call-arg]
                api_key=rollout.inference_api_key,  # type: ignore[arg-type]
                model=rollout.inference_model_name,
                **settings,
            )
            offered = [*self.bound_tools, *([self.schema] if self.schema is not None else [])]
            if offered:
                client = client.bind_tools(offered, **self.tool_options)
            with self._clients_lock:
                client = self._clients.setdefault(key, client)
        return client

    def _config(self, config: RunnableConfig | None) -> RunnableConfig | None:
        return merge_configs(self.config, config) if self.config else config

    def _record(
        self,
        rollout: Rollout,
        input: Any,
        output: Any,
        started: datetime,
        clock: float,
        error: BaseException | None,
        sent: list[Any],
    ) -> None:
        """Record the call as LangChain messages. Its client's requests were recorded from
        HTTP only where they failed (the openai SDK retries some) or ART captured them:
        this record supersedes the last one if it is this outcome."""
        rollout.record_llm_call(
            input,
            output,
            tools=self.tools,
            started_at=started,
            latency_s=time.perf_counter() - clock,
            error=error,
            attempts=sent,
        )

    def _parse(self, output: Any) -> Any:
        """ART's post-processing: JSON tool-call arguments, then the structured output."""
        tool_calls = getattr(output, "tool_calls", None)
        for tool_call in tool_calls or []:
            if isinstance(tool_call["args"], str):
                tool_call["args"] = json.loads(tool_call["args"])
        if self.schema is None:
            return output
        try:
            parsed, error = self._structured(output, tool_calls or []), None
        except OutputParserException as exc:
            if not self.include_raw:
                raise
            parsed, error = None, exc
        if self.include_raw:
            return {"raw": output, "parsed": parsed, "parsing_error": error}
        return parsed

    def _structured(self, output: AIMessage, tool_calls: list[dict[str, Any]]) -> Any:
        call = next((c for c in tool_calls if c["name"] == self._schema_name), None)
        if call is None:
            raise OutputParserException(
                f"the model did not call the {self._schema_name!r} tool of the structured "
                f"output (it answered {str(output.content)[:200]!r})",
                llm_output=str(output.content),
            )
        if isinstance(self.schema, type) and issubclass(self.schema, BaseModel):
            try:
                return self.schema.model_validate(call["args"])
            except ValueError as exc:
                raise OutputParserException(
                    f"the {self._schema_name!r} tool call does not validate: {exc}",
                    llm_output=json.dumps(call["args"]),
                ) from exc
        return call["args"]


def init_chat_model(
    model: Any = None,
    *,
    model_provider: str | None = None,
    configurable_fields: Any = None,
    config_prefix: str | None = None,
    **kwargs: Any,
) -> RecordedChatModel:
    """A chat model for the rollout being recorded, as `art.langgraph.init_chat_model`.

    Call it inside `async with store.rollout(model, ...)` (or a function wrapped by
    `wrap_rollout`); outside one it raises NoRolloutError. The model, its URL and its key
    are those of the rollout's model (`model` and `model_provider` are accepted for
    LangChain's signature and ignored, as ART does). `kwargs` go to `ChatOpenAI`
    (temperature defaults to 1.0, as ART's).
    """
    require_rollout("artstore.langgraph.init_chat_model()")
    for reserved in ("base_url", "api_key", "openai_api_key", "openai_api_base"):
        if reserved in kwargs:
            raise TypeError(
                f"init_chat_model() takes no {reserved!r}: the rollout's model decides it"
            )
    return RecordedChatModel(kwargs)
