"""`artstore worker`: roll out a run's groups for its trainer, from any host."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from typing import Annotated, Any

import typer

from artstore.cli.plugins import load_attribute, load_reward_function
from artstore.cli.shared import UrlOption, UsageError, console, err_console, run
from artstore.errors import ArtstoreError, ConfigurationError

RunArgument = Annotated[
    str, typer.Argument(metavar="RUN", help="The run its trainer trains from workers.")
]
KEY_ENV = "ARTSTORE_INFERENCE_API_KEY"
VALIDATION_KEY_ENV = "ARTSTORE_VALIDATION_API_KEY"
BASE_URL_ENV = "ARTSTORE_INFERENCE_BASE_URL"
SERVER_TOKEN_ENV = "ARTSTORE_SERVER_TOKEN"


AgentOption = Annotated[
    str,
    typer.Option(
        "--agent",
        metavar="MODULE:FUNCTION",
        help="The agent, agent(scenario, rollout_id) -> result, as TrainingFramework takes it.",
        show_default=False,
    ),
]
RewardOption = Annotated[
    str | None,
    typer.Option(
        "--reward",
        metavar="MODULE:FUNCTION",
        help="The reward function. Default: the one the trainer registered.",
        show_default=False,
    ),
]
ConcurrencyOption = Annotated[
    int,
    typer.Option("--concurrency", min=1, metavar="N", help="Rollouts and seals run at once."),
]
LeaseOption = Annotated[
    float,
    typer.Option(
        "--lease",
        min=0.1,
        metavar="SECONDS",
        help="Seconds a claim lasts without a heartbeat; another worker redoes the "
        "work of a worker silent for longer.",
    ),
]
InferenceUrlOption = Annotated[
    str | None,
    typer.Option(
        "--inference-url",
        envvar=BASE_URL_ENV,
        metavar="URL",
        help="The inference server as this host reaches it. Default: the URL the "
        "trainer registered.",
        show_default=False,
    ),
]
WaitOption = Annotated[
    float,
    typer.Option(
        "--wait",
        min=0,
        metavar="SECONDS",
        help="Seconds to wait for the run's trainer to register.",
    ),
]


ServerOption = Annotated[
    str | None,
    typer.Option(
        "--server",
        metavar="URL",
        help="An artstore serve to work through (claims, leases, recording) instead of a "
        "database: this worker then needs no database URL.",
        show_default=False,
    ),
]
TokenOption = Annotated[
    str | None,
    typer.Option(
        "--token",
        envvar=SERVER_TOKEN_ENV,
        metavar="TOKEN",
        help="A write token of the run, for --server.",
        show_default=False,
    ),
]


def worker(
    run_name: RunArgument,
    agent: AgentOption,
    reward: RewardOption = None,
    concurrency: ConcurrencyOption = 4,
    lease: LeaseOption = 30.0,
    inference_url: InferenceUrlOption = None,
    wait: WaitOption = 60.0,
    url: UrlOption = None,
    server: ServerOption = None,
    token: TokenOption = None,
) -> None:
    """Claim rollouts of RUN from PostgreSQL, run the agent, record them, seal groups.

    Start as many workers as you like, on any hosts, whenever you like (Ray, Kubernetes,
    Slurm, SkyPilot: any scheduler that starts a process). A worker exits when the run's
    trainer finishes. The inference API key is taken from $ARTSTORE_INFERENCE_API_KEY
    ($ARTSTORE_VALIDATION_API_KEY for a validation model): keys are never stored.
    With --server URL, the worker claims and records through an `artstore serve` and
    holds no database credentials; its agent calls the proxy (docs/workers.md).
    """
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    options = {
        "concurrency": concurrency,
        "lease_s": lease,
        "inference_base_url": inference_url,
        "wait_for_run_s": wait,
    }
    if server is not None:
        if url:
            raise UsageError("give --server or a database URL, not both")
        if inference_url:
            raise UsageError("--inference-url is the server's upstream with --server")
        del options["inference_base_url"]
        summary = run(lambda: _work_through(server, token, run_name, agent, reward, options))
    else:
        summary = run(lambda: _work(run_name, agent, reward, url, options))
    console.print(
        f"run {run_name} ({summary.run_status}): {summary.rollouts_finished} rollouts finished, "
        f"{summary.rollouts_failed} failed, {summary.groups_sealed} groups sealed, "
        f"{summary.abandoned} abandoned rollouts redone, {summary.leases_lost} leases lost, "
        f"{summary.released} claims given back",
        highlight=False,
        soft_wrap=True,
    )
    if summary.run_status == "failed":
        raise typer.Exit(1)


def _agent_function(agent: str) -> Any:
    """The agent `--agent` names: a function, not a class or another object."""
    agent_function = load_attribute(agent, "--agent")
    if isinstance(agent_function, type) or not callable(agent_function):
        raise UsageError(
            f"--agent {agent!r} is a {type(agent_function).__name__}, not an agent "
            "function agent(scenario, rollout_id)"
        )
    return agent_function


async def _work(
    run_name: str, agent: str, reward: str | None, url: str | None, options: dict[str, Any]
) -> Any:
    """The worker run until its run's trainer finishes (or SIGTERM / SIGINT stops it)."""
    import artstore
    from artstore.workers import run_worker

    agent_function = _agent_function(agent)
    reward_function = load_reward_function(reward) if reward else None
    if not _serves_many_machines(url):  # before anything is opened or created
        raise ConfigurationError(
            "rollout workers need PostgreSQL (give --url postgresql://... or set "
            "$ARTSTORE_URL): workers on many hosts coordinate through its row locks and "
            "notifications; SQLite serves one machine"
        )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    async with await artstore.open_store(url) as store:
        err_console.print(
            f"worker on run {run_name} at {store.database.display_url}, "
            f"concurrency {options['concurrency']}",
            highlight=False,
            soft_wrap=True,
        )
        return await run_worker(
            store,
            run_name,
            agent_function,
            reward_function,
            api_key=os.environ.get(KEY_ENV),
            validation_api_key=os.environ.get(VALIDATION_KEY_ENV),
            stop=stop,
            **options,
        )


async def _work_through(
    server: str,
    token: str | None,
    run_name: str,
    agent: str,
    reward: str | None,
    options: dict[str, Any],
) -> Any:
    """The worker through `artstore serve` at `server`, until the run's trainer finishes."""
    from artstore.serve.remote_worker import run_remote_worker

    agent_function = _agent_function(agent)
    reward_function = load_reward_function(reward) if reward else None
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    err_console.print(
        f"worker on run {run_name} through {server}, concurrency {options['concurrency']}",
        highlight=False,
        soft_wrap=True,
    )
    return await run_remote_worker(
        server, token, run_name, agent_function, reward_function, stop=stop, **options
    )


def _serves_many_machines(url: str | None) -> bool:
    """Whether `url` names a database that workers on many hosts can share (nothing is
    opened or created to tell)."""
    from artstore.eventstore.database import database_class
    from artstore.urls import resolve_url

    if not url:
        return False
    try:
        return database_class(resolve_url(url, create_folder=False)).many_machines
    except ArtstoreError:
        return False  # not a URL of a database artstore runs on: said as for SQLite
