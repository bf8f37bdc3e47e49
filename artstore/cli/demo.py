"""`artstore demo`: a complete small training run, offline, recorded in the store."""

from __future__ import annotations

import os
import shlex
from pathlib import Path
from typing import Annotated, Any

import typer

from artstore.cli.output import OutputFormat, counted, print_rows
from artstore.cli.shared import UrlOption, console, err_console, run


def demo(
    url: UrlOption = None,
    workdir: Annotated[
        Path | None,
        typer.Option(
            "--workdir",
            help="Where the demo backend keeps its checkpoints (<workdir>/.art). "
            "Default: the current directory.",
            show_default=False,
        ),
    ] = None,
    epochs: Annotated[int, typer.Option(min=1, help="Passes over the scenarios.")] = 2,
    scenarios: Annotated[int, typer.Option(min=1, help="Questions to train on.")] = 4,
    batch_size: Annotated[int, typer.Option(min=1, help="Scenarios per train step.")] = 2,
    group_size: Annotated[int, typer.Option(min=1, help="Rollouts per scenario.")] = 4,
    resume: Annotated[
        str | None,
        typer.Option(
            "--resume",
            metavar="RUN",
            help="Resume a demo run that was interrupted (give the options it was started "
            "with), instead of starting a new one.",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Train a small LangGraph agent offline and record everything (a new run each time,
    unless --resume finishes an interrupted one).

    The agent answers "how many legs do N animals have?" with two tools, against a
    local inference server started here; a reward function scores it, and a CPU
    backend (CheckOnlyBackend) checks each step like ART's trainer without a GPU.
    """
    progress = _DemoProgress(resume, scenarios, group_size, epochs)

    async def work() -> tuple[Any, dict[str, Any], str]:
        import artstore
        from artstore.demo import run_demo
        from artstore.training.overview import describe_run

        # A run to resume is in a store that exists: none is created to look for it.
        async with await artstore.open_store(url, create=resume is None) as store:
            with progress.bar:
                result = await run_demo(
                    store,
                    workdir=workdir,
                    epochs=epochs,
                    batch_size=batch_size,
                    group_size=group_size,
                    num_scenarios=scenarios,
                    on_start=progress.started,
                    on_rollout=progress.rolled_out,
                    on_step=progress.stepped,
                    resume=resume,
                )
            return result, await describe_run(store, result.run), store.database.location

    try:
        result, described, where = run(work)
    except typer.Exit as stopped:
        if stopped.exit_code == 130 and progress.run is not None:  # Ctrl-C: say how to go on
            err_console.print(
                f"`artstore demo --resume {progress.run}` resumes it where it stopped",
                highlight=False,
            )
        raise
    _print_steps(result, described)
    _print_what_next(result, where, url, workdir)


class _DemoProgress:
    """Progress bars of rollouts and train steps on a terminal, a line per step elsewhere."""

    def __init__(self, resume: str | None, scenarios: int, group_size: int, epochs: int) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

        self.bar = Progress(
            TextColumn("{task.description:<10}"),
            BarColumn(),
            MofNCompleteColumn(),
            console=err_console,
            disable=not err_console.is_terminal,
        )
        self.resume = resume
        self.scenarios = scenarios
        self.group_size = group_size
        self.epochs = epochs
        self.run: str | None = None  # the run's name, once started
        self._rollouts: Any = None
        self._steps: Any = None

    def started(self, name: str, rollouts: int, steps: int) -> None:
        err_console.print(
            f"{'resuming ' if self.resume else ''}demo run [bold]{name}[/]: "
            f"{self.scenarios} questions × {self.group_size} rollouts, "
            f"{self.epochs} epochs, {steps} train steps",
            highlight=False,
        )
        self.run = name
        self._rollouts = self.bar.add_task("rollouts", total=rollouts)
        self._steps = self.bar.add_task("steps", total=steps)

    def rolled_out(self) -> None:
        self.bar.advance(self._rollouts)

    def stepped(self, step: int) -> None:
        self.bar.advance(self._steps)
        if self.bar.disable:
            err_console.print(f"  trained step {step}", highlight=False)


def _print_steps(result: Any, described: dict[str, Any]) -> None:
    """The run's train steps as a table (and why nothing ran when it was finished already)."""
    if result.already_finished:
        trained = sum(
            1
            for step in described["steps"]
            if step["model"] == result.model and step["status"] == "completed"
        )
        err_console.print(
            f"demo run [bold]{result.run}[/] is already finished "
            f"({counted(trained, 'train step')} completed): nothing to resume",
            highlight=False,
        )
    print_rows(
        [
            {
                # Replays train other models on the run's groups: say whose step it is.
                "model": step["model"],
                "step": step["step"],
                "batch": step["batches"],
                "groups": step["groups"],
                "reward_mean": step["reward_mean"],
                "trainable_groups": step["metrics"].get("num_groups_trainable"),
                "status": step["status"],
            }
            for step in described["steps"]
        ],
        OutputFormat.table,
        title=f"train steps of {result.run}",
        headers={"reward_mean": "reward mean", "trainable_groups": "groups with reward spread"},
    )
    console.print(
        "\nThe demo trains with CheckOnlyBackend, which runs on the CPU and updates no "
        "weights: the policy does not learn, and the reward does not rise from step to step "
        "(the demo's model slips at random). The recording is what the demo shows; "
        "LocalBackend on a GPU trains the same loop for real.",
        highlight=False,
    )


def _print_what_next(result: Any, where: str, url: str | None, workdir: Path | None) -> None:
    """Where the run is recorded, and the commands to try on it next."""
    from artstore.urls import redact  # SQLAlchemy: not for `artstore --help`

    name = result.run
    url_part = ""
    if url and url == os.environ.get("ARTSTORE_URL"):
        pass  # the commands below read the same variable: no need to repeat it
    elif url:  # a password stays out of the output: point at the variable instead
        url_part = f" --url {shlex.quote(url)}" if redact(url) == url else ' --url "$ARTSTORE_URL"'
    console.print(
        f"\nRecorded run [bold]{name}[/] (model {result.model}) in {where}; "
        f"checkpoints under {result.art_path}.",
        highlight=False,
    )
    console.print("\nTry next:", highlight=False)
    for what, command in _next_commands(name, url_part, workdir):
        console.print(f"  # {what}\n  {command}", highlight=False, markup=False, soft_wrap=True)
    console.print(
        f"\nOr look at it in a web browser (Ctrl-C stops it): artstore ui{url_part}",
        highlight=False,
        markup=False,
        soft_wrap=True,
    )


def _next_commands(name: str, url_part: str, workdir: Path | None) -> list[tuple[str, str]]:
    """(what it shows, the command) for each command worth trying on the demo's run."""
    from artstore.urls import resolve_url  # SQLAlchemy: not for `artstore --help`

    elsewhere = workdir is not None and Path(workdir).absolute() != Path.cwd()

    def backend_hint(command: str) -> str:
        """A command that uses check_only_backend, which keeps its state under ./.art."""
        if not elsewhere:
            return f"{command}{url_part}"
        store = url_part or f" --url {shlex.quote(str(resolve_url(None).database))}"
        return f"(cd {shlex.quote(str(workdir))} && {command}{store})"

    query = (
        "SELECT model, step, reward_mean, num_groups, duration_s FROM v_train_steps "
        f"WHERE run = '{name}' ORDER BY model, step"
    )
    return [
        ("the runs in this store", f"artstore runs{url_part}"),
        ("this run: steps, groups, rewards, failures", f"artstore show {name}{url_part}"),
        (
            "score it again with a stricter reward (no agent runs)",
            f"artstore rescore {name} --reward artstore.demo:strict_reward --scorer strict"
            f"{url_part}",
        ),
        (
            "what training a second model on the new scores would do (nothing is trained)",
            f"artstore replay {name} --scorer strict --model {name}-strict --dry-run{url_part}",
        ),
        (
            "train a second model on the new scores",
            backend_hint(
                f"artstore replay {name} --scorer strict --model {name}-strict "
                "--backend artstore.backends:check_only_backend"
            ),
        ),
        ("ask SQL", f'artstore sql{url_part} "{query}"'),
    ]
