"""The runs list (`/`), a run's page, its Stop button and its file downloads.

The run page shows `GET /api/eval-runs/{run}` (the same `detail_public` view), so its numbers
are the API's and `osmosis eval info`'s by construction.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Form, Query, Request
from fastapi.responses import FileResponse, RedirectResponse, Response

from osmosis.eval.metrics import summarize
from osmosis.platform import run_files, runs
from osmosis.platform.db.models import utcnow
from osmosis.platform.db.run_models import RUN_STATUSES, TERMINAL, EvalRun
from osmosis.platform.deps import Db
from osmosis.platform.errors import Conflict
from osmosis.platform.run_views import detail_public
from osmosis.platform.web import charts, run_queries
from osmosis.platform.web.params import Offset
from osmosis.platform.web.render import render
from osmosis.platform.web.session import CSRF_FIELD, PageViewer, check_csrf

router = APIRouter()

REFRESH_SECONDS = 3
LOG_TAIL_ENTRIES = 40


@router.get("/")
def runs_page(
    request: Request,
    db: Db,
    viewer: PageViewer,
    status: str = "",
    dataset: str = "",
    model: str = "",
    rollout: str = "",
    workspace: str = "",
    offset: Offset = 0,
    limit: Annotated[int, Query(ge=1, le=100)] = run_queries.RUNS_PER_PAGE,
) -> Response:
    filters = run_queries.RunFilters(
        status=status, dataset=dataset, model=model, rollout=rollout, workspace=workspace
    )
    page = run_queries.list_runs(db, user=viewer.user, filters=filters, limit=limit, offset=offset)
    going = any(row.run.status not in TERMINAL for row in page.rows)
    return render(
        request,
        "runs.html",
        viewer,
        nav="runs",
        page=page,
        filters=filters,
        choices=run_queries.filter_choices(db, user=viewer.user),
        statuses=RUN_STATUSES,
        refresh=REFRESH_SECONDS if going else 0,
    )


def _results(db: Db, run: EvalRun) -> dict[str, Any]:
    """metrics.json's summary once the engine wrote it; before that, the same figures
    computed from the attempts recorded so far, so a running run shows live results."""
    written = run_queries.run_metrics(run)
    if written is not None:
        return written
    attempts = run_queries.attempt_columns(db, run=run)
    return summarize(attempts, pass_threshold=run_queries.pass_threshold(run))


@router.get("/runs/{run_ref}")
def run_page(run_ref: str, request: Request, db: Db, viewer: PageViewer) -> Response:
    settings = request.app.state.settings
    run = runs.find_run(db, user=viewer.user, ref=run_ref)
    detail = detail_public(db, settings=settings, run=run)
    results = _results(db, run)
    directory = runs.run_dir(settings, run.id)
    return render(
        request,
        "run.html",
        viewer,
        nav="runs",
        run=run,
        detail=detail,
        results=results,
        histogram=charts.reward_histogram_svg(
            charts.histogram(run_queries.reward_values(db, run=run))
        ),
        pass_at_k=charts.pass_at_k_svg(results.get("pass_at_k") or []),
        log_tail=run_files.tail_logs(directory / run_files.LOG_FILE, count=LOG_TAIL_ENTRIES),
        downloads=[
            name
            for name in ("metrics.json", "summary.jsonl", run_files.LOG_FILE)
            if (directory / name).is_file()
        ],
        terminal=run.status in TERMINAL,
        refresh=0 if run.status in TERMINAL else REFRESH_SECONDS,
        elapsed_ms=(utcnow() - run.started_at).total_seconds() * 1000
        if run.started_at is not None and run.status not in TERMINAL
        else None,
    )


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


@router.get("/runs/{run_ref}/files/{path:path}")
def run_file(run_ref: str, path: str, request: Request, db: Db, viewer: PageViewer) -> Response:
    """A file of the run's download layout, as an attachment: the bytes of
    `GET /api/eval-runs/{run}/files/{path}`, for a browser that signs in with a cookie."""
    run = runs.find_run(db, user=viewer.user, ref=run_ref)
    target = run_files.layout_file(runs.run_dir(request.app.state.settings, run.id), path)
    return FileResponse(
        target,
        media_type="application/octet-stream",
        filename=target.name,
        headers={"X-Content-Type-Options": "nosniff"},
    )
