"""The dashboard's own reads of evaluation runs: the filtered runs list and its filter menus,
and the columns live results and the histogram use (the platform source's queries).

Every query is scoped to the viewer's workspaces, and the list is one LIMIT/OFFSET page plus
a COUNT. Finding one run and paging its attempts are `osmosis.platform.services.runs` / `run_views`.

    page = list_runs(db, user=ada, filters=RunFilters(status="running"), limit=25, offset=0)
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import ColumnElement, Select, and_, func, select
from sqlalchemy.orm import Session

from osmosis.platform.core.db.models import User, Workspace, WorkspaceMember
from osmosis.platform.core.db.run_models import EvalAttempt, EvalRun
from osmosis.platform.services.run_views import summary_public
from osmosis.platform.web.source import RUNS_PER_PAGE, RunFilters
from osmosis.wire.runs import EvalRunSummary


@dataclass(frozen=True)
class RunRow:
    """A run and the API's summary of it (the same numbers `GET /api/eval-runs` gives)."""

    run: EvalRun
    public: EvalRunSummary


@dataclass(frozen=True)
class RunsPage:
    rows: list[RunRow]
    total: int
    offset: int
    limit: int
    params: dict[str, Any]


def _visible_runs(user: User) -> Select[EvalRun, Workspace, User]:
    # Workspace and creator are loaded with the run, so the summary reads them without a query.
    return (
        select(EvalRun, Workspace, User)
        .join(Workspace, Workspace.id == EvalRun.workspace_id)
        .join(
            WorkspaceMember,
            and_(WorkspaceMember.workspace_id == Workspace.id, WorkspaceMember.user_id == user.id),
        )
        .outerjoin(User, User.id == EvalRun.created_by)
    )


_Visible = Select[EvalRun, Workspace, User]


def _filtered(query: _Visible, filters: RunFilters) -> _Visible:
    wanted: list[ColumnElement[bool]] = []
    if filters.status:
        wanted.append(EvalRun.status == filters.status)
    if filters.dataset:
        wanted.append(EvalRun.dataset_name == filters.dataset)
    if filters.model:
        wanted.append(EvalRun.model_path == filters.model)
    if filters.rollout:
        wanted.append(EvalRun.rollout == filters.rollout)
    if filters.workspace:
        wanted.append(Workspace.identity == filters.workspace)
    return query.where(*wanted)


def list_runs(db: Session, *, user: User, filters: RunFilters, limit: int, offset: int) -> RunsPage:
    """One page of the viewer's runs, newest first, with the total matching `filters`."""
    query = _filtered(_visible_runs(user), filters)
    total = db.scalar(select(func.count()).select_from(query.subquery())) or 0
    page = db.execute(
        query.order_by(EvalRun.created_at.desc(), EvalRun.id.desc()).limit(limit).offset(offset)
    )
    rows = [RunRow(run=run, public=summary_public(run)) for run, _ws, _creator in page]
    params: dict[str, Any] = filters.params()
    if limit != RUNS_PER_PAGE:
        params["limit"] = limit  # a chosen page size survives paging, like the filters
    return RunsPage(rows=rows, total=total, offset=offset, limit=limit, params=params)


@dataclass(frozen=True)
class FilterChoices:
    """The values each filter can take among the viewer's runs, for the filter menus."""

    datasets: list[str] = field(default_factory=list)
    models: list[str] = field(default_factory=list)
    rollouts: list[str] = field(default_factory=list)
    workspaces: list[str] = field(default_factory=list)


def filter_choices(db: Session, *, user: User) -> FilterChoices:
    def distinct(column: Any) -> list[str]:
        query = _visible_runs(user).with_only_columns(column).distinct().order_by(column)
        return [str(value) for value in db.scalars(query) if value is not None]

    return FilterChoices(
        datasets=distinct(EvalRun.dataset_name),
        models=distinct(EvalRun.model_path),
        rollouts=distinct(EvalRun.rollout),
        workspaces=distinct(Workspace.identity),
    )


def run_metrics(run: EvalRun) -> dict[str, Any] | None:
    """The summary of the run's metrics.json as the engine wrote it, or None before it."""
    if not run.summary:
        return None
    try:
        value = json.loads(run.summary)
    except ValueError:
        return None
    summary = value.get("summary", value) if isinstance(value, dict) else None
    return summary if isinstance(summary, dict) else None


def pass_threshold(run: EvalRun) -> float:
    try:
        value = json.loads(run.config)["evaluation"]["pass_threshold"]
    except (ValueError, KeyError, TypeError):
        return 1.0
    return float(value) if isinstance(value, int | float) else 1.0


def attempt_columns(db: Session, *, run: EvalRun) -> list[Any]:
    """Every attempt of a run as light rows (no ORM objects): what `summarize` reads."""
    query = select(
        EvalAttempt.row_index,
        EvalAttempt.run_index,
        EvalAttempt.status,
        EvalAttempt.reward,
        EvalAttempt.tokens,
        EvalAttempt.error_type,
        EvalAttempt.cost_usd,
    ).where(EvalAttempt.run_id == run.id)
    return list(db.execute(query))


def reward_values(db: Session, *, run: EvalRun) -> list[float]:
    """Every graded reward of a run (one column), for the histogram: `graded` of them."""
    query = select(EvalAttempt.reward).where(
        EvalAttempt.run_id == run.id,
        EvalAttempt.reward.is_not(None),
        EvalAttempt.status != "skipped",  # not graded, as `summarize` counts
    )
    return [float(value) for value in db.scalars(query) if value is not None]
