"""What the viewer writes: a person's feedback, from the trajectory page's panel or from a
run's feedback queue (the next rollout that person has not judged, keyboard-driven).

Both forms POST to one address, `/trajectories/{id}/feedback`, and are taken only with
`--allow-feedback` and only from the viewer's own pages: the CSRF token, Origin and
Sec-Fetch-Site checks of the SQL page (sql_page.refusal). The queue page itself only
reads, so a read-only viewer shows it too, without its form.
"""

from __future__ import annotations

import getpass
from typing import Any

from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response

from artstore.analysis import runs as run_reading
from artstore.analysis import trajectories as trajectory_reading
from artstore.analysis.feedback_queue import next_to_judge
from artstore.analysis.ids import resolve_id
from artstore.errors import InvalidArgumentError
from artstore.viewer import sql_page as sql
from artstore.viewer.templating import queue_href, trajectory_href


async def feedback_post(request: Request) -> Response:
    """POST from the trajectory page's feedback panel or the queue page: record it, then
    show the trajectory again, or the queue's next rollout (the form's `queue`: its run)."""
    if not request.app.state.allow_feedback:
        return PlainTextResponse(
            "403: this viewer is read-only (start it with --allow-feedback)", 403
        )
    refused = await sql.refusal(request, "the viewer takes feedback")
    if refused is not None:
        return refused
    store, form = request.app.state.store, request.state.form
    rollout_id = await resolve_id(store, "rollout", request.path_params["rollout_id"])
    score_text = form.get("score", "").strip()
    try:
        score = float(score_text) if score_text else None
    except ValueError:
        return PlainTextResponse(f"400: the score {score_text!r} is not a number", 400)
    try:
        recorded = await store.feedback(
            rollout_id,
            score=score,
            label=form.get("label", "").strip() or None,
            comment=form.get("comment", "").strip() or None,
            name=form.get("name", "").strip() or None,
        )
    except InvalidArgumentError as exc:  # no score, label nor comment; a score of no group
        return PlainTextResponse(f"400: {exc}", 400)
    queue_run = form.get("queue")
    if queue_run:
        return RedirectResponse(queue_href(queue_run, recorded.name, rollout_id), 303)
    return RedirectResponse(trajectory_href(rollout_id) + "#feedback", status_code=303)


async def queue_page(request: Request) -> Response:
    """GET /queue?run=RUN&name=NAME&after=ID: the next rollout of RUN that NAME (by default
    the viewer's login name, as `artstore feedback`'s) has not judged, after ID."""
    store, params = request.app.state.store, request.query_params
    run = params.get("run", "")
    summary = await run_reading.run_row(store, run)  # a run not in the store: 404
    name = params.get("name", "").strip() or getpass.getuser()
    after = params.get("after") or None
    state = await next_to_judge(store, run, name, after)
    detail = None
    if state.rollout_id is not None:
        detail = await trajectory_reading.trajectory_detail(store, state.rollout_id)
    context: dict[str, Any] = {
        "run": run,
        "summary": summary,
        "name": name,
        "after": after,
        "queue": state,
        "t": detail,
        "allow_feedback": request.app.state.allow_feedback,
        "csrf_token": request.app.state.csrf_token,
    }
    templates = request.app.state.templates
    return templates.TemplateResponse(request, "queue.html", context)
