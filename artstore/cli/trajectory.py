"""`artstore trajectory ID`: one trajectory as a chat in the terminal (rich panels)."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from artstore.cli.output import FormatOption, OutputFormat, print_table, text, write_json
from artstore.cli.shared import UrlOption, console, run

ROLE_STYLES = {"system": "grey50", "user": "magenta", "assistant": "blue", "tool": "yellow"}
# Background per tenth of probability, as the viewer colours tokens (low: the model was unsure).
PROBABILITY_STYLES = (
    "on #e4572e",
    "on #ec7a4f",
    "on #f29c6e",
    "on #f6b88d",
    "on #f9d0ad",
    "on #fbe2c9",
    "on #e3f0d9",
    "on #cde6bd",
    "on #b7dca1",
    "",
)


def trajectory(
    rollout_id: Annotated[
        str,
        typer.Argument(metavar="ID", help="The rollout's id, or its first characters."),
    ],
    logprobs: Annotated[
        bool,
        typer.Option(
            "--logprobs", help="Colour each assistant token by its probability (red: unsure)."
        ),
    ] = False,
    url: UrlOption = None,
    output: FormatOption = OutputFormat.table,
) -> None:
    """Show a trajectory as a chat: messages, tool calls, results, rewards.

    The projected art.Trajectory that ART trains on, every history of it, with the
    rollout's rewards per scorer. ID may be the first characters of the id.
    """

    async def work() -> dict[str, Any]:
        from artstore.analysis.opening import read_one
        from artstore.analysis.trajectories import trajectory_detail

        return await read_one(url, "rollout", rollout_id, trajectory_detail)

    detail = run(work)
    if output is OutputFormat.json:
        write_json(detail)
        return
    if output is OutputFormat.csv:
        from artstore.cli.output import write_csv

        write_csv(
            [
                {"history": h["index"], "turn": n, **_flat_turn(turn)}
                for h in detail["histories"]
                for n, turn in enumerate(h["turns"])
            ]
        )
        return
    print_trajectory(detail, logprobs=logprobs)


def _flat_turn(turn: dict[str, Any]) -> dict[str, Any]:
    return {
        "role": turn["role"],
        "content": turn["content"],
        "tool_calls": [{"id": c["id"], "name": c["name"]} for c in turn["tool_calls"]],
        "tool_call_id": turn["tool_call_id"],
        "trainable": turn["trainable"],
        "tokens": len(turn["tokens"]),
    }


def print_trajectory(detail: dict[str, Any], *, logprobs: bool = False) -> None:
    """A rollout's facts, then each of its histories turn by turn."""
    _print_rollout_facts(detail)
    for history in detail["histories"]:
        title = (
            "conversation" if history["index"] == 0 else f"additional history {history['index']}"
        )
        tools = ", ".join(
            str((tool.get("function") or {}).get("name") or tool.get("name") or "?")
            for tool in history["tools"]
        )
        console.print()
        console.rule(
            f"{title}" + (f" · tools: {tools}" if tools else ""), align="left", style="dim"
        )
        for turn in history["turns"]:
            _print_turn(turn, logprobs=logprobs)


def _print_rollout_facts(detail: dict[str, Any]) -> None:
    from rich.table import Table
    from rich.text import Text

    rollout = detail["rollout"]
    head = Table.grid(padding=(0, 2))
    head.add_column(style="bold")
    head.add_column()
    for label, value in (
        ("rollout", rollout["rollout_id"]),
        ("run", rollout["run"]),
        ("group", rollout["group_id"]),
        ("model", rollout["model"]),
        ("role", rollout["role"]),
        ("policy step", rollout["policy_step"]),
        ("status", rollout["status"]),
        (
            "error",
            f"{rollout['error_type']}: {rollout['error_message']}"
            if rollout["error_type"]
            else None,
        ),
        (
            "tokens",
            f"{rollout['prompt_tokens'] or 0} prompt, "
            f"{rollout['completion_tokens'] or 0} completion",
        ),
        (
            "duration",
            f"{text(rollout['duration_s'])} s" if rollout["duration_s"] is not None else None,
        ),
        ("started", rollout["started_at"]),
        (
            "rewards",
            ", ".join(
                f"{r['scorer']}={text(r['reward'])}" for r in detail["rewards"] if r["is_latest"]
            ),
        ),
    ):
        if value not in (None, ""):
            head.add_row(label, Text(str(value)))
    print_table(head)


def _print_turn(turn: dict[str, Any], *, logprobs: bool) -> None:
    """One message as a panel: its text (or tokens), its tool calls, whether it trains."""
    from rich.panel import Panel
    from rich.text import Text

    body = Text()
    if turn["tokens"] and turn["tokens_are_content"] and logprobs:
        body.append_text(_tokens(turn["tokens"]))
    elif turn["content"]:
        body.append(turn["content"])
    for call in turn["tool_calls"]:
        if body:
            body.append("\n")
        body.append(f"→ {call['name']}", style="bold")
        body.append(f"  {call['id'] or ''}\n", style="dim")
        body.append(call["arguments"])
    if turn["tokens"] and not turn["tokens_are_content"] and logprobs:
        body.append("\ngenerated tokens: ", style="dim")
        body.append_text(_tokens(turn["tokens"]))
    subtitle = []
    if turn["trainable"]:
        count = len(turn["tokens"])
        subtitle.append(f"trainable, {count} token{'s' if count != 1 else ''}")
    if turn["finish_reason"]:
        subtitle.append(str(turn["finish_reason"]))
    role_title = turn["role"]
    if turn["tool_call_id"]:
        role_title += f" · result of {turn['tool_call_id']}"
    console.print(
        Panel(
            body,
            title=Text(role_title),
            title_align="left",
            subtitle=", ".join(subtitle) or None,
            subtitle_align="right",
            border_style=ROLE_STYLES.get(turn["role"], "white"),
        )
    )


def _tokens(tokens: list[dict[str, Any]]):
    from rich.text import Text

    shown = Text()
    for token in tokens:
        probability = token["probability"]
        style = "" if probability is None else PROBABILITY_STYLES[min(9, int(probability * 10))]
        shown.append(token["token"] or "", style=style)
    return shown
