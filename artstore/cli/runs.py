"""`artstore runs` and `artstore show RUN`: what runs did, as tables, csv or json."""

from __future__ import annotations

import difflib
from enum import StrEnum
from typing import Annotated, Any

import typer

from artstore.cli.output import (
    FormatOption,
    OutputFormat,
    print_rows,
    print_table,
    sparkline,
    text,
    write_csv,
    write_json,
)
from artstore.cli.shared import UrlOption, console, run


def runs(url: UrlOption = None, output: FormatOption = OutputFormat.table) -> None:
    """List the runs: model, status, steps, groups, rollouts, latest reward."""

    async def work() -> list[dict[str, Any]]:
        import artstore
        from artstore.training.overview import list_runs

        async with await artstore.open_store(url, read_only=True) as store:
            return await list_runs(store)

    rows = run(work)
    if output is not OutputFormat.table:
        print_rows(rows, output)
        return
    for row in rows:
        row["groups"] = f"{row['groups_sealed']}/{row['groups_consumed']}"
        row["rollouts"] = f"{row['rollouts_finished']}/{row['rollouts_failed']}"
        if row["rollouts_running"]:
            row["rollouts"] += f" ({row['rollouts_running']} running)"
        row["reward"] = row["last_batch_reward_mean"]
        row["started"] = (row["started_at"] or "")[:16]  # the one format, to the minute
    print_rows(
        rows,
        output,
        columns=["run", "model", "status", "steps", "groups", "rollouts", "reward", "started"],
        headers={"started": "started (UTC)"},
        caption="groups: sealed/trained. rollouts: finished/failed. reward: mean of the "
        "latest batch, by the run's scorer. stale: running, but its trainer is gone.",
        empty="no runs in this store (try `artstore demo`)",
    )


class Section(StrEnum):
    run = "run"
    steps = "steps"
    groups = "groups"
    rewards = "rewards"
    consumption = "consumption"
    failures = "failures"


def show(
    run_name: Annotated[str, typer.Argument(metavar="RUN", help="The run (see `artstore runs`).")],
    section: Annotated[
        list[Section] | None,
        typer.Option(
            "--section",
            case_sensitive=False,
            help="Only these sections (repeatable). Default: all.",
        ),
    ] = None,
    url: UrlOption = None,
    output: FormatOption = OutputFormat.table,
) -> None:
    """Show a run: its steps with metrics and groups, rewards per scorer, consumption per
    trained model, and failures (rollouts and train steps)."""

    async def work() -> dict[str, Any]:
        import artstore
        from artstore.errors import NotFoundError
        from artstore.training.overview import describe_run, list_runs

        async with await artstore.open_store(url, read_only=True) as store:
            try:
                return await describe_run(store, run_name)
            except NotFoundError as exc:
                names = [row["run"] for row in await list_runs(store)]
                close = difflib.get_close_matches(run_name, names, n=3)
                if not close:
                    raise
                raise NotFoundError(f"{exc}; did you mean {' or '.join(close)}?") from None

    found = run(work)
    wanted = [s.value for s in Section if not section or s in section]
    chosen = {name: found[name] for name in wanted}
    if output is OutputFormat.json:
        write_json(chosen if len(wanted) > 1 else chosen[wanted[0]])
        return
    if output is OutputFormat.csv:
        for number, (name, rows) in enumerate(chosen.items()):
            if len(chosen) > 1:
                if number:
                    print()
                print(f"# {name}")
            write_csv([rows] if isinstance(rows, dict) else rows)
        return
    for name, rows in chosen.items():
        _SHOW[name](rows)
        console.print()


def _show_run(run: dict[str, Any]) -> None:
    from rich.table import Table
    from rich.text import Text

    table = Table.grid(padding=(0, 2))
    table.add_column(style="bold")
    table.add_column()
    rewards = [point["reward_mean"] for point in run.get("reward_per_batch", [])]
    for key in (
        "run",
        "model",
        "base_model",
        "status",
        "error",
        "scorer",
        "scenarios",
        "config",
        "rollouts_finished",
        "rollouts_failed",
        "rollouts_running",
        "validation_model",
        "trainer",
        "started_at",
        "finished_at",
    ):
        if run.get(key) not in (None, {}, "") or key in ("rollouts_finished", "rollouts_failed"):
            table.add_row(key.replace("_", " "), Text(text(run[key])))
        if key == "scorer" and rewards:
            table.add_row(
                "reward",
                Text(
                    f"{sparkline(rewards)}  {text(rewards[0])} → {text(rewards[-1])} "
                    f"(mean per batch, {len(rewards)} batch{'es' if len(rewards) != 1 else ''})"
                ),
            )
    print_table(table)


def _short_metrics(metrics: dict[str, Any], limit: int = 3) -> str:
    from artstore.training.overview import PREFERRED_METRICS

    keys = [k for k in PREFERRED_METRICS if k in metrics]
    keys += [k for k in metrics if k not in keys]
    shown = keys[:limit]
    more = f" (+{len(keys) - limit} more)" if len(keys) > limit else ""
    return ", ".join(f"{k}={text(metrics[k])}" for k in shown) + more


def _show_steps(rows: list[dict[str, Any]]) -> None:
    for row in rows:
        row["steps"] = f"{row['step_before']} → {row['step'] if row['step'] is not None else '?'}"
        row["in"] = (
            f"{row['groups']} (batch {text(row['batches'])})" if row["batches"] else row["groups"]
        )
    print_rows(
        rows,
        OutputFormat.table,
        title="train steps",
        columns=["model", "steps", "status", "scorer", "in", "reward_mean", "metrics", "error"],
        headers={"in": "groups", "reward_mean": "reward mean"},
        cells={"metrics": _short_metrics},
        wide=("metrics", "error"),
        empty="none yet",
    )


def _show_groups(rows: list[dict[str, Any]]) -> None:
    scorers = sorted({s for row in rows for s in row["rewards"]})
    for row in rows:
        row["group"] = row["group_id"][:8]
        for scorer in scorers:
            row[f"reward:{scorer}"] = row["rewards"].get(scorer)
    print_rows(
        rows,
        OutputFormat.table,
        title="groups",
        columns=[
            "group",
            "batch",
            "scenario_index",
            "size",
            "validation",
            "failed",
            *(f"reward:{s}" for s in scorers),
            "consumed_by",
        ],
        headers={
            "scenario_index": "scenario",
            "consumed_by": "trained by",
            **{f"reward:{s}": f"{s} mean" for s in scorers},
        },
        wide=("consumed_by",),
        empty="none sealed yet",
    )


def _show_rewards(rows: list[dict[str, Any]]) -> None:
    print_rows(
        rows,
        OutputFormat.table,
        title="rewards per scorer (latest per rollout; policy rollouts)",
        columns=[
            "scorer",
            "groups",
            "rollouts",
            "reward_mean",
            "reward_min",
            "reward_max",
            "events",
            "rescored_events",
        ],
        headers={"reward_mean": "mean", "reward_min": "min", "reward_max": "max"},
        empty="none recorded",
    )


def _show_consumption(rows: list[dict[str, Any]]) -> None:
    print_rows(
        rows,
        OutputFormat.table,
        title="consumption per trained model",
        columns=[
            "model",
            "groups_consumed",
            "steps_completed",
            "steps_failed",
            "last_step",
            "scorers",
        ],
        headers={"groups_consumed": "groups trained"},
        wide=("scorers",),
        empty="no group trained yet",
    )


def _show_failures(rows: list[dict[str, Any]]) -> None:
    print_rows(
        rows,
        OutputFormat.table,
        title="failures",
        columns=["kind", "id", "where", "error_type", "error_message"],
        headers={"error_type": "error", "error_message": "message"},
        wide=("where",),
        empty="none",
    )


_SHOW = {
    "run": _show_run,
    "steps": _show_steps,
    "groups": _show_groups,
    "rewards": _show_rewards,
    "consumption": _show_consumption,
    "failures": _show_failures,
}
