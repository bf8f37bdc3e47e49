"""`artstore replay`: train a model on the stored groups of a run it has not consumed."""

from __future__ import annotations

import math
import sys
from contextlib import redirect_stdout
from dataclasses import dataclass
from typing import Annotated, Any

import typer

from artstore.cli.output import FormatOption, OutputFormat, counted, print_rows, progress
from artstore.cli.plugins import (
    PluginError,
    find_backend,
    make_backend,
)
from artstore.cli.shared import UrlOption, UsageError, console, fail, run

RunArgument = Annotated[str, typer.Argument(metavar="RUN", help="The run (see `artstore runs`).")]


BackendOption = Annotated[
    str | None,
    typer.Option(
        "--backend",
        metavar="MODULE:NAME",
        help="A callable returning an art.Backend, or an art.Backend instance, e.g. "
        "artstore.backends:check_only_backend. Needed unless --dry-run.",
        show_default=False,
    ),
]
ScorerOption = Annotated[
    str | None,
    typer.Option(
        metavar="NAME", help="Train on the rewards of this scorer. Default: the run's scorer."
    ),
]
ModelOption = Annotated[
    str | None,
    typer.Option(metavar="NAME", help="Name of the model to train. Default: the run's own model."),
]
ProjectOption = Annotated[
    str | None,
    typer.Option(metavar="NAME", help="Project of the model. Default: the run's project."),
]
BaseModelOption = Annotated[
    str | None,
    typer.Option(
        "--base-model",
        metavar="NAME",
        help="Base model of the model (to train a run that names none). Default: the run's.",
    ),
]
DryRunOption = Annotated[
    bool,
    typer.Option(
        "--dry-run",
        help="Print what would be trained (groups, rewards, advantages, "
        "staleness per step); train and record nothing.",
    ),
]
MaxStalenessOption = Annotated[
    int | None,
    typer.Option(
        "--max-staleness",
        min=0,
        metavar="N",
        help="Skip groups generated more than N steps before the step that would train them.",
    ),
]
GroupsPerStepOption = Annotated[
    int | None,
    typer.Option(
        "--groups-per-step",
        min=1,
        metavar="N",
        help="Groups per train step. Default: the run's batches, as it trained them.",
    ),
]
LearningRateOption = Annotated[
    float | None,
    typer.Option(
        "--learning-rate", metavar="LR", help="Passed to backend.train. Default: the run's."
    ),
]


@dataclass
class _Replay:
    """What `artstore replay` was asked to do, as its options say it."""

    run_name: str
    backend: str | None
    scorer: str | None
    model: str | None
    project: str | None
    base_model: str | None
    dry_run: bool
    max_staleness: int | None
    groups_per_step: int | None
    learning_rate: float | None
    url: str | None


def replay(
    run_name: RunArgument,
    backend: BackendOption = None,
    scorer: ScorerOption = None,
    model: ModelOption = None,
    project: ProjectOption = None,
    base_model: BaseModelOption = None,
    dry_run: DryRunOption = False,
    max_staleness: MaxStalenessOption = None,
    groups_per_step: GroupsPerStepOption = None,
    learning_rate: LearningRateOption = None,
    url: UrlOption = None,
    output: FormatOption = OutputFormat.table,
) -> None:
    """Train a model on the groups of RUN it has not consumed yet.

    Consumption is recorded per trained model: groups that trained the run's model can
    train another one (--model), on another scorer's rewards (--scorer, after `artstore
    rescore`). Without --model this finishes a run whose trainer stopped.
    """
    if learning_rate is not None and not (math.isfinite(learning_rate) and learning_rate > 0):
        raise fail(f"--learning-rate must be a positive number, not {learning_rate}")
    if backend is None and not dry_run:
        raise fail(
            "--backend is needed to train (e.g. --backend artstore.backends:check_only_backend); "
            "add --dry-run to only see the plan"
        )
    asked = _Replay(
        run_name=run_name,
        backend=backend,
        scorer=scorer,
        model=model,
        project=project,
        base_model=base_model,
        dry_run=dry_run,
        max_staleness=max_staleness,
        groups_per_step=groups_per_step,
        learning_rate=learning_rate,
        url=url,
    )
    plan = run(lambda: _replay(asked))
    _print_plan(plan, output, planned_only=dry_run)


async def _replay(asked: _Replay) -> Any:
    """The plan of the replay (`--dry-run`), or the replay done."""
    import artstore
    from artstore.training.runs import run_info

    found = find_backend(asked.backend) if asked.backend is not None else None
    # A plan only reads; training needs a store that exists (nothing is created).
    opened = (
        artstore.open_store(asked.url, read_only=True)
        if asked.dry_run
        else artstore.open_store(asked.url, create=False)
    )
    async with await opened as store:
        info = await run_info(store, asked.run_name)
        trainable = _trainable_model(
            info, asked.model, asked.project, asked.base_model, dry_run=asked.dry_run
        )
        loaded = await make_backend(found, asked.backend) if asked.backend is not None else None
        if loaded is not None and not asked.dry_run:
            await _register(trainable, loaded, asked.backend)
        try:
            return await _replay_on(store, info, trainable, loaded, asked)
        finally:
            if loaded is not None:
                await loaded.close()


async def _register(trainable: Any, loaded: Any, backend: str | None) -> None:
    """`trainable` registered with the backend (which is closed if that fails)."""
    try:
        await trainable.register(loaded)
    except Exception as exc:
        await loaded.close()
        raise PluginError(
            f"--backend {backend!r}: registering {trainable.project}/"
            f"{trainable.name} failed: {type(exc).__name__}: {exc}"
        ) from exc


async def _replay_on(store: Any, info: Any, trainable: Any, loaded: Any, asked: _Replay) -> Any:
    from artstore.training.replay import replay

    train_kwargs = dict((info.config or {}).get("train_kwargs") or {})
    if asked.learning_rate is not None:
        train_kwargs["learning_rate"] = asked.learning_rate
    options: dict[str, Any] = {
        "scorer": asked.scorer,
        "max_staleness": asked.max_staleness,
        "groups_per_step": asked.groups_per_step,
        "train_kwargs": train_kwargs,
    }
    if asked.dry_run:
        # Nothing is registered (a real backend would start its servers): the
        # step is the backend's record of it, or else the store's.
        options["model_step"] = await _model_step(store, trainable, loaded, asked.backend)
        return await replay(store, asked.run_name, trainable, dry_run=True, **options)
    # What the backend or ART prints goes to stderr: stdout holds the rows.
    with progress("training", None) as advance, redirect_stdout(sys.stderr):
        return await replay(
            store,
            asked.run_name,
            trainable,
            on_plan=lambda p: advance.total(len(p.steps)),
            on_step=lambda done, total: advance(),
            **options,
        )


def _print_plan(plan: Any, output: OutputFormat, *, planned_only: bool) -> None:
    rows = plan_rows(plan, trained=not planned_only)
    if output is OutputFormat.table:
        console.print(_headline(plan, planned_only), highlight=False, soft_wrap=True)
    print_rows(
        rows,
        output,
        columns=[
            "train_step",
            "group",
            "batch",
            "scenario_index",
            "policy_step",
            "staleness",
            "rewards",
            "advantages",
            "status",
        ],
        headers={"train_step": "step", "scenario_index": "scenario", "policy_step": "policy step"},
        empty="no group to train",
    )
    if output is OutputFormat.table and not planned_only and plan.trained_steps:
        console.print(
            f"{plan.model} is at step {plan.trained_steps[-1]} "
            f"(trained {counted(len(plan.trained_steps), 'step')} on "
            f"{counted(len(plan.groups), 'group')})",
            highlight=False,
            soft_wrap=True,
        )


async def _model_step(store: Any, trainable: Any, loaded: Any, spec: str | None) -> int:
    from artstore.art_versions import model_key
    from artstore.training.replay import stored_model_step

    if loaded is None:
        return await stored_model_step(store, model_key(trainable))
    try:
        return int(await loaded._get_step(trainable))
    except Exception as exc:
        raise PluginError(
            f"--backend {spec!r}: reading the step of {model_key(trainable)} "
            f"failed: {type(exc).__name__}: {exc}"
        ) from exc


def _trainable_model(
    info: Any, name: str | None, project: str | None, base_model: str | None, *, dry_run: bool
) -> Any:
    from artstore.art_api import model_class, trainable_model_class

    base = base_model or info.base_model
    name = name or info.model
    if not base:
        if dry_run:  # a plan trains nothing: the model's name is all it needs
            return model_class()(name=name, project=project or info.project)
        raise UsageError(f"run {info.run!r} names no base model: give --base-model")
    return trainable_model_class()(
        name=name, run_name=name, project=project or info.project, base_model=base
    )


def plan_rows(plan: Any, *, trained: bool) -> list[dict[str, Any]]:
    """One row per group of the plan: trained or planned, skipped as stale, or unscored."""
    rows = []
    for group in plan.groups:
        rows.append(
            {
                **_group_row(plan, group),
                "train_step": plan.model_step + group.step + 1,
                "status": "trained" if trained else "planned",
            }
        )
    for group in plan.skipped_stale:
        rows.append({**_group_row(plan, group), "train_step": None, "status": "skipped: stale"})
    for group_id in plan.unscored:
        rows.append(
            {
                "group": group_id[:8],
                "group_id": group_id,
                "model": plan.model,
                "scorer": plan.scorer,
                "train_step": None,
                "status": f"skipped: no {plan.scorer!r} rewards",
            }
        )
    return rows


def _group_row(plan: Any, group: Any) -> dict[str, Any]:
    return {
        "group": group.group_id[:8],
        "group_id": group.group_id,
        "model": plan.model,
        "scorer": plan.scorer,
        "batch": group.batch,
        "scenario_index": group.scenario_index,
        "policy_step": group.policy_step,
        "staleness": group.staleness,
        "rewards": group.rewards,
        "advantages": group.advantages,
    }


def _headline(plan: Any, planned_only: bool) -> str:
    steps, groups = len(plan.steps), len(plan.groups)
    verb = "would train" if planned_only else "trained"
    parts = [
        f"run {plan.run} → {plan.model} (at step {plan.model_step}), scorer {plan.scorer!r}: "
        f"{verb} {counted(groups, 'group')} in {counted(steps, 'step')}"
    ]
    if plan.consumed:
        parts.append(f"{plan.consumed} consumed before")
    if plan.skipped_stale:
        parts.append(f"{len(plan.skipped_stale)} too stale")
    if plan.unscored:
        parts.append(f"{len(plan.unscored)} without {plan.scorer!r} rewards")
    if planned_only:
        parts.append("dry run: nothing trained or recorded")
    return "; ".join(parts)
