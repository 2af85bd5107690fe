"""`/compare?a=RUN&b=RUN`: two runs on the same dataset, row by row."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from osmosis.platform import runs
from osmosis.platform.db.run_models import EvalRun
from osmosis.platform.deps import Db
from osmosis.platform.errors import ValidationFailed
from osmosis.platform.run_views import summary_public
from osmosis.platform.web import run_queries
from osmosis.platform.web.compare import KINDS, compare_runs
from osmosis.platform.web.params import Offset
from osmosis.platform.web.render import render
from osmosis.platform.web.session import PageViewer

router = APIRouter()

ROWS_PER_PAGE = 100
SHOWS = ("changed", "all", *KINDS)


def _same_dataset(a: EvalRun, b: EvalRun) -> bool:
    if a.dataset_version_id and b.dataset_version_id:
        return a.dataset_version_id == b.dataset_version_id
    return a.dataset_name == b.dataset_name


@router.get("/compare")
def compare(
    request: Request,
    db: Db,
    viewer: PageViewer,
    a: str = "",
    b: str = "",
    show: str = "changed",
    offset: Offset = 0,
) -> Response:
    if show not in SHOWS:
        raise ValidationFailed(f"unknown show {show!r}", details={"valid": list(SHOWS)})
    recent = run_queries.list_runs(
        db, user=viewer.user, filters=run_queries.RunFilters(), limit=200, offset=0
    )
    context: dict[str, Any] = {
        "a": a,
        "b": b,
        "show": show,
        "recent": recent.rows,
        "recent_refs": {ref for row in recent.rows for ref in (row.run.name, row.run.id)},
    }
    if a and b:
        run_a = runs.find_run(db, user=viewer.user, ref=a)
        run_b = runs.find_run(db, user=viewer.user, ref=b)
        context.update(run_a=run_a, run_b=run_b)
        if not _same_dataset(run_a, run_b):
            context["problem"] = (
                f"{run_a.name} ran on dataset {run_a.dataset_name} and {run_b.name} on "
                f"{run_b.dataset_name}: pick two runs on the same dataset (and version)"
            )
        else:
            # Both runs are judged at A's pass threshold, so a changed threshold is not a change.
            threshold = run_queries.pass_threshold(run_a)
            result = compare_runs(
                run_queries.row_outcomes(db, run=run_a, threshold=threshold),
                run_queries.row_outcomes(db, run=run_b, threshold=threshold),
            )
            if show == "all":
                shown = result.rows
            elif show == "changed":
                shown = [r for r in result.rows if r.kind != "unchanged"]
            else:
                shown = [r for r in result.rows if r.kind == show]
            context.update(
                result=result,
                threshold=threshold,
                rows=shown[offset : offset + ROWS_PER_PAGE],
                page={
                    "offset": offset,
                    "limit": ROWS_PER_PAGE,
                    "total": len(shown),
                    "params": {"a": a, "b": b, "show": show},
                },
                rate_a=summary_public(run_a).summary.pass_rate,
                rate_b=summary_public(run_b).summary.pass_rate,
            )
    return render(request, "compare.html", viewer, nav="compare", **context)
