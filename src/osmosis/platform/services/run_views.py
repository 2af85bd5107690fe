"""A stored run as the API shows it: list rows, the detail view, attempt pages.

summary_public(run)                      # EvalRunSummary
detail_public(db, settings=s, run=run)   # EvalRunDetail
detail_summary(run)                      # its results, from the run's counters alone

Polled many times a second while a run goes (issue 30): the counters are the run row's (the
run sink moves them with each batch, in the batch's transaction); only what the detail view
shows beyond them (errors by type, cost, flaky rows) is reduced from the attempts, in SQL.
"""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy import case, func, select
from sqlalchemy.orm import Session

from osmosis.platform.core.db.dataset_models import DatasetVersion
from osmosis.platform.core.db.run_models import EvalAttempt, EvalRun
from osmosis.platform.core.errors import ValidationFailed
from osmosis.platform.core.settings import Settings
from osmosis.platform.services.run_files import LOG_FILE, tail_logs
from osmosis.platform.services.runs import BUDGET_KEYS, run_dir
from osmosis.platform.services.workspaces import effective_budget
from osmosis.platform.worker.leases import why_pending
from osmosis.vocabulary import ATTEMPT_STATUSES, pass_clause
from osmosis.wire.runs import (
    ATTEMPT_SORTS,
    AttemptList,
    AttemptPublic,
    DatasetRef,
    EvalRunDetail,
    EvalRunInfo,
    EvalRunSummary,
    RunCache,
    RunDetailSummary,
    RunProgress,
    RunSummary,
)

MAX_ATTEMPTS_PAGE = 200
_RECENT_LOGS = 10
_CONFIG_KEYS = (
    "limit",
    "n",
    "batch_size",
    "pass_threshold",
    "agent_workflow_timeout_s",
    "grader_timeout_s",
)


def _summary(run: EvalRun) -> RunSummary:
    scored = run.completed - run.skipped
    return RunSummary(
        avg_reward=run.avg_reward,
        pass_rate=(run.passed / scored if scored else 0.0) if run.completed else None,
        graded=run.graded,
        passed=run.passed,
        failed=run.failed,
        skipped=run.skipped,
        progress=RunProgress(completed=run.completed, total=max(run.total, run.completed)),
    )


def _fields(run: EvalRun) -> dict[str, Any]:
    creator = run.creator
    return {
        "id": run.id,
        "name": run.name,
        "status": run.status,
        "workspace": run.workspace.identity,
        "created_at": run.created_at,
        "started_at": run.started_at,
        "completed_at": run.completed_at,
        "model": run.model_path,
        "dataset": run.dataset_name,
        "rollout": run.rollout,
        "creator_name": creator.name if creator else None,
        "creator_email": creator.email if creator else None,
        "summary": _summary(run),
    }


def summary_public(run: EvalRun) -> EvalRunSummary:
    return EvalRunSummary(**_fields(run))


def duration_ms(run: EvalRun) -> float | None:
    """How long the run ran, in ms: as the engine measured it, else from its timestamps."""
    if run.duration_ms is not None:
        return run.duration_ms
    if run.started_at is not None and run.completed_at is not None:
        return round((run.completed_at - run.started_at).total_seconds() * 1000, 3)
    return None


def shown_config(run: EvalRun, *, settings: Settings) -> dict[str, Any]:
    """The run's settings as the detail view shows them (`config`)."""
    config = json.loads(run.config)
    evaluation: dict[str, Any] = config["evaluation"]
    shown = {key: evaluation.get(key) for key in _CONFIG_KEYS}
    # The run's budget as it stands (a retry may have raised it), where it has one: with the
    # workspace's default and both ceilings applied as the worker applies them (issue 28.1);
    # a run uploaded from a local run keeps the budget it ran with.
    budget: dict[str, Any] = evaluation
    if "import" not in json.loads(run.payload or "{}"):
        budget = dict(effective_budget(evaluation, run.workspace, settings).limits)
    shown.update({key: budget[key] for key in BUDGET_KEYS if budget.get(key) is not None})
    shown["model_path"] = run.model_path
    shown.update(config.get("advanced") or {})
    return shown


def pass_threshold(run: EvalRun) -> float:
    return float(json.loads(run.config)["evaluation"]["pass_threshold"])


def detail_summary(run: EvalRun) -> RunDetailSummary:
    """The run's results from its stored counters (the run sink keeps them), no attempt read."""
    summary = _summary(run)
    return RunDetailSummary(
        **summary.model_dump(exclude={"progress"}),
        progress=summary.progress,
        pass_threshold=pass_threshold(run),
        total_tokens=run.tokens,
        dataset_rows=run.dataset_rows,
        resumed_count=run.resumed_count,
    )


def dataset_ref(db: Session, *, run: EvalRun) -> DatasetRef:
    version = db.get(DatasetVersion, run.dataset_version_id) if run.dataset_version_id else None
    return DatasetRef(
        name=run.dataset_name,
        version=version.version if version else 0,
        sha256=version.sha256 if version else "",
        rows=version.rows if version else None,
        format=version.format if version else "",
    )


def flaky_rows(db: Session, *, run: EvalRun) -> list[int]:
    """Rows whose scored attempts disagree (some passed, some not), as `eval info` on a local
    run and `eval compare` reduce attempts to rows (`RowOutcome.flaky`), counted by the
    database: one row index per flaky row crosses, not every attempt."""
    scored = EvalAttempt.status != "skipped"
    passed = func.sum(case((pass_clause(EvalAttempt.reward, pass_threshold(run)), 1), else_=0))
    query = (
        select(EvalAttempt.row_index)
        .where(EvalAttempt.run_id == run.id, scored)
        .group_by(EvalAttempt.row_index)
        .having(passed > 0, passed < func.count())
        .order_by(EvalAttempt.row_index)
    )
    return [int(row) for row in db.scalars(query)]


def detail_public(db: Session, *, settings: Settings, run: EvalRun) -> EvalRunDetail:
    config = json.loads(run.config)
    errors = dict(
        db.execute(
            select(EvalAttempt.error_type, func.count())
            .where(EvalAttempt.run_id == run.id, EvalAttempt.status == "failed")
            .group_by(EvalAttempt.error_type)
            .order_by(func.count().desc(), EvalAttempt.error_type)
        ).all()
    )
    cost = db.scalar(select(func.sum(EvalAttempt.cost_usd)).where(EvalAttempt.run_id == run.id))
    metrics = json.loads(run.summary) if run.summary else None
    return EvalRunDetail(
        eval_run=EvalRunInfo(
            **_fields(run),
            duration_ms=duration_ms(run),
            error=run.error,
            waiting_reason=why_pending(db, run=run, settings=settings),
            crash_resumes=run.crash_resumes or 0,
        ),
        summary=detail_summary(run),
        config=shown_config(run, settings=settings),
        entrypoint=run.entrypoint,
        branch=run.branch,
        commit_sha=run.commit_sha,
        env_config=config.get("env") or {},
        resolved_secret_scopes=json.loads(run.secret_scopes),
        dataset=dataset_ref(db, run=run),
        metrics=metrics,
        metrics_available=metrics is not None,
        errors_by_type={str(kind): int(count) for kind, count in errors.items()},
        cost_usd=float(cost) if cost is not None else None,
        recent_logs=tail_logs(run_dir(settings, run.id) / LOG_FILE, count=_RECENT_LOGS),
        flaky_rows=flaky_rows(db, run=run),
        cache=_cache(db, run, metrics),
    )


def _cache(db: Session, run: EvalRun, metrics: dict[str, Any] | None) -> RunCache:
    """The cache mode and source run the submit decided (`services.runs.Replay`, in the
    payload), and what the record answered (metrics.json `eval_run.bridge`)."""
    payload = json.loads(run.payload or "{}")
    mode = payload.get("cache") or json.loads(run.config)["evaluation"].get("cache") or "off"
    source_id = payload.get("replay_from")
    source = db.get(EvalRun, source_id) if isinstance(source_id, str) else None
    bridge = ((metrics or {}).get("eval_run") or {}).get("bridge") or {}
    hits, misses = bridge.get("cache_hits"), bridge.get("cache_misses")
    return RunCache(
        mode=mode,
        replay_from=source.name if source is not None else source_id,
        replay_from_id=source_id,
        hits=hits if isinstance(hits, int) else None,
        misses=misses if isinstance(misses, int) else None,
    )


def attempts_page(
    db: Session,
    *,
    run: EvalRun,
    limit: int,
    offset: int,
    status: str | None,
    min_reward: float | None,
    max_reward: float | None,
    sort: str,
) -> AttemptList:
    """One page of a run's attempts, filtered and sorted for the dashboard."""
    problems = []
    if not 1 <= limit <= MAX_ATTEMPTS_PAGE or offset < 0:
        problems.append(f"limit must be 1-{MAX_ATTEMPTS_PAGE} and offset at least 0")
    if status is not None and status not in ATTEMPT_STATUSES:
        *first, last = ATTEMPT_STATUSES
        problems.append(f"status must be {', '.join(first)} or {last}, got {status!r}")
    if sort not in ATTEMPT_SORTS:
        problems.append(f"sort must be one of {', '.join(ATTEMPT_SORTS)}, got {sort!r}")
    if problems:
        raise ValidationFailed("; ".join(problems), details={"problems": problems})
    where = [EvalAttempt.run_id == run.id]
    if status is not None:
        where.append(EvalAttempt.status == status)
    if min_reward is not None:
        where.append(EvalAttempt.reward >= min_reward)
    if max_reward is not None:
        where.append(EvalAttempt.reward <= max_reward)
    column = getattr(EvalAttempt, sort.lstrip("-"))
    primary = column.desc().nulls_last() if sort.startswith("-") else column.asc().nulls_last()
    total = db.scalar(select(func.count()).select_from(EvalAttempt).where(*where)) or 0
    rows = db.scalars(
        select(EvalAttempt)
        .where(*where)
        .order_by(primary, EvalAttempt.row_index, EvalAttempt.run_index)
        .limit(limit)
        .offset(offset)
    ).all()
    more = offset + len(rows) < total
    return AttemptList(
        attempts=[AttemptPublic.model_validate(row) for row in rows],
        total_count=total,
        has_more=more,
        next_offset=offset + len(rows) if more else None,
    )
