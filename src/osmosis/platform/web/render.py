"""Templates and the formatting every page shares: one Jinja2 environment, autoescaped.

return render(request, "run.html", viewer, run=run)   # an HTMLResponse
"""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from fastapi import Request
from fastapi.responses import HTMLResponse
from jinja2 import Environment, FileSystemLoader, select_autoescape

from osmosis.platform.web.session import CSRF_FIELD, Viewer
from osmosis.vocabulary import OUTCOME_LABELS, outcome, passes

TEMPLATES = Path(__file__).parent / "templates"


def percent(value: float | None, digits: int = 1) -> str:
    """0.5 -> '50.0%'; no value -> '—'."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    return f"{value * 100:.{digits}f}%"


def number(value: float | int | None, digits: int = 4) -> str:
    if value is None:
        return "—"
    if isinstance(value, int):
        return f"{value:,}"
    return f"{value:.{digits}f}"


def duration(ms: float | int | None) -> str:
    """Milliseconds as a person reads them: '850 ms', '12.3 s', '4m 05s', '2h 03m'."""
    if ms is None:
        return "—"
    if ms < 1000:
        return f"{ms:.0f} ms"
    seconds = ms / 1000
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m {secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h {minutes:02d}m"


def when(value: datetime | None) -> str:
    if value is None:
        return "—"
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def query(params: dict[str, Any], **changes: Any) -> str:
    """`params` with `changes` applied, as a query string; None and "" drop a key, and a
    list repeats its key (`run=a&run=b`)."""
    merged = {**params, **changes}
    kept = {k: v for k, v in merged.items() if v is not None and v != "" and v != []}
    return "?" + urlencode(kept, doseq=True) if kept else "?"


def cell(value: Any, limit: int = 400) -> str:
    """A table cell's text: strings as they are, anything else as JSON, cut at `limit`."""
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return text if len(text) <= limit else text[:limit] + "…"


def _environment() -> Environment:
    env = Environment(
        loader=FileSystemLoader(TEMPLATES),
        autoescape=select_autoescape(["html", "svg"], default=True),
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(percent=percent, number=number, duration=duration, when=when, cell=cell)
    env.globals.update(
        query=query,
        csrf_field=CSRF_FIELD,
        passes=passes,
        outcome_of=outcome,
        outcome_labels=OUTCOME_LABELS,
    )
    return env


_ENV = _environment()


def render(
    request: Request,
    template: str,
    viewer: Viewer | None,
    *,
    status_code: int = 200,
    **context: Any,
) -> HTMLResponse:
    # `eval view` serves the same pages with nothing to sign in to and nothing to change.
    context.setdefault("read_only", getattr(request.app.state, "dashboard_read_only", False))
    page = _ENV.get_template(template).render(request=request, viewer=viewer, **context)
    return HTMLResponse(page, status_code=status_code, headers=SECURITY_HEADERS)


# Pages load nothing from elsewhere and run only our own script; no framing either.
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; "
        "object-src 'none'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}
