"""A run's samples: the list (grouped by row, or one line per attempt), its CSV, one
attempt's page (input, trajectory, grade, error and traceback, artifacts) and the artifact
bytes its previews show.

The list's filters live in the URL and travel with every link: to the next page, to a
sample (whose previous/next links walk the same list) and to the CSV of the same rows.
"""

from __future__ import annotations

import csv
import io
import math
import re
from collections.abc import Iterator
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import FileResponse, Response, StreamingResponse

from osmosis.platform.core.errors import NotFound, ValidationFailed
from osmosis.platform.services.run_views import MAX_ATTEMPTS_PAGE
from osmosis.platform.web import artifacts
from osmosis.platform.web.params import Offset, RowIndex, RunIndex
from osmosis.platform.web.render import render
from osmosis.platform.web.samples_index import Sample, SampleIndex, SampleQuery
from osmosis.platform.web.source import Source, page_params
from osmosis.platform.web.tracebacks import find_traceback
from osmosis.platform.web.trajectory import STEPS_PER_PAGE, read_conversation

router = APIRouter()

ATTEMPTS_PER_PAGE = 50
ROWS_PER_PAGE = 25
CSV_CHUNK = 500
VIEWS = ("rows", "attempts")
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


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


class ListParams:
    """The samples list's filters, read from the query string once for every page that
    keeps them (the list, its CSV, a sample's previous/next)."""

    def __init__(
        self,
        failed: str = "",
        min_reward: str = "",
        max_reward: str = "",
        sort: str = "row_index",
        q: Annotated[str, Query(max_length=1000)] = "",
        view: str = "",
        outcome: str = "",
    ) -> None:
        low, high = _reward_range(min_reward, max_reward)
        # `failed=1` is the older link for the errored attempts; it keeps working.
        self.failed = failed in {"1", "on", "true"}
        self.outcome = outcome.strip()
        self.query = SampleQuery(
            status="failed" if self.failed else "",
            min_reward=low,
            max_reward=high,
            sort=sort,
            text=q.strip(),
            outcome=self.outcome,
        )
        if view and view not in VIEWS:
            raise ValidationFailed(
                f"view must be one of {', '.join(VIEWS)}; got {view!r}",
                details={"valid": list(VIEWS)},
            )
        # One line per attempt is the only order a sort can mean.
        self.view = view or ("rows" if sort == "row_index" else "attempts")
        self.min_reward, self.max_reward = min_reward.strip(), max_reward.strip()
        self.params = page_params(
            {
                "failed": "1" if self.failed else None,
                "outcome": self.outcome or None,
                "min_reward": self.min_reward,
                "max_reward": self.max_reward,
                "sort": None if sort == "row_index" else sort,
                "q": self.query.text,
                "view": view if view and view != "rows" else None,
            }
        )


Filters = Annotated[ListParams, Depends()]


def _inputs(index: SampleIndex, samples: list[Sample]) -> dict[tuple[int, int], Any]:
    index.with_texts(samples)
    return {sample.key: index.input_of(sample) for sample in samples}


@router.get("/runs/{run_ref}/samples")
def samples(
    run_ref: str,
    request: Request,
    source: Source,
    filters: Filters,
    offset: Offset = 0,
    limit: Annotated[int, Query(ge=1, le=MAX_ATTEMPTS_PAGE)] | None = None,
) -> Response:
    """The attempts that match, a page at a time: by row (with each row's pass@k) or flat."""
    run = source.find(run_ref)
    index = source.samples(run)
    chosen = index.query(filters.query)
    per_page = limit or (ROWS_PER_PAGE if filters.view == "rows" else ATTEMPTS_PER_PAGE)
    params = dict(filters.params)
    if limit:
        params["limit"] = limit
    if filters.view == "rows":
        groups = index.groups(chosen)
        shown_groups = groups[offset : offset + per_page]
        shown = [sample for group in shown_groups for sample in group.samples]
        total = len(groups)
    else:
        shown_groups, shown = [], chosen[offset : offset + per_page]
        total = len(chosen)
    return render(
        request,
        "samples.html",
        source.viewer,
        nav="runs",
        run=run,
        filters=filters,
        attempts=shown,
        groups=shown_groups,
        inputs=_inputs(index, shown),
        matched=len(chosen),
        recorded=len(index),
        page={"offset": offset, "limit": per_page, "total": total, "params": params},
        threshold=index.pass_threshold,
        skipped_lines=index.skipped_lines,
        input_problem=index.input_problem,
        refresh=3 if run.live else 0,
    )


@router.get("/runs/{run_ref}/samples.csv")
def samples_csv(
    run_ref: str,
    source: Source,
    filters: Filters,
) -> Response:
    """The samples table with the list's filters and order, every matching attempt."""
    run = source.find(run_ref)
    index = source.samples(run)

    def lines() -> Iterator[str]:
        # A chunk per CSV_CHUNK rows: each chunk costs the server a thread hop.
        buffer = io.StringIO()
        writer = csv.writer(buffer)
        for count, row in enumerate(index.csv_rows(filters.query), start=1):
            writer.writerow(row)
            if count % CSV_CHUNK == 0:
                yield buffer.getvalue()
                buffer.seek(0)
                buffer.truncate()
        yield buffer.getvalue()

    name = _UNSAFE.sub("_", run.ref)
    return StreamingResponse(
        lines(),
        media_type="text/csv; charset=utf-8",
        headers={
            "Content-Disposition": f'attachment; filename="{name}-samples.csv"',
            "X-Content-Type-Options": "nosniff",
        },
    )


def _sample(index: SampleIndex, row_index: int, run_index: int) -> Sample:
    found = index.get(row_index, run_index)
    if found is None:
        raise NotFound(
            f"no recorded attempt for row {row_index}, attempt {run_index} in this run",
            details={"row_index": row_index, "run_index": run_index},
        )
    return found


@router.get("/runs/{run_ref}/samples/{row_index}/{run_index}")
def sample(
    run_ref: str,
    row_index: RowIndex,
    run_index: RunIndex,
    request: Request,
    source: Source,
    filters: Filters,
    file: str = "",
    offset: Offset = 0,
) -> Response:
    """One attempt: its input, conversation (STEPS_PER_PAGE steps from `offset`), grade, error
    with traceback, and artifacts (the one named by `file` previewed)."""
    run = source.find(run_ref)
    index = source.samples(run)
    attempt = _sample(index, row_index, run_index)
    directory = source.run_dir(run)
    name = artifacts.attempt_name(row_index, run_index)
    folder = directory / "artifacts" / name
    trajectory = directory / "trajectories" / f"{name}.json"
    convo = read_conversation(trajectory)
    own = {"file": file or None, "offset": offset or None}
    return render(
        request,
        "sample.html",
        source.viewer,
        nav="runs",
        run=run,
        attempt=attempt,
        row_input=index.input_of(attempt),
        input_problem=index.input_problem,
        traceback=find_traceback(
            directory, attempt.rollout_id, convo.osmosis, attempt.error_message
        )
        if attempt.status == "failed"
        else None,
        neighbours=index.neighbours(filters.query, attempt.key),
        list_params=filters.params,
        convo=convo,
        turns=convo.turns[offset : offset + STEPS_PER_PAGE],
        page={
            "offset": offset,
            "limit": STEPS_PER_PAGE,
            "total": len(convo.turns),
            "params": page_params({**filters.params, "file": file}),
        },
        own_params=page_params({**filters.params, **own}),
        tree=artifacts.artifact_tree(folder),
        preview=artifacts.preview(folder, file) if file else None,
        has_trajectory=trajectory.is_file(),
        threshold=index.pass_threshold,
    )


@router.get("/runs/{run_ref}/samples/{row_index}/{run_index}/artifacts/{path:path}")
def artifact(
    run_ref: str,
    row_index: RowIndex,
    run_index: RunIndex,
    path: str,
    source: Source,
) -> Response:
    """One artifact's bytes: images inline (for the preview), anything else as a download."""
    run = source.find(run_ref)
    directory = source.run_dir(run)
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
