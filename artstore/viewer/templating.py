"""The templates' environment: autoescaping on, links to pages, numbers for people."""

from __future__ import annotations

import json
import math
from decimal import Decimal
from typing import Any
from urllib.parse import quote, urlencode

import jinja2
from markupsafe import Markup

from artstore.schema.tables import storable_text


def run_href(run: str) -> str:
    return "/runs/" + quote(run, safe="/")


def group_href(group_id: str) -> str:
    return "/groups/" + quote(group_id, safe="")


def trajectory_href(rollout_id: str) -> str:
    return "/trajectories/" + quote(rollout_id, safe="")


def compare_scorers_href(run: str, x: str, y: str) -> str:
    return "/compare/scorers?" + urlencode({"run": run, "x": x, "y": y})


def compare_runs_href(a: str, b: str) -> str:
    return "/compare/runs?" + urlencode({"a": a, "b": b})


def queue_href(run: str, name: str | None = None, after: str | None = None) -> str:
    """The feedback queue of `run` for the person `name` (the viewer's login name when
    None), from the rollout after `after`."""
    given = {"run": run, "name": name, "after": after}
    return "/queue?" + urlencode({key: value for key, value in given.items() if value})


def sql_href(statement: str) -> str:
    return "/sql?" + urlencode({"q": statement})


def number(value: Any, digits: int = 4) -> str:
    """A number for people: 4 significant digits, integers whole, nothing for None."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float | Decimal):
        value = float(value)
        if math.isnan(value) or math.isinf(value):
            return str(value)
        return f"{value:.{digits}g}"
    return str(value)


def seconds(value: Any) -> str:
    if value is None:
        return ""
    value = float(value)
    if value < 1:
        return f"{value * 1000:.0f} ms"
    if value < 120:
        return f"{value:.2f} s"
    minutes, rest = divmod(value, 60)
    return f"{minutes:.0f} min {rest:.0f} s"


def short(identifier: Any, length: int = 8) -> str:
    return "" if identifier is None else str(identifier)[:length]


def pretty_json(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False, default=str)


def logprob_class(probability: float | None) -> str:
    """A CSS class per tenth of probability: `p0` (the model was unsure) to `p9` (sure)."""
    if probability is None:
        return "p-none"
    return f"p{min(9, max(0, int(probability * 10)))}"


def json_default(value: Any) -> Any:
    if isinstance(value, Decimal):
        return float(value)
    return str(value)


def dumps(value: Any, **kwargs: Any) -> str:
    """JSON for `|tojson` (Jinja escapes <, >, & and ' in it for a <script> element)."""
    return json.dumps(value, default=json_default, **kwargs)


def _shown(value: Any) -> Any:
    """What a page shows of a value: a lone surrogate (a file name decoded with
    surrogateescape, say), which no UTF-8 page can hold, shows as U+FFFD; NUL too."""
    if isinstance(value, str) and not value.isascii():
        shown = storable_text(value)
        return Markup(shown) if isinstance(value, Markup) else shown
    return value


def environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("artstore.viewer", "templates"),
        autoescape=True,  # every page is HTML: escape every value
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        finalize=_shown,
    )
    env.policies["json.dumps_function"] = dumps
    env.policies["json.dumps_kwargs"] = {"sort_keys": False}
    env.filters.update(
        number=number,
        seconds=seconds,
        short=short,
        pretty_json=pretty_json,
        logprob_class=logprob_class,
    )
    env.globals.update(
        run_href=run_href,
        group_href=group_href,
        trajectory_href=trajectory_href,
        compare_scorers_href=compare_scorers_href,
        compare_runs_href=compare_runs_href,
        sql_href=sql_href,
        queue_href=queue_href,
    )
    return env
