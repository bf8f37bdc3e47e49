"""ATIF (Agent Trajectory Interchange Format, the `atif` package's models) out and in.

An export is a JSONL file of ATIF `Trajectory` documents, one per finished or failed rollout,
each validated by `atif.Trajectory` before it is written:

- `session_id` and `trajectory_id`: the rollout id; `agent`: name = the rollout's model,
  version = its policy step, `model_name` = the run's base model, `tool_definitions` = the
  tools of its main history;
- `steps`: the main history in order: a system or user message is a `system` or `user`
  step; an assistant turn (a `Choice` or an assistant message) is an `agent` step with its
  `tool_calls` (arguments as a JSON object), and the tool messages answering it are its
  `observation.results` (`source_call_id` = the tool call's id); a Choice's logprobs are
  `metrics.logprobs`, and its token ids `metrics.completion_token_ids` where its tokens are
  vLLM's `token_id:N`;
- whatever ATIF has no place for is kept under `extra["artstore"]`, so that importing the
  file gives back the same trajectories: on a step or an observation result, `item` (the
  message or Choice as recorded, when ATIF's rendering of it would not give it back: top
  logprobs, token bytes, content parts, a finish reason...); on the trajectory, the rest of
  artstore's JSONL line (`artstore.exchange.jsonl`): the run, group, role, scenario,
  rewards of every scorer, metrics, metadata, additional histories.

ATIF files written elsewhere (Harbor, converters of coding-agent logs) import too: a
`.jsonl` of trajectories or a `.json` of one; each becomes a rollout of its own group, with
its agent steps as assistant messages (Choices with logprobs where `metrics.logprobs` is
given, so that ART can train them), its observations as tool messages, and no reward
(`artstore rescore` gives them one). Subagent trajectories are not imported.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from artstore.errors import ExchangeFormatError, NotFoundError
from artstore.exchange.files import existing_file
from artstore.exchange.importer import ImportPlan, derived_id, file_sha256
from artstore.exchange.jsonl import FORMAT, export_lines, is_choice, plan_of_lines, read_text_lines
from artstore.exchange.source import ExportSummary

if TYPE_CHECKING:
    from artstore.store import Store

SCHEMA_VERSION = "ATIF-v1.8"
_TOKEN_ID = re.compile(r"token_id:(\d+)")
_MAIN_HISTORY = ("messages_and_choices", "tools")


# --- export -------------------------------------------------------------------------------


async def export_atif(
    store: Store, run: str, out: str | Path, *, force: bool = False, progress: Any = None
) -> ExportSummary:
    """Write every finished or failed rollout of `run` to `out` ("-": stdout) as a line of
    ATIF, validated by `atif.Trajectory`; streams a chunk of rollouts at a time."""
    if str(out) != "-" and existing_file(Path(out)) is not None and not force:
        raise FileExistsError(f"{out} exists; nothing was written (--force overwrites it)")
    return await export_lines(store, run, out, to_text=_atif_text, progress=progress)


def _atif_text(line: dict[str, Any]) -> str:
    import atif

    document = to_atif(line)
    atif.Trajectory.model_validate(document)  # what a consumer's models read, checked here
    # A logprob can be -inf: written as `-Infinity`, which json (and pydantic) read back.
    return json.dumps(document)


def to_atif(line: dict[str, Any]) -> dict[str, Any]:
    """One line of artstore's JSONL export as an ATIF trajectory document (JSON)."""
    trajectory = line["trajectory"]
    items = trajectory.get("messages_and_choices") or []
    tools = trajectory.get("tools")
    kept = {**line, "trajectory": {k: v for k, v in trajectory.items() if k not in _MAIN_HISTORY}}
    agent: dict[str, Any] = {
        "name": line.get("model") or line["run"]["name"],
        "version": str(line.get("policy_step") if line.get("policy_step") is not None else 0),
    }
    if line["run"].get("base_model"):
        agent["model_name"] = line["run"]["base_model"]
    if tools is not None:
        agent["tool_definitions"] = tools
    steps = _steps(items)
    return {
        "schema_version": SCHEMA_VERSION,
        "session_id": line["rollout_id"],
        "trajectory_id": line["rollout_id"],
        "agent": agent,
        "steps": steps,
        "final_metrics": {"total_steps": len(steps)},
        "extra": {"artstore": kept},
    }


def _steps(items: list[Any]) -> list[dict[str, Any]]:
    steps: list[dict[str, Any]] = []
    for item in items:
        message = item.get("message") if is_choice(item) else item
        role = message.get("role") if isinstance(message, dict) else None
        last = steps[-1] if steps else None
        if role == "tool" and last and _answers(last, message):
            result = {"source_call_id": message["tool_call_id"], "content": message["content"]}
            if _items_of_step({}, result) != [item]:
                result["extra"] = {"artstore": {"item": item}}
            last.setdefault("observation", {"results": []})["results"].append(result)
            continue
        step = _step(item, message, role)
        step["step_id"] = len(steps) + 1
        if _item_of(step) != item:
            step["extra"] = {"artstore": {"item": item}}
        steps.append(step)
    return steps


def _answers(step: dict[str, Any], message: dict[str, Any]) -> bool:
    ids = {call["tool_call_id"] for call in step.get("tool_calls") or []}
    return isinstance(message.get("content"), str) and message.get("tool_call_id") in ids


def _step(item: Any, message: Any, role: str | None) -> dict[str, Any]:
    """The ATIF step of one item (what ATIF cannot hold of it goes to `extra` after)."""
    content = message.get("content") if isinstance(message, dict) else None
    text = content if isinstance(content, str) else ""
    if role in ("system", "user"):
        return {"source": role, "message": text}
    if role != "assistant":  # a tool message answering nothing, a developer message...
        return {"source": "system", "message": text}
    step: dict[str, Any] = {"source": "agent", "message": text}
    calls = [_tool_call(call) for call in message.get("tool_calls") or []]
    if calls and all(calls):
        step["tool_calls"] = calls
    if is_choice(item):
        step["metrics"] = _metrics(item)
    return step


def _tool_call(call: Any) -> dict[str, Any] | None:
    try:
        arguments = json.loads(call["function"]["arguments"] or "{}")
        if not isinstance(arguments, dict):
            return None
        return {
            "tool_call_id": call["id"],
            "function_name": call["function"]["name"],
            "arguments": arguments,
        }
    except (KeyError, TypeError, ValueError):
        return None


def _metrics(choice: dict[str, Any]) -> dict[str, Any]:
    tokens = (choice.get("logprobs") or {}).get("content") or []
    metrics: dict[str, Any] = {"logprobs": [token["logprob"] for token in tokens]}
    ids = [_TOKEN_ID.fullmatch(token.get("token") or "") for token in tokens]
    if tokens and all(ids):
        metrics["completion_token_ids"] = [int(match[1]) for match in ids if match]
    if not tokens:
        return {}
    return metrics


# --- import -------------------------------------------------------------------------------


def _item_of(step: dict[str, Any]) -> Any:
    """The message (or Choice) an ATIF step stands for, before its observation."""
    kept = ((step.get("extra") or {}).get("artstore") or {}).get("item")
    if kept is not None:
        return kept
    text = step["message"] if isinstance(step["message"], str) else _text(step["message"])
    if step["source"] != "agent":
        return {"role": step["source"], "content": text}
    calls = [
        {
            "id": call["tool_call_id"],
            "type": "function",
            "function": {"name": call["function_name"], "arguments": json.dumps(call["arguments"])},
        }
        for call in step.get("tool_calls") or []
    ]
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if calls:
        message["tool_calls"] = calls
    logprobs = (step.get("metrics") or {}).get("logprobs")
    if not logprobs:
        return message
    ids = (step.get("metrics") or {}).get("completion_token_ids") or []
    tokens = [
        {
            "token": f"token_id:{ids[i]}" if i < len(ids) else "",
            "logprob": logprob,
            "bytes": None,
            "top_logprobs": [],
        }
        for i, logprob in enumerate(logprobs)
    ]
    return {
        "finish_reason": "tool_calls" if calls else "stop",
        "index": 0,
        "logprobs": {"content": tokens, "refusal": None},
        "message": {**message, "tool_calls": calls or None, "refusal": None},
    }


def _items_of_step(step: dict[str, Any], *results: dict[str, Any]) -> list[Any]:
    items: list[Any] = []
    for result in results:
        kept = ((result.get("extra") or {}).get("artstore") or {}).get("item")
        if kept is not None:
            items.append(kept)
            continue
        content = result.get("content")
        items.append(
            {
                "role": "tool",
                "tool_call_id": result.get("source_call_id") or "",
                "content": content if isinstance(content, str) else _text(content or []),
            }
        )
    return items


def _text(parts: list[Any]) -> str:
    return "".join(part.get("text") or "" for part in parts if isinstance(part, dict))


def _line_of(document: dict[str, Any], where: str, ordinal: int, digest: str) -> dict[str, Any]:
    """An ATIF trajectory (already validated) as a line of artstore's JSONL export."""
    items: list[Any] = []
    for step in document["steps"]:
        items.append(_item_of(step))
        items.extend(_items_of_step(step, *((step.get("observation") or {}).get("results") or [])))
    extra = (document.get("extra") or {}).get("artstore")
    if isinstance(extra, dict) and extra.get("format") == FORMAT:
        line = dict(extra)
        line["trajectory"] = {**(extra.get("trajectory") or {}), "messages_and_choices": items}
        tools = document["agent"].get("tool_definitions")
        if tools is not None:
            line["trajectory"]["tools"] = tools
        return line
    agent = document["agent"]
    key = document.get("trajectory_id") or document.get("session_id") or ordinal
    return {
        "format": FORMAT,
        "run": {"name": "", "model": agent["name"], "base_model": agent.get("model_name")},
        "rollout_id": derived_id("atif", digest, key),
        "model": agent["name"],
        "metadata": {"atif_session_id": document.get("session_id") or ""},
        "trajectory": {"messages_and_choices": items, "tools": agent.get("tool_definitions")},
    }


def _documents(path: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    if path.suffix == ".json":
        text = path.read_bytes()
        try:
            yield f"{path}", json.loads(text)
        except (ValueError, UnicodeDecodeError) as exc:
            raise ExchangeFormatError(f"{path}: not JSON ({exc})") from None
        return
    yield from read_text_lines(path)


def read_atif(path: str | Path, *, run: str | None = None, scorer: str = "imported") -> ImportPlan:
    """The import plan of an ATIF file (a .jsonl of trajectories, or a .json of one),
    each trajectory validated by `atif.Trajectory` before anything is planned."""
    import atif

    path = Path(path)
    if not path.is_file():
        raise NotFoundError(f"{path}: no such file")
    digest = file_sha256(path)
    lines = []
    for ordinal, (where, document) in enumerate(_documents(path)):
        try:
            atif.Trajectory.model_validate(document)
        except ValidationError as exc:
            first = exc.errors()[0]
            field = ".".join(str(part) for part in first["loc"]) or "the trajectory"
            raise ExchangeFormatError(
                f"{where}: not an ATIF trajectory: {field}: {first['msg']}"
            ) from None
        line = _line_of(document, where, ordinal, digest)
        if not line["run"]["name"]:
            line["run"] = {**line["run"], "name": run or path.stem}
        lines.append((where, line))
    if not lines:
        raise ExchangeFormatError(f"{path}: empty file, nothing to import")
    return plan_of_lines(path, lines, run=run, scorer=scorer, source="atif")
