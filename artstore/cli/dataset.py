"""`artstore dataset`: versioned datasets of rollouts, and their exports for trainers."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from artstore.cli.output import (
    FormatOption,
    OutputFormat,
    counted,
    print_rows,
    progress,
    write_json,
)
from artstore.cli.shared import UrlOption, console, err_console, run

app = typer.Typer(
    help="Versioned datasets of rollouts (create, list, show, diff) and their exports.",
    no_args_is_help=True,
)

NameArgument = Annotated[str, typer.Argument(metavar="NAME", help="The dataset's name.")]
ReferenceArgument = Annotated[
    str, typer.Argument(metavar="NAME[@V]", help="A dataset, at version V (default: newest).")
]


@app.command()
def create(
    name: NameArgument,
    run_name: Annotated[
        str | None, typer.Option("--run", help="Choose among this run's rollouts.")
    ] = None,
    scorer: Annotated[
        str | None, typer.Option(help="Rewards by this scorer (default: the run's).")
    ] = None,
    min_reward: Annotated[
        float | None, typer.Option(help="Only rollouts rewarded at least this.")
    ] = None,
    top_k: Annotated[
        int | None, typer.Option(min=1, help="Only the K best rewarded of each group.")
    ] = None,
    steps: Annotated[
        str | None,
        typer.Option(metavar="A:B", help="Only policy steps A to B (both included; A: or :B)."),
    ] = None,
    sql: Annotated[
        str | None,
        typer.Option(
            metavar="QUERY",
            help="Only the rollouts a read-only query returns (its rollout_id column), run "
            "as `artstore sql` runs it.",
        ),
    ] = None,
    url: UrlOption = None,
    output: FormatOption = OutputFormat.table,
) -> None:
    """Freeze a selection of finished policy rollouts as the next version of NAME.

    The version holds the exact rollout ids, their rewards by the scorer and a digest of
    what they held; it never changes. Running it again makes a new version (see `dataset
    diff`).
    """

    async def work() -> dict[str, Any]:
        import artstore
        from artstore.datasets import Selection, create_dataset
        from artstore.datasets.selection import parse_steps

        selection = Selection(
            run=run_name,
            scorer=scorer,
            min_reward=min_reward,
            top_k=top_k,
            steps=parse_steps(steps) if steps is not None else None,
            sql=sql,
        )
        async with await artstore.open_store(url, create=False) as store:
            return (await create_dataset(store, name, selection)).summary()

    made = run(work)
    if output is not OutputFormat.table:
        write_json(made)
        return
    console.print(
        f"created dataset {made['name']}@{made['version']}: "
        f"{counted(made['rollouts'], 'rollout')} (digest {made['digest'][:12]})",
        highlight=False,
    )


@app.command("list")
def list_(url: UrlOption = None, output: FormatOption = OutputFormat.table) -> None:
    """Every version of every dataset."""

    async def work() -> list[dict[str, Any]]:
        from artstore.analysis.opening import open_for_reading
        from artstore.datasets import list_datasets

        async with await open_for_reading(url) as store:
            return [d.summary() for d in await list_datasets(store)]

    rows = run(work)
    print_rows(
        rows,
        output,
        columns=["name", "version", "rollouts", "run", "scorer", "created_at"],
        empty="no dataset (create one with `artstore dataset create NAME --run RUN`)",
    )


@app.command()
def show(
    reference: ReferenceArgument,
    url: UrlOption = None,
    output: FormatOption = OutputFormat.table,
) -> None:
    """One version of a dataset: how it was chosen, and its rollouts with their rewards."""

    async def work() -> dict[str, Any]:
        from artstore.analysis.opening import open_for_reading
        from artstore.datasets import read_dataset
        from artstore.datasets.selection import holds_the_same, parse_reference

        name, version = parse_reference(reference)
        async with await open_for_reading(url) as store:
            found = await read_dataset(store, name, version)
            same = await holds_the_same(store, found)
        return found.summary() | {
            "unchanged": same,
            "rollout_ids": found.rollout_ids,
            "rewards": {rid: found.rewards.get(rid) for rid in found.rollout_ids},
        }

    shown = run(work)
    if output is not OutputFormat.table:
        write_json(shown)
        return
    for key in ("name", "version", "run", "scorer", "rollouts", "digest", "created_at"):
        console.print(f"{key}: {shown[key]}", highlight=False)
    console.print(f"selection: {shown['selection']}", highlight=False)
    console.print(
        "unchanged: "
        + (
            "yes, its rollouts hold what they held"
            if shown["unchanged"]
            else "no, an event or a reward by its scorer was recorded since"
        ),
        highlight=False,
    )
    print_rows(
        [{"rollout_id": rid, "reward": r} for rid, r in shown["rewards"].items()],
        output,
        columns=["rollout_id", "reward"],
    )


@app.command()
def diff(
    old: Annotated[str, typer.Argument(metavar="NAME@V", help="The older version.")],
    new: Annotated[str, typer.Argument(metavar="NAME@W", help="The newer version.")],
    url: UrlOption = None,
    output: FormatOption = OutputFormat.table,
) -> None:
    """Which rollouts entered and which left between two versions, and why (a rescore
    moved a reward, a rollout recorded since, a changed selection)."""

    async def work() -> dict[str, Any]:
        from artstore.analysis.opening import open_for_reading
        from artstore.datasets import dataset_diff, read_dataset
        from artstore.datasets.selection import parse_reference

        async with await open_for_reading(url) as store:
            versions = [await read_dataset(store, *parse_reference(ref)) for ref in (old, new)]
            return await dataset_diff(store, *versions)

    changes = run(work)
    if output is OutputFormat.json:
        write_json(changes)
        return
    if output is OutputFormat.table:
        console.print(
            f"{changes['old']} -> {changes['new']}: {changes['entered']} entered, "
            f"{changes['left']} left, {changes['kept']} kept"
            + ("; the selection changed" if changes["selection_changed"] else ""),
            highlight=False,
        )
    print_rows(
        changes["rollouts"],
        output,
        columns=["change", "rollout_id", "why"],
        empty="no rollout entered or left",
    )


@app.command()
def export(
    reference: ReferenceArgument,
    format: Annotated[
        str,
        typer.Option(
            "--format",
            help="openai (chat fine-tuning JSONL), hf-sft, hf-dpo, hf-kto (Hugging Face "
            "parquet shards and a dataset card, TRL's conversational formats) or art "
            "(ART's trajectory parquet).",
        ),
    ],
    out: Annotated[
        Path,
        typer.Option("--out", metavar="PATH", help="openai: a file; the others: a new directory."),
    ],
    min_margin: Annotated[
        float,
        typer.Option(help="hf-dpo: the least reward difference between chosen and rejected."),
    ] = 0.0,
    force: Annotated[bool, typer.Option("--force", help="Overwrite what is at PATH.")] = False,
    url: UrlOption = None,
) -> None:
    """Write a dataset version in a format a trainer loads, streaming (a page of
    trajectories at a time), with progress on stderr. Only PATH is written."""

    async def work() -> Any:
        from artstore.analysis.opening import open_for_reading
        from artstore.datasets import read_dataset
        from artstore.datasets.export import export_dataset
        from artstore.datasets.selection import parse_reference

        async with await open_for_reading(url) as store:
            found = await read_dataset(store, *parse_reference(reference))
            total = len(found.rollout_ids)
            with progress(f"exporting {found.name}@{found.version}", total) as bar:
                step = _ProgressLines(bar, total)
                return await export_dataset(
                    store, found, format, out, min_margin=min_margin, force=force, on_rollouts=step
                )

    summary = run(work)
    console.print(
        f"wrote {counted(summary.rows, 'row')} from {counted(summary.rollouts, 'rollout')} "
        f"of {summary.dataset} as {summary.format} to {summary.path}",
        highlight=False,
    )
    if summary.left_out:
        err_console.print(
            f"left out: {summary.left_out} rollouts (no pair or no spread in their group)",
            highlight=False,
        )


class _ProgressLines:
    """Advances the bar (drawn on a terminal only) and, where stderr is no terminal (a log,
    a pipe), says `exported N/M rollouts` per page, as a run's export does per chunk."""

    def __init__(self, bar: Any, total: int) -> None:
        self.bar, self.total, self.done = bar, total, 0

    def __call__(self, n: int = 1) -> None:
        self.bar(n)
        self.done += n
        if not err_console.is_terminal and (self.done < self.total or n < self.total):
            err_console.print(f"exported {self.done}/{self.total} rollouts", highlight=False)
