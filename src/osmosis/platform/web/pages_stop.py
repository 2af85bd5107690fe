"""A platform run's Stop button (absent from `osmosis eval view`, which only reads)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Form, Request
from fastapi.responses import RedirectResponse, Response

from osmosis.platform.core.errors import Conflict
from osmosis.platform.deps import Db
from osmosis.platform.services import runs
from osmosis.platform.web.session import CSRF_FIELD, PageViewer, check_csrf

router = APIRouter()


@router.post("/runs/{run_ref}/stop")
def stop_run(
    run_ref: str,
    request: Request,
    db: Db,
    viewer: PageViewer,
    csrf_token: Annotated[str, Form(alias=CSRF_FIELD)] = "",
) -> Response:
    """What `POST /api/eval-runs/{run}/stop` does, answered with the run page (which then
    refreshes itself until the worker has written what finished and marked the run)."""
    check_csrf(request, csrf_token)
    run = runs.find_run(db, user=viewer.user, ref=run_ref)
    try:
        stopped_now = runs.request_stop(db, run=run)
    except Conflict:
        # It ended while the page was open (or this is a second click): no error page, the
        # run's page says how it ended.
        return RedirectResponse(f"/runs/{run.name}", status_code=303)
    if not stopped_now:  # a running run: its worker must be told
        request.app.state.scheduler.stop_worker(run.id)
    return RedirectResponse(f"/runs/{run.name}", status_code=303)
