"""A run's samples: the per-attempt table, one attempt's page (trajectory, grade, artifacts),
and the artifact bytes its previews show."""

from __future__ import annotations

import math
from typing import Annotated

from fastapi import APIRouter, Query, Request
from fastapi.responses import FileResponse, Response

from osmosis.platform import runs
from osmosis.platform.db.run_models import EvalAttempt
from osmosis.platform.deps import Db
from osmosis.platform.errors import NotFound, ValidationFailed
from osmosis.platform.run_views import MAX_ATTEMPTS_PAGE, attempts_page
from osmosis.platform.web import artifacts, run_queries
from osmosis.platform.web.params import Offset, RowIndex, RunIndex
from osmosis.platform.web.render import render
from osmosis.platform.web.session import PageViewer
from osmosis.platform.web.trajectory import STEPS_PER_PAGE, read_conversation

router = APIRouter()

ATTEMPTS_PER_PAGE = 50


def _reward_range(low: str, high: str) -> tuple[float | None, float | None]:
    """The reward filter's bounds; every problem with them is named in one 422."""
    problems: list[str] = []
    bounds: list[float | None] = []
    for field, text in (("min_reward", low), ("max_reward", high)):
        value = None
        if text.strip():
            try:
                value = float(text)
            except ValueError:
                value = math.nan
            if not math.isfinite(value):
                problems.append(f"{field} must be a number, such as 0.5; got {text!r}")
                value = None
        bounds.append(value)
    low_value, high_value = bounds
    if low_value is not None and high_value is not None and low_value > high_value:
        problems.append(f"min_reward ({low_value:g}) is above max_reward ({high_value:g})")
    if problems:
        raise ValidationFailed("; ".join(problems), details={"problems": problems})
    return low_value, high_value


@router.get("/runs/{run_ref}/samples")
def samples(
    run_ref: str,
    request: Request,
    db: Db,
    viewer: PageViewer,
    failed: str = "",
    min_reward: str = "",
    max_reward: str = "",
    sort: str = "row_index",
    offset: Offset = 0,
    limit: Annotated[int, Query(ge=1, le=MAX_ATTEMPTS_PAGE)] = ATTEMPTS_PER_PAGE,
) -> Response:
    """The attempts table: one page from `attempts_page` (what `GET .../attempts` serves)."""
    run = runs.find_run(db, user=viewer.user, ref=run_ref)
    failed_only = failed in {"1", "on", "true"}
    low, high = _reward_range(min_reward, max_reward)
    page = attempts_page(
        db,
        run=run,
        limit=limit,
        offset=offset,
        status="failed" if failed_only else None,
        min_reward=low,
        max_reward=high,
        sort=sort,
    )
    params = {
        "failed": "1" if failed_only else None,
        "min_reward": min_reward.strip() or None,
        "max_reward": max_reward.strip() or None,
        "sort": None if sort == "row_index" else sort,
        "limit": None if limit == ATTEMPTS_PER_PAGE else limit,
    }
    return render(
        request,
        "samples.html",
        viewer,
        nav="runs",
        run=run,
        attempts=page.attempts,
        page={
            "offset": offset,
            "limit": limit,
            "total": page.total_count,
            "params": {k: v for k, v in params.items() if v is not None},
        },
        failed_only=failed_only,
        min_reward=min_reward.strip(),
        max_reward=max_reward.strip(),
        sort=sort,
    )


def _attempt(db: Db, *, run_id: str, row_index: int, run_index: int) -> EvalAttempt:
    attempt = db.get(EvalAttempt, (run_id, row_index, run_index))
    if attempt is None:
        raise NotFound(
            f"no recorded attempt for row {row_index}, attempt {run_index} in this run",
            details={"row_index": row_index, "run_index": run_index},
        )
    return attempt


@router.get("/runs/{run_ref}/samples/{row_index}/{run_index}")
def sample(
    run_ref: str,
    row_index: RowIndex,
    run_index: RunIndex,
    request: Request,
    db: Db,
    viewer: PageViewer,
    file: str = "",
    offset: Offset = 0,
) -> Response:
    """One attempt: its conversation (STEPS_PER_PAGE steps from `offset`), grade and artifacts
    (the one named by `file` previewed)."""
    run = runs.find_run(db, user=viewer.user, ref=run_ref)
    attempt = _attempt(db, run_id=run.id, row_index=row_index, run_index=run_index)
    directory = runs.run_dir(request.app.state.settings, run.id)
    name = artifacts.attempt_name(row_index, run_index)
    folder = directory / "artifacts" / name
    trajectory = directory / "trajectories" / f"{name}.json"
    convo = read_conversation(trajectory)
    return render(
        request,
        "sample.html",
        viewer,
        nav="runs",
        run=run,
        attempt=attempt,
        convo=convo,
        turns=convo.turns[offset : offset + STEPS_PER_PAGE],
        page={
            "offset": offset,
            "limit": STEPS_PER_PAGE,
            "total": len(convo.turns),
            "params": {"file": file} if file else {},
        },
        tree=artifacts.artifact_tree(folder),
        preview=artifacts.preview(folder, file) if file else None,
        has_trajectory=trajectory.is_file(),
        threshold=run_queries.pass_threshold(run),
    )


@router.get("/runs/{run_ref}/samples/{row_index}/{run_index}/artifacts/{path:path}")
def artifact(
    run_ref: str,
    row_index: RowIndex,
    run_index: RunIndex,
    path: str,
    request: Request,
    db: Db,
    viewer: PageViewer,
) -> Response:
    """One artifact's bytes: images inline (for the preview), anything else as a download."""
    run = runs.find_run(db, user=viewer.user, ref=run_ref)
    directory = runs.run_dir(request.app.state.settings, run.id)
    target = artifacts.artifact_file(
        directory / "artifacts" / artifacts.attempt_name(row_index, run_index), path
    )
    kind = artifacts.content_type(target)
    inline = kind in artifacts.IMAGE_TYPES
    return FileResponse(
        target,
        media_type=kind if inline else "application/octet-stream",
        filename=target.name,
        content_disposition_type="inline" if inline else "attachment",
        # Even if a browser is talked into rendering it, the file runs no script here.
        headers={"X-Content-Type-Options": "nosniff", "Content-Security-Policy": "sandbox"},
    )
