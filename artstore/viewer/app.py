"""The viewer's ASGI application: routes, the store it reads, and what every answer carries.

Who gets in: the viewer answers only to the host names of the address it is bound to
(`HostCheck`: a page elsewhere that points its own name at this machine, DNS rebinding,
gets 400); bound beyond loopback, only to requests that carry the token `artstore ui`
printed (`AccessToken`). What runs a query: a POST from the viewer's own SQL page only
(pages.sql_page: its CSRF token, Origin and Sec-Fetch-Site). What writes: feedback, only
with `--allow-feedback`, under the same checks (feedback_pages.feedback_post).
"""

from __future__ import annotations

import contextlib
import logging
import secrets
from collections.abc import AsyncIterator
from importlib.resources import files
from typing import Any

from sqlalchemy.exc import SQLAlchemyError
from starlette.applications import Starlette
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from artstore.analysis.opening import open_for_reading
from artstore.errors import ArtstoreError, NotFoundError
from artstore.store import open_store
from artstore.viewer import feedback_pages, pages
from artstore.viewer.templating import environment

log = logging.getLogger("artstore.viewer")

LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")

# Scripts, styles, images and fetches from the viewer itself only: even if some text of a
# model slipped through as markup, no script of it would run.
SECURITY_HEADERS = {
    "content-security-policy": "default-src 'none'; script-src 'self'; style-src 'self'; "
    "img-src 'self' data:; connect-src 'self'; form-action 'self'; base-uri 'none'; "
    "frame-ancestors 'none'",
    "x-content-type-options": "nosniff",
    # Nothing to other sites; to the viewer itself, its own origin (with no-referrer, a
    # browser sends a form's POST as from `Origin: null`, which the SQL page refuses).
    "referrer-policy": "same-origin",
    "x-frame-options": "DENY",
    "cache-control": "no-store",
}


class SecurityHeaders:
    """Adds SECURITY_HEADERS to every response."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                present = {name.lower() for name, _ in headers}
                for name, value in SECURITY_HEADERS.items():
                    if name.encode() not in present:
                        headers.append((name.encode(), value.encode()))
                message["headers"] = headers
            await send(message)

        await self.app(scope, receive, send_with_headers)


def allowed_hosts(bound_to: str) -> list[str]:
    """The Host headers to answer: the loopback names when bound to loopback (a web page
    elsewhere cannot reach the viewer through DNS rebinding), any when bound wider."""
    bound_to = bound_to.strip("[]")
    if bound_to in LOOPBACK_HOSTS or bound_to.startswith("127."):
        return [*LOOPBACK_HOSTS, bound_to]
    return ["*"]


def host_name(host_header: str) -> str:
    """The name in a Host header, without its port: `[::1]:8321` is `::1`."""
    if host_header.startswith("["):
        return host_header[1:].split("]", 1)[0].lower()
    return host_header.rsplit(":", 1)[0].lower() if ":" in host_header else host_header.lower()


class HostCheck:
    """Answers only requests whose Host header names one of `hosts` ("*": any)."""

    def __init__(self, app: ASGIApp, hosts: list[str]) -> None:
        self.app = app
        self.hosts = {host.lower() for host in hosts}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and "*" not in self.hosts:
            host = host_name(Headers(scope=scope).get("host", ""))
            if host not in self.hosts:
                await PlainTextResponse("Invalid host header", 400)(scope, receive, send)
                return
        await self.app(scope, receive, send)


class AccessToken:
    """Lets in only requests that carry `token`: in the address (`?token=...`, which the
    answer then sets as a cookie, so that the pages and what they fetch need no more) or
    as that cookie. For a viewer that listens beyond this machine."""

    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app = app
        self.token = token.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request = Request(scope)
        cookie = f"artstore_token_{(scope.get('server') or ('', 0))[1]}"  # one per port
        if self._matches(request.cookies.get(cookie)):
            await self.app(scope, receive, send)
        elif self._matches(request.query_params.get("token")):
            setting = (
                f"{cookie}={self.token.decode()}; Path=/; HttpOnly; SameSite=Strict"
            ).encode()

            async def send_with_cookie(message: Message) -> None:
                if message["type"] == "http.response.start":
                    message["headers"] = [*message.get("headers", []), (b"set-cookie", setting)]
                await send(message)

            await self.app(scope, receive, send_with_cookie)
        else:
            refused = PlainTextResponse(
                "403: this viewer listens beyond its machine and asks for its token: open "
                "the address `artstore ui` printed (with ?token=...)",
                403,
            )
            await refused(scope, receive, send)

    def _matches(self, given: str | None) -> bool:
        return given is not None and secrets.compare_digest(given.encode(), self.token)


def create_app(
    url: str | None = None,
    *,
    store: Any = None,
    host: str = "127.0.0.1",
    runs_refresh_ms: int = pages.RUNS_REFRESH_MS,
    run_refresh_ms: int = pages.RUN_REFRESH_MS,
    sql_timeout: float | None = pages.SQL_TIMEOUT_S,
    access_token: str | None = None,
    allow_feedback: bool = False,
) -> Starlette:
    """The viewer over the store at `url` (opened to read when the app starts, closed when
    it stops), or over an open `store` (left open). `sql_timeout`: the SQL page's deadline
    per query, in seconds (None: none); `access_token`: what every request must carry;
    `allow_feedback`: the trajectory page takes feedback (the store is opened to write)."""

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        if store is not None:
            app.state.store = store
            yield
            return

        app.state.store = await (
            open_store(url, create=False) if allow_feedback else open_for_reading(url)
        )
        try:
            yield
        finally:
            await app.state.store.close()

    routes = _routes()
    app = Starlette(
        routes=routes,
        lifespan=lifespan,
        middleware=[
            Middleware(SecurityHeaders),
            Middleware(HostCheck, hosts=allowed_hosts(host)),
            *([Middleware(AccessToken, token=access_token)] if access_token else []),
        ],
        exception_handlers={
            NotFoundError: _not_found,
            HTTPException: _http_error,
            # Handled inside the middleware (so the page keeps its headers); anything else
            # is the server's "500" of last resort.
            **dict.fromkeys(_EXPECTED_ERRORS, _failed),
            Exception: _failed,
        },
    )
    app.state.templates = Jinja2Templates(env=environment())
    # Every page's header says whether the viewer writes anything.
    app.state.templates.env.globals["takes_feedback"] = allow_feedback
    app.state.runs_refresh_ms = runs_refresh_ms
    app.state.run_refresh_ms = run_refresh_ms
    app.state.sql_timeout = sql_timeout
    # The SQL page's form carries it; a page of another site cannot read it.
    app.state.csrf_token = secrets.token_urlsafe(32)
    app.state.allow_feedback = allow_feedback
    app.state.queries = set()  # the user queries running now (asyncio tasks)
    return app


def _routes() -> list[Route | Mount]:
    """The viewer's pages, what its live pages fetch, what it takes (SQL, feedback)."""
    return [
        Route("/", pages.runs_page, name="runs"),
        Route("/api/runs", pages.runs_json, name="runs_json"),
        Route("/api/runs/{run:path}", pages.run_json, name="run_json"),
        Route("/runs/{run:path}", pages.run_page, name="run"),
        Route("/groups/{group_id}", pages.group_page, name="group"),
        Route("/trajectories/{rollout_id}", pages.trajectory_page, name="trajectory"),
        Route(
            "/trajectories/{rollout_id}/feedback",
            feedback_pages.feedback_post,
            name="feedback",
            methods=["POST"],
        ),
        Route("/queue", feedback_pages.queue_page, name="queue"),
        Route("/compare/scorers", pages.compare_scorers_page, name="compare_scorers"),
        Route("/compare/runs", pages.compare_runs_page, name="compare_runs"),
        Route("/sql", pages.sql_page, name="sql", methods=["GET", "POST"]),
        Mount(
            "/static",
            StaticFiles(directory=str(files("artstore.viewer") / "static")),
            name="static",
        ),
    ]


_EXPECTED_ERRORS: tuple[type[Exception], ...] = (
    ArtstoreError,
    SQLAlchemyError,
    OSError,
    ValueError,
    LookupError,
    TypeError,
)


def _error_page(request: Request, status: int, title: str, message: str) -> Response:
    if request.url.path.startswith("/api/"):
        return pages.JSONResponse({"error": message}, status_code=status)
    return request.app.state.templates.TemplateResponse(
        request, "error.html", {"title": title, "message": message}, status_code=status
    )


async def _not_found(request: Request, exc: Exception) -> Response:
    return _error_page(request, 404, "Not found", str(exc))


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    return _error_page(
        request,
        exc.status_code,
        "Not found" if exc.status_code == 404 else "Error",
        str(exc.detail),
    )


async def _failed(request: Request, exc: Exception) -> Response:
    # One line, as the command line prints errors; the traceback goes to the server's log.
    log.exception("%s failed", request.url.path)
    first = (str(exc).strip().splitlines() or [""])[0]
    message = first if isinstance(exc, ArtstoreError) else f"{type(exc).__name__}: {first}"
    return _error_page(request, 500, "Error", message)
