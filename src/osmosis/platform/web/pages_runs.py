"""The runs list (`/`), a run's page and its file downloads, over any run source.

On the platform the run page shows `GET /api/eval-runs/{run}` (the same `detail_public`
view), so its numbers are the API's and `osmosis eval info`'s by construction; in
`osmosis eval view` they are the run directory's own metrics.json, or the journal's while the
run is going.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated

from fastapi import APIRouter, Query, Request
from fastapi.responses import FileResponse, Response

from osmosis.platform.services import run_files
from osmosis.platform.web import charts
from osmosis.platform.web.params import Offset
from osmosis.platform.web.render import render
from osmosis.platform.web.source import RUNS_PER_PAGE, RunFilters, Source
from osmosis.vocabulary import DEFAULT_PASS_THRESHOLD

router = APIRouter()

REFRESH_SECONDS = 3
LOG_TAIL_ENTRIES = 40
DOWNLOADS = ("metrics.json", "summary.jsonl", run_files.LOG_FILE)


@router.get("/")
def runs_page(
    request: Request,
    source: Source,
    status: str = "",
    dataset: str = "",
    model: str = "",
    rollout: str = "",
    workspace: str = "",
    offset: Offset = 0,
    limit: Annotated[int, Query(ge=1, le=100)] = RUNS_PER_PAGE,
) -> Response:
    filters = RunFilters(
        status=status, dataset=dataset, model=model, rollout=rollout, workspace=workspace
    )
    page = source.list_runs(filters, limit=limit, offset=offset)
    if limit != RUNS_PER_PAGE:
        page.params["limit"] = limit  # a chosen page size survives paging, like the filters
    going = any(run.live for run in page.rows)
    return render(
        request,
        "runs.html",
        source.viewer,
        nav="runs",
        page=page,
        filters=filters,
        choices=source.filter_choices(),
        refresh=REFRESH_SECONDS if going else 0,
    )


@router.get("/runs/{run_ref}")
def run_page(run_ref: str, request: Request, source: Source) -> Response:
    run = source.find(run_ref)
    results = source.results(run)
    directory = source.run_dir(run)
    threshold = run.detail.pass_threshold if run.detail else DEFAULT_PASS_THRESHOLD
    outcomes = source.samples(run).outcomes(threshold)
    return render(
        request,
        "run.html",
        source.viewer,
        nav="runs",
        run=run,
        detail=run.detail,
        results=results,
        histogram=charts.reward_histogram_svg(charts.histogram(source.rewards(run))),
        pass_at_k=charts.pass_at_k_svg(results.get("pass_at_k") or []),
        # Rows whose attempts disagree within this run: a pass rate there is luck, not skill.
        flaky_rows=sorted(row for row, found in outcomes.items() if found.flaky),
        log_tail=run_files.tail_logs(directory / run_files.LOG_FILE, count=LOG_TAIL_ENTRIES),
        downloads=[name for name in DOWNLOADS if (directory / name).is_file()],
        can_stop=not source.read_only and run.live,
        refresh=REFRESH_SECONDS if run.live else 0,
        elapsed_ms=(datetime.now(UTC) - run.started_at).total_seconds() * 1000
        if run.started_at is not None and run.live
        else None,
    )


@router.get("/runs/{run_ref}/files/{path:path}")
def run_file(run_ref: str, path: str, source: Source) -> Response:
    """A file of the run's download layout, as an attachment: on the platform the bytes of
    `GET /api/eval-runs/{run}/files/{path}`, for a browser that signs in with a cookie."""
    run = source.find(run_ref)
    target = run_files.layout_file(source.run_dir(run), path)
    return FileResponse(
        target,
        media_type="application/octet-stream",
        filename=target.name,
        headers={"X-Content-Type-Options": "nosniff"},
    )
