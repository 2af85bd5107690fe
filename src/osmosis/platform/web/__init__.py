"""The web dashboard: server-rendered pages over a run source.

    install_dashboard(app)        # the platform: pages at `/`, signed in with the API's tokens
    app = create_view_app(root)   # `osmosis eval view`: the same pages over local run dirs

Pages are Jinja2 templates (autoescaped) over a `RunSource` (source.py); every asset is
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

from osmosis.platform.core.errors import PlatformError, error_response
from osmosis.platform.web import (
    pages_auth,
    pages_compare,
    pages_device,
    pages_library,
    pages_runs,
    pages_samples,
    pages_stop,
)
from osmosis.platform.web.render import render
from osmosis.platform.web.samples_index import IndexCache
from osmosis.platform.web.session import LoginRequired, Viewer, page_viewer
from osmosis.platform.web.source_platform import platform_sources

STATIC = Path(__file__).parent / "static"
RUN_PAGES = (pages_runs, pages_samples, pages_compare)

__all__ = ["create_view_app", "install_dashboard"]


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


def _signed_in(request: Request) -> Viewer | None:
    """Who is looking at an error page, so it keeps the navigation and the sign-out."""
    sessions = getattr(request.app.state, "sessions", None)
    if sessions is None:
        return None
    try:
        with sessions() as db:
            return page_viewer(request, db)
    except PlatformError:
        return None


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
        _signed_in(request),
        status_code=status,
        title=_TITLES.get(status, "Something went wrong"),
        message=message,
    )


def _html_errors(app: FastAPI) -> None:
    # The JSON handler stays in charge of everything but browsers' page requests.
    app.add_exception_handler(PlatformError, _page_error)
    app.add_exception_handler(HTTPException, _page_error)
    app.add_exception_handler(RequestValidationError, _page_error)


def install_dashboard(app: FastAPI) -> None:
    """Mount the pages and static files, and answer browsers' errors with HTML pages."""
    app.state.run_source = platform_sources
    app.state.sample_indexes = IndexCache()
    for module in (pages_auth, *RUN_PAGES, pages_stop, pages_library, pages_device):
        app.include_router(module.router, include_in_schema=False)
    app.mount("/static", StaticFiles(directory=STATIC), name="static")
    app.add_exception_handler(LoginRequired, _login_required)
    _html_errors(app)


def create_view_app(root: Path, *, allowed_hosts: frozenset[str] | None = None) -> FastAPI:
    """The run pages over the run directories under `root`, read-only and without login.

    `allowed_hosts`: the Host headers answered (None: any). On loopback that is the loopback
    names only, so a web page cannot reach the viewer through a name it points at 127.0.0.1.
    """
    from osmosis.platform.core.errors import install_error_handling
    from osmosis.platform.web.source_local import LocalSource
    from osmosis.platform.web.view_guard import HostGuard

    source = LocalSource(root)
    app = FastAPI(title="osmosis eval view", openapi_url=None, docs_url=None, redoc_url=None)
    app.state.run_source = lambda _request: iter([source])
    app.state.dashboard_read_only = True
    install_error_handling(app)
    for module in RUN_PAGES:
        app.include_router(module.router, include_in_schema=False)
    app.mount("/static", StaticFiles(directory=STATIC), name="static")
    _html_errors(app)
    if allowed_hosts is not None:
        app.add_middleware(HostGuard, allowed=allowed_hosts)
    return app
