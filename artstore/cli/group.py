"""`artstore group ID`: a group's rollouts side by side, with rewards and advantages."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from artstore.cli.output import (
    FormatOption,
    OutputFormat,
    print_rows,
    print_table,
    text,
    write_json,
)
from artstore.cli.shared import UrlOption, console, run


def group(
    group_id: Annotated[
        str, typer.Argument(metavar="ID", help="The group's id, or its first characters.")
    ],
    url: UrlOption = None,
    output: FormatOption = OutputFormat.table,
) -> None:
    """Show a group: its rollouts side by side, rewards, advantages, who trained on it.

    Each rollout's reward per scorer and ART's advantage, what it answered, and which
    models trained on the group at which step. ID may be the first characters of the id.
    """

    async def work() -> dict[str, Any]:
        from artstore.analysis.groups import group_detail
        from artstore.analysis.opening import read_one

        return await read_one(url, "group", group_id, group_detail)

    found = run(work)
    if output is OutputFormat.json:
        write_json(found)
        return
    rows = rollout_rows(found)
    if output is OutputFormat.csv:
        print_rows(rows, output)
        return
    _print_head(found)
    scorers = list(found["scorers"])
    print_rows(
        rows,
        OutputFormat.table,
        title="rollouts",
        columns=[
            "rollout",
            "role",
            "status",
            *(f"reward:{s}" for s in scorers),
            *(f"advantage:{s}" for s in scorers),
            "tokens",
            "answer",
        ],
        headers={
            **{f"reward:{s}": s for s in scorers},
            **{f"advantage:{s}": f"adv. {s}" for s in scorers},
        },
        wide=("answer",),
    )
    console.print()
    print_rows(
        found["consumed"],
        OutputFormat.table,
        title="trained by",
        columns=["model", "step", "scorer", "finished_at"],
        headers={"step": "step reached", "finished_at": "at (UTC)"},
        empty="no model yet",
    )


def rollout_rows(found: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for rollout in found["rollouts"]:
        row: dict[str, Any] = {
            "rollout": rollout["rollout_id"][:8],
            "rollout_id": rollout["rollout_id"],
            "role": rollout["role"],
            "status": rollout["status"],
            "policy_step": rollout["policy_step"],
            "tokens": rollout["total_tokens"],
            "answer": _answer(rollout),
        }
        for scorer in found["scorers"]:
            got = rollout["rewards"].get(scorer)
            row[f"reward:{scorer}"] = got["reward"] if got else None
            row[f"advantage:{scorer}"] = rollout["advantages"].get(scorer)
        rows.append(row)
    return rows


def _answer(rollout: dict[str, Any]) -> str:
    """The last assistant message, or the error of a failed rollout."""
    if rollout["error_type"]:
        return f"{rollout['error_type']}: {rollout['error_message']}"
    said = [m["content"] for m in rollout["messages"] if m["role"] == "assistant" and m["content"]]
    if said:
        return said[-1]
    return text(rollout["result"])


def _print_head(found: dict[str, Any]) -> None:
    from rich.table import Table
    from rich.text import Text

    head = Table.grid(padding=(0, 2))
    head.add_column(style="bold")
    head.add_column()
    scenario = found["rollouts"][0]["scenario"] if found["rollouts"] else None
    for label, value in (
        ("group", found["group_id"]),
        ("run", found["run"]),
        (
            "epoch / batch / scenario",
            f"{found['epoch']} / {found['batch']} / {found['scenario_index']}",
        ),
        (
            "rollouts",
            f"{found['size']} policy, {found['num_validation']} validation, "
            f"{found['num_failed']} failed",
        ),
        ("scenario", text(scenario) if scenario is not None else None),
        (
            "rewards",
            "; ".join(
                f"{name}: mean {text(s['reward_mean'])}, std {text(s['reward_std'])}"
                for name, s in found["scorers"].items()
            ),
        ),
        ("sealed", found["sealed_at"]),
    ):
        if value not in (None, ""):
            head.add_row(label, Text(str(value)))
    print_table(head)
    console.print()
