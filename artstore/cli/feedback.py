"""`artstore feedback ROLLOUT`: a person's judgement of a rollout, a reward by `human:NAME`."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from artstore.cli.output import FormatOption, OutputFormat, write_json
from artstore.cli.shared import UrlOption, console, run


def feedback(
    rollout_id: Annotated[
        str, typer.Argument(metavar="ROLLOUT", help="The rollout's id, or its first characters.")
    ],
    score: Annotated[
        float | None,
        typer.Option(help="A reward of the rollout by the scorer human:NAME.", show_default=False),
    ] = None,
    label: Annotated[
        str | None, typer.Option(help="A short label, e.g. wrong-tool.", show_default=False)
    ] = None,
    comment: Annotated[str | None, typer.Option(help="Free text.", show_default=False)] = None,
    name: Annotated[
        str | None,
        typer.Option(help="Who judges (default: your login name).", show_default=False),
    ] = None,
    call: Annotated[
        int | None,
        typer.Option(
            "--call",
            min=0,
            metavar="INDEX",
            help="Judge the rollout's LLM call INDEX (0 first) instead of the whole rollout.",
            show_default=False,
        ),
    ] = None,
    url: UrlOption = None,
    output: FormatOption = OutputFormat.table,
) -> None:
    """Record a judgement of a rollout: a score, a label, a comment.

    A score of the whole rollout is a reward by the scorer human:NAME, which replay
    --scorer, datasets and the views use like any other. Feedback is never changed: a
    second one is recorded beside the first, and the latest score counts.
    """

    async def work() -> dict[str, Any]:
        import artstore
        from artstore.analysis.ids import resolve_id

        async with await artstore.open_store(url, create=False) as store:
            full_id = await resolve_id(store, "rollout", rollout_id)
            event = await store.feedback(
                full_id, score=score, label=label, comment=comment, name=name, call_index=call
            )
        return {"rollout_id": full_id, "scorer": f"human:{event.name}", **event.model_dump()}

    recorded = run(work)
    if output is OutputFormat.table:
        what = (
            "call {call_index} of ".format(**recorded) if recorded["call_index"] is not None else ""
        )
        console.print(
            f"recorded feedback by {recorded['scorer']} on {what}rollout {recorded['rollout_id']}",
            highlight=False,
            soft_wrap=True,
        )
    else:
        write_json(recorded)
