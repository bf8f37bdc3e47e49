"""The SQL page: who may run a query through it, and within what.

A query runs only as a POST from the viewer's own page. A web page of another site can
make the browser send a GET (`<img src=...>`) or a POST (a form) to the viewer, but it
cannot read the viewer's pages, so it cannot know the CSRF token that the form carries;
and the browser says where a request comes from (`Origin`, `Sec-Fetch-Site`), which must
be the viewer itself. A GET only fills the form.

A query then runs on the path of `artstore sql` (confined by the database), within
bounds of its own: a deadline for the whole query, at most ROW_LIMIT rows shown and
BOUNDS in bytes; and it stops when the browser goes away (the query task is cancelled,
and with it the database's work) or the viewer stops (server.py cancels every query).
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs

from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response

from artstore.analysis import stream_query
from artstore.analysis.bounded import Bounds, MiB
from artstore.errors import QueryError, QueryRefusedError, ResultTooLargeError

TIMEOUT_S = 30.0
# The page shows at most this many rows, and says when there were more.
ROW_LIMIT = 1000
# What one fetch of the page's query may hold: the rows shown, and one to tell "more".
BOUNDS = Bounds(batch_rows=ROW_LIMIT + 1, batch_bytes=8 * MiB)
# The form's body: a statement and a token.
FORM_BYTES = 1 * MiB

EXAMPLES = (
    "SELECT run, status, num_rollouts, num_failed, last_step, total_tokens FROM v_runs",
    "SELECT run, model, step, status, reward_mean, duration_s FROM v_train_steps ORDER BY id",
    "SELECT rollout_id, run, policy_step, reward, total_tokens, duration_s FROM v_rollouts "
    "ORDER BY duration_s DESC LIMIT 20",
    "SELECT tool_name, count(*) AS calls, avg(tool_time_s) AS mean_time_s FROM v_tool_calls "
    "GROUP BY tool_name ORDER BY calls DESC",
)
# Columns of a query's result that the SQL page turns into links.
LINKED_COLUMNS = ("run", "group_id", "rollout_id")


@dataclass
class SqlResult:
    columns: list[str] = field(default_factory=list)
    rows: list[tuple[Any, ...]] = field(default_factory=list)
    more: bool = False  # more rows than shown
    error: str | None = None  # why the query failed, or stopped after the rows shown


async def refusal(request: Request, what: str = "the SQL page runs queries") -> Response | None:
    """A 403 unless the POST comes from the viewer's own page with its CSRF token (the
    form is then in `request.state.form`, its statement in `request.state.sql_statement`);
    nothing runs either way. `what`: who refuses, in the 403's words."""
    if not _same_origin(request):
        return _forbidden(what, "the request comes from another site")
    form = await _form(request)
    if form is None:
        return PlainTextResponse("413: the form is larger than the viewer takes", 413)
    token = form.get("csrf_token", "").encode()
    if not secrets.compare_digest(token, request.app.state.csrf_token.encode()):
        return _forbidden(what, "the form does not carry this viewer's token (reload the page)")
    request.state.form = form
    request.state.sql_statement = form.get("q", "").strip()
    return None


def _same_origin(request: Request) -> bool:
    """Whether the browser says the request comes from the viewer's own pages. A client
    that is no browser says nothing (and must still know the form's token)."""
    site = request.headers.get("sec-fetch-site")
    if site is not None and site not in ("same-origin", "none"):  # none: typed by the user
        return False
    origin = request.headers.get("origin")
    own = f"{request.url.scheme}://{request.headers.get('host', '')}".lower()
    return origin is None or origin.lower() == own


def _forbidden(what: str, why: str) -> Response:
    return PlainTextResponse(f"403: {what} from itself only: {why}", 403)


async def _form(request: Request) -> dict[str, str] | None:
    """The url-encoded form of a POST (its last value per name); None past FORM_BYTES."""
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > FORM_BYTES:
            return None
    fields = parse_qs(body.decode("utf-8", "replace"), keep_blank_values=True, max_num_fields=8)
    return {name: values[-1] for name, values in fields.items()}


async def run_for(request: Request, statement: str) -> SqlResult:
    """Run `statement` for this request: stopped if the browser goes away first."""
    if not statement:
        return SqlResult(error="the query is empty: give one SELECT statement")
    app = request.app
    running = asyncio.create_task(_rows(app.state.store, statement, app.state.sql_timeout))
    app.state.queries.add(running)
    running.add_done_callback(app.state.queries.discard)
    gone = asyncio.create_task(_disconnected(request))
    try:
        await asyncio.wait({running, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        running.cancel()  # done already, unless the browser went away or we were cancelled
    try:
        return await running
    except asyncio.CancelledError:
        if asyncio.current_task().cancelling():  # type: ignore[union-attr]
            raise  # this request itself is stopped
        return SqlResult(error="stopped: the browser went away, or the viewer is stopping")


async def _disconnected(request: Request) -> None:
    """Returns when the browser goes away (the form's body is read already)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _rows(store: Any, statement: str, timeout: float | None) -> SqlResult:
    result = SqlResult()
    try:
        async with stream_query(store, statement, timeout=timeout, bounds=BOUNDS) as found:
            result.columns = found.columns
            async with contextlib.aclosing(found.batches()) as batches:
                async for batch in batches:
                    result.rows.extend(batch)
                    if len(result.rows) > ROW_LIMIT:
                        break  # the query stops here (its cursor is closed)
    except ResultTooLargeError as exc:
        result.error = str(exc)  # the rows before are shown
    except (QueryError, QueryRefusedError) as exc:
        return SqlResult(error=str(exc))
    result.more = len(result.rows) > ROW_LIMIT
    del result.rows[ROW_LIMIT:]
    return result
