"""`artstore ui`: a local, read-only web viewer over a store (SQLite or PostgreSQL).

Pages: the runs (live while they train), a run (reward curves per scorer, train-step
metrics, tokens and latency per step, groups, consumption, failures), a group (its
rollouts side by side with rewards and advantages), a trajectory (the chat, tool calls,
each assistant token coloured by its logprob), comparisons of two scorers and of two
runs, and a read-only SQL page.

Built on Starlette (ASGI), Jinja2 templates and uvicorn; the charts are Chart.js, shipped
in `static/vendor/` (no CDN: it works offline). Every value is escaped by the templates or
set as text by the scripts: model output never becomes markup. The pages send a strict
Content-Security-Policy (scripts from the viewer itself only) and answer only to the host
names of the address they are bound to (beyond loopback, only with the printed token); the
SQL page runs a query only when its own form posts it (app.py, sql_page.py).

`create_app(url)` builds the application; `serve(url, host, port)` runs it. This package
imports the web stack, so the command line imports it only inside `artstore ui`.
"""

from artstore.viewer.app import create_app
from artstore.viewer.server import serve

__all__ = ["create_app", "serve"]
