"""`artstore rescore`: new rewards for a run's stored groups, without running any agent."""

from __future__ import annotations

import sys
from contextlib import redirect_stdout
from typing import Annotated, Any

import typer

from artstore.cli.output import FormatOption, OutputFormat, print_rows, progress
from artstore.cli.plugins import load_reward_function
from artstore.cli.shared import UrlOption, console, run

RunArgument = Annotated[str, typer.Argument(metavar="RUN", help="The run (see `artstore runs`).")]
RewardOption = Annotated[
    str,
    typer.Option(
        "--reward",
        metavar="MODULE:FUNCTION",
        help="The reward function, called as during the run: (scenario, results, "
        "trajectories) -> rewards, sync or async. E.g. my_rewards:score, or "
        "artstore.training.ruler:ruler for ART's RULER judge.",
        show_default=False,
    ),
]
ScorerOption = Annotated[
    str,
    typer.Option(
        help="Name the new rewards are recorded under (train on them with "
        "`artstore replay --scorer NAME`).",
        show_default=False,
    ),
]
GroupOption = Annotated[
    list[str] | None,
    typer.Option("--group", metavar="GROUP_ID", help="Only this group (repeatable)."),
]
AgainOption = Annotated[
    bool,
    typer.Option(
        "--again",
        help="Score again the groups SCORER has scored already (by default they are "
        "left as they are, so that running the command again finishes a stopped one).",
    ),
]
ConcurrencyOption = Annotated[
    int, typer.Option(min=1, help="Groups scored at once (an LLM judge may want fewer).")
]


def rescore(
    run_name: RunArgument,
    reward: RewardOption,
    scorer: ScorerOption,
    group: GroupOption = None,
    again: AgainOption = False,
    concurrency: ConcurrencyOption = 8,
    url: UrlOption = None,
    output: FormatOption = OutputFormat.table,
) -> None:
    """Score the groups of RUN again with a new reward function, recorded as SCORER.

    The function gets the stored scenario, the agents' stored results and the projected
    trajectories; no agent runs. The rewards are appended: earlier scores stay, and a
    failure keeps the groups scored before it. Groups SCORER has scored already are left
    as they are unless --again: run it again to finish a re-scoring that stopped.
    """
    skipped: list[str] = []
    options = {"group_ids": group, "concurrency": concurrency, "again": again}
    rows = run(lambda: _rescore(run_name, reward, scorer, url, options, skipped))
    _show(rows, output, run_name, scorer, skipped)


async def _rescore(
    run_name: str,
    reward: str,
    scorer: str,
    url: str | None,
    options: dict[str, Any],
    skipped: list[str],
) -> list[dict[str, Any]]:
    """The groups scored now, a row each (`skipped` gets those SCORER had scored)."""
    import artstore
    from artstore.training.overview import describe_run
    from artstore.training.rescore import rescore as rescore_run
    from artstore.training.runs import run_info

    function = load_reward_function(reward)
    async with await artstore.open_store(url, create=False) as store:
        info = await run_info(store, run_name)
        # What reward functions print (RULER warns on stdout) goes to stderr, so that
        # stdout holds only the rows (`--format json` stays parseable).
        with progress(f"scoring as {scorer}") as advance, redirect_stdout(sys.stderr):
            scored = await rescore_run(
                store,
                run_name,
                function,
                scorer,
                on_start=advance.total,
                on_group=lambda _: advance(),
                on_skipped=skipped.extend,
                **options,
            )
        groups = (await describe_run(store, run_name))["groups"]
    chosen = set(scored)
    return [
        {
            "group": g["group_id"][:8],
            "group_id": g["group_id"],
            "batch": g["batch"],
            "scenario_index": g["scenario_index"],
            "scorer": scorer,
            "reward_mean": g["rewards"].get(scorer),
            "run_scorer": info.scorer,
            "run_reward_mean": g["rewards"].get(info.scorer),
        }
        for g in groups
        if g["group_id"] in chosen
    ]


def _show(
    rows: list[dict[str, Any]], output: OutputFormat, run_name: str, scorer: str, skipped: list
) -> None:
    """The groups scored, and in a table what was left and what to do next."""
    print_rows(
        rows,
        output,
        columns=["group", "batch", "scenario_index", "reward_mean", "run_reward_mean"],
        headers={
            "scenario_index": "scenario",
            "reward_mean": f"{scorer} mean",
            "run_reward_mean": f"{rows[0]['run_scorer']} mean" if rows else "run scorer mean",
        },
        empty=f"no group left to score as {scorer!r}" if skipped else "no group to score",
    )
    if output is not OutputFormat.table:
        return
    left = (
        f"; {len(skipped)} groups scored as {scorer!r} before were left as they are "
        "(--again scores them again)"
        if skipped
        else ""
    )
    console.print(
        f"re-scored {len(rows)} groups of {run_name} as {scorer!r}{left}; train on them "
        f"with `artstore replay {run_name} --scorer {scorer} --model NEW_NAME --backend ...`",
        highlight=False,
    )
