"""The web dashboard: server-rendered pages at `/`, signed in with the API's own tokens.

    install_dashboard(app)   # pages, /static, and HTML error pages for browsers

Pages are Jinja2 templates (autoescaped) over the same store the API reads; every asset is
served from `/static`, and the only script refreshes a running run's page.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import quote

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from starlette.exceptions import HTTPException

from osmosis.platform.errors import PlatformError, error_response
from osmosis.platform.web import (
    pages_auth,
    pages_compare,
    pages_library,
    pages_runs,
    pages_samples,
)
from osmosis.platform.web.render import render
from osmosis.platform.web.session import LoginRequired

STATIC = Path(__file__).parent / "static"

__all__ = ["install_dashboard"]


def _wants_page(request: Request) -> bool:
    """A browser asking for a page (not the API, and accepting HTML) gets HTML errors."""
    return not request.url.path.startswith("/api") and "text/html" in request.headers.get(
        "accept", ""
    )


async def _login_required(request: Request, exc: Exception) -> Response:
    if request.headers.get("authorization") or not _wants_page(request):
        return error_response(request, exc)  # a script: the 401 envelope, not a redirect
    target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    return RedirectResponse(f"/login?next={quote(target, safe='')}", status_code=303)


_TITLES = {403: "Not allowed", 404: "Not found", 409: "Conflict", 422: "Invalid request"}


async def _page_error(request: Request, exc: Exception) -> Response:
    if not _wants_page(request):
        return error_response(request, exc)
    if isinstance(exc, PlatformError):
        status, message = exc.status_code, exc.message
    elif isinstance(exc, RequestValidationError):
        status = 422
        message = "; ".join(
            f"{'.'.join(str(part) for part in issue.get('loc', ()))}: {issue.get('msg', '')}"
            for issue in exc.errors()
        )
    elif isinstance(exc, HTTPException):
        status, message = exc.status_code, str(exc.detail)
    else:
        return error_response(request, exc)
    return render(
        request,
        "error.html",
        None,
        status_code=status,
        title=_TITLES.get(status, "Something went wrong"),
        message=message,
    )


def install_dashboard(app: FastAPI) -> None:
    """Mount the pages and static files, and answer browsers' errors with HTML pages."""
    for module in (pages_auth, pages_runs, pages_samples, pages_compare, pages_library):
        app.include_router(module.router, include_in_schema=False)
    app.mount("/static", StaticFiles(directory=STATIC), name="static")
    app.add_exception_handler(LoginRequired, _login_required)
    # The API's JSON handler stays in charge of everything but browsers' page requests.
    app.add_exception_handler(PlatformError, _page_error)
    app.add_exception_handler(HTTPException, _page_error)
    app.add_exception_handler(RequestValidationError, _page_error)
