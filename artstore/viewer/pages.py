"""The viewer's pages and the JSON the live pages fetch. Each reads through
`artstore.analysis` (the SQL views and the projected trajectories) and renders a template."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse as _JSONResponse
from starlette.responses import RedirectResponse, Response

from artstore.analysis import groups as group_reading
from artstore.analysis import runs as run_reading
from artstore.analysis import trajectories as trajectory_reading
from artstore.analysis.ids import resolve_id
from artstore.viewer import sql_page as sql
from artstore.viewer.templating import dumps, group_href, trajectory_href

# How often the live pages ask for news, in milliseconds.
RUNS_REFRESH_MS = 2000
RUN_REFRESH_MS = 3000
SQL_TIMEOUT_S = sql.TIMEOUT_S


class JSONResponse(_JSONResponse):
    """JSON with the store's values as they are (PostgreSQL's Decimals as numbers)."""

    def render(self, content: Any) -> bytes:
        # A lone surrogate (which UTF-8 cannot hold) only in a string: written as its escape.
        return dumps(content, ensure_ascii=False, allow_nan=False).encode(
            "utf-8", "backslashreplace"
        )


def _store(request: Request) -> Any:
    return request.app.state.store


def _render(
    request: Request, name: str, context: dict[str, Any], status_code: int = 200
) -> Response:
    templates = request.app.state.templates
    return templates.TemplateResponse(request, name, context, status_code=status_code)


async def runs_page(request: Request) -> Response:
    runs = await run_reading.runs_table(_store(request))
    return _render(
        request, "runs.html", {"runs": runs, "refresh_ms": request.app.state.runs_refresh_ms}
    )


async def runs_json(request: Request) -> Response:
    return JSONResponse(await run_reading.runs_table(_store(request)))


async def run_charts(store: Any, run: str) -> dict[str, Any]:
    """What the run page draws, and refreshes while the run trains."""
    summary = await run_reading.run_row(store, run)
    steps = await run_reading.train_steps(store, run)
    return {
        "summary": summary,
        "curve": await run_reading.reward_curve(store, run),
        "metrics": await run_reading.step_metrics(store, run),
        "usage": await run_reading.usage_per_step(store, run),
        "train_durations": [
            {"model": s["model"], "step": s["step"], "duration_s": s["duration_s"]}
            for s in steps
            if s["status"] == "completed"
        ],
    }


async def run_page(request: Request) -> Response:
    store, run = _store(request), request.path_params["run"]
    charts = await run_charts(store, run)
    context = {
        "run": run,
        "summary": charts["summary"],
        "charts": charts,
        "steps": await run_reading.train_steps(store, run),
        "groups": await run_reading.groups(store, run),
        "scorers": await run_reading.scorers(store, run),
        "consumption": await run_reading.consumption(store, run),
        "failures": await run_reading.failures(store, run),
        "other_runs": [name for name in await run_reading.run_names(store) if name != run],
        "refresh_ms": request.app.state.run_refresh_ms,
        "allow_feedback": request.app.state.allow_feedback,
    }
    return _render(request, "run.html", context)


async def run_json(request: Request) -> Response:
    return JSONResponse(await run_charts(_store(request), request.path_params["run"]))


async def group_page(request: Request) -> Response:
    store, given = _store(request), request.path_params["group_id"]
    group_id = await resolve_id(store, "group", given)
    if group_id != given:
        return RedirectResponse(group_href(group_id), status_code=302)
    group = await group_reading.group_detail(store, group_id)
    return _render(request, "group.html", {"group": group})


async def trajectory_page(request: Request) -> Response:
    store, given = _store(request), request.path_params["rollout_id"]
    rollout_id = await resolve_id(store, "rollout", given)
    if rollout_id != given:
        return RedirectResponse(trajectory_href(rollout_id), status_code=302)
    detail = await trajectory_reading.trajectory_detail(store, rollout_id)
    context = {
        "t": detail,
        "rollout_id": rollout_id,
        "allow_feedback": request.app.state.allow_feedback,
        "csrf_token": request.app.state.csrf_token,
    }
    return _render(request, "trajectory.html", context)


async def compare_scorers_page(request: Request) -> Response:
    store = _store(request)
    run = request.query_params.get("run", "")
    summary = await run_reading.run_row(store, run)
    names = await run_reading.scorers(store, run)
    x = request.query_params.get("x") or (names[0] if names else "")
    y = request.query_params.get("y") or (names[1] if len(names) > 1 else x)
    pairs = await run_reading.scorer_pairs(store, run, x, y) if x and y else []
    context = {
        "run": run,
        "summary": summary,
        "scorers": names,
        "x": x,
        "y": y,
        "pairs": pairs,
        "correlation": run_reading.correlation(pairs),
    }
    return _render(request, "compare_scorers.html", context)


async def compare_runs_page(request: Request) -> Response:
    store = _store(request)
    names = await run_reading.run_names(store)
    a = request.query_params.get("a") or (names[0] if names else "")
    b = request.query_params.get("b") or (names[1] if len(names) > 1 else a)
    compared = []
    for name in dict.fromkeys(n for n in (a, b) if n):
        summary = await run_reading.run_row(store, name)
        curve = await run_reading.reward_curve(store, name)
        compared.append(
            {
                "run": name,
                "scorer": summary["scorer"],
                "summary": summary,
                "points": curve.get(summary["scorer"], []),
            }
        )
    return _render(
        request, "compare_runs.html", {"names": names, "a": a, "b": b, "compared": compared}
    )


async def sql_page(request: Request) -> Response:
    """GET: the form (a statement given as `?q=` fills it; nothing runs). POST: run the
    form's statement, if it comes from this page (see artstore/viewer/sql_page.py)."""
    context: dict[str, Any] = {
        "statement": request.query_params.get("q", "").strip(),
        "examples": sql.EXAMPLES,
        "csrf_token": request.app.state.csrf_token,
        "linked": sql.LINKED_COLUMNS,
        "limit": sql.ROW_LIMIT,
        "result": None,
    }
    if request.method != "POST":
        return _render(request, "sql.html", context)
    refused = await sql.refusal(request)
    if refused is not None:
        return refused
    context["statement"] = request.state.sql_statement
    result = await sql.run_for(request, context["statement"])
    context["result"] = result
    status = 400 if result.error and not result.rows else 200
    return _render(request, "sql.html", context, status_code=status)
