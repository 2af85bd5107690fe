"""`/api/cli/eval-runs`: `osmosis eval submit|list|info|logs|stop|retry|download` of the
official CLI, over the same runs as `/api/eval-runs`.

A submit carries the config's values only: the server takes the code from the workspace's
origin (rewritten by `OSMOSIS_GIT_URL_REWRITE`), resolves the commit with `git ls-remote`,
writes the config text, and queues the run through the same checks as our own submit
(`osmosis.platform.services.submit_source`, `runs.create_run`).

Runs are shown in the official shapes: model, dataset and rollout as `{name}` objects, the
results line as `results{score, pass_rate, ...}`, metrics as `{status, overview, reward_stats,
pass_at_k}`. Sample files are fetched through capability URLs (`samples/download-urls`).
"""

from __future__ import annotations

import json
import re
import time
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from pydantic import ValidationError

from osmosis.platform.api import eval_runs as ours
from osmosis.platform.core.db.run_models import EvalRun
from osmosis.platform.core.errors import ValidationFailed
from osmosis.platform.core.settings import Settings
from osmosis.platform.deps import CurrentUser, Db, Offset
from osmosis.platform.services import run_files, run_views, runs, submit_source, url_rewrite
from osmosis.platform.services.capability_urls import TTL_S, CapabilitySigner
from osmosis.platform.services.origins import parse_clone_allow
from osmosis.platform.worker.scheduler import Scheduler
from osmosis.wire.official import (
    MAX_CLI_LOG_PAGE,
    MAX_CLI_PAGE,
    DownloadUrl,
    DownloadUrls,
    DownloadUrlsIn,
    EvalMetricsOverview,
    EvalResults,
    EvalRewardStats,
    EvalRunHeader,
    EvalRunMetricsView,
    EvalRunRetriedView,
    EvalRunRetryIn,
    EvalRunRow,
    EvalRunRows,
    EvalRunSubmitIn,
    EvalRunView,
    LogEntry,
    LogsPage,
    NameRef,
    PassAtK,
)
from osmosis.wire.runs import (
    EvalRunCreate,
    EvalRunCreated,
    EvalRunOperation,
    EvalRunRetry,
    FileManifest,
    RepositoryRef,
    RunSummary,
)

from .deps import CliWorkspace
from .errors import OfficialRoute

router = APIRouter(prefix="/eval-runs", route_class=OfficialRoute)

RUN_FILE = "run-file"
"""The capability URL purpose of one file of a run's download layout: `<run id>/<path>`."""


def _settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


def _iso(value: Any) -> str | None:
    return value.isoformat() if value is not None else None


def _metrics_summary(run: EvalRun) -> dict[str, Any] | None:
    """The reference metrics of a finished run (`osmosis.eval.results.metrics.summarize`)."""
    if not run.summary:
        return None
    stored: dict[str, Any] = json.loads(run.summary)
    summary = stored.get("summary", stored)
    return summary if isinstance(summary, dict) else None


def _reward_stats(metrics: dict[str, Any] | None) -> EvalRewardStats | None:
    if metrics is None or not isinstance(metrics.get("reward_stats"), dict):
        return None
    pass_at_k = {str(p["k"]): float(p["value"]) for p in metrics.get("pass_at_k") or []}
    return EvalRewardStats(**metrics["reward_stats"], pass_at_k=pass_at_k)


def results(run: EvalRun, summary: RunSummary) -> EvalResults:
    """The results line, from the same counters as our own list and detail views."""
    return EvalResults(
        score=summary.avg_reward,
        pass_rate=summary.pass_rate,
        graded=summary.graded,
        passed=summary.passed,
        failed=summary.failed,
        skipped=summary.skipped,
        total_runs=summary.progress.completed,
        sampled_rows=run.dataset_rows,
        reward_stats=_reward_stats(_metrics_summary(run)),
    )


def row(run: EvalRun) -> EvalRunRow:
    public = run_views.summary_public(run)
    return EvalRunRow(
        id=run.id,
        name=run.name,
        status=run.status,
        created_at=run.created_at.isoformat(),
        started_at=_iso(run.started_at),
        completed_at=_iso(run.completed_at),
        model=NameRef(name=public.model),
        dataset=NameRef(name=public.dataset),
        rollout=NameRef(name=public.rollout),
        creator_name=public.creator_name,
        creator_email=public.creator_email,
        results=results(run, public.summary),
    )


@router.get("")
def list_eval_runs(
    db: Db,
    user: CurrentUser,
    workspace: CliWorkspace,
    limit: Annotated[int, Query(ge=1, le=MAX_CLI_PAGE)] = MAX_CLI_PAGE,
    offset: Offset = 0,
) -> EvalRunRows:
    """The workspace's runs, newest first."""
    page = runs.list_runs(db, user=user, workspace=workspace, limit=limit, offset=offset)
    return EvalRunRows(
        eval_runs=[row(run) for run in page.runs],
        total_count=page.total_count,
        has_more=page.has_more,
        next_offset=page.next_offset,
    )


_UNSAFE_STEM = re.compile(r"[^A-Za-z0-9_-]+")


@router.post("", status_code=201)
def submit_eval_run(
    body: EvalRunSubmitIn, db: Db, user: CurrentUser, workspace: CliWorkspace, request: Request
) -> EvalRunCreated:
    """Queue a run from the config's values alone, as `osmosis eval submit` sends them.

    The commit is the config's `commit_sha`, else its `branch`'s tip, else the default
    branch's, on the workspace's origin. The config text is written from the values; the run
    is named after the rollout (`<rollout>-calm-falcon-ac71`)."""
    settings = _settings(request)
    experiment = body.experiment_config
    origin = url_rewrite.workspace_origin(workspace.identity)
    url = url_rewrite.clone_url(
        workspace.identity, url_rewrite.parse_url_rewrite(settings.git_url_rewrite)
    )
    source = submit_source.resolve_commit(
        url,
        branch=experiment.branch,
        commit_sha=experiment.commit_sha,
        allow=parse_clone_allow(settings.clone_allow),
    )
    stem = _UNSAFE_STEM.sub("-", experiment.rollout).strip("-") or "eval"
    try:
        create = _our_submit(body, stem=stem, origin=origin, source=source)
    except ValidationError as error:  # e.g. a SHA-256 repository's 64-digit commit ids
        raise ValidationFailed(f"this submit cannot be queued: {error}") from None
    run = runs.create_run(
        db,
        settings=settings,
        box=request.app.state.secret_box,
        workspace=workspace,
        user=user,
        body=create,
        # The run records what the worker clones (checked against OSMOSIS_CLONE_ALLOW again
        # before every clone), from its first commit: no worker ever sees the GitHub name.
        clone_url=url if url != origin else None,
    )
    scheduler: Scheduler = request.app.state.scheduler
    scheduler.wake()
    return EvalRunCreated(id=run.id, name=run.name, status="pending", created_at=run.created_at)


def _our_submit(
    body: EvalRunSubmitIn, *, stem: str, origin: str, source: submit_source.Source
) -> EvalRunCreate:
    """Our submit's body for the official one: the config text written, the commit resolved."""
    experiment = body.experiment_config
    return EvalRunCreate(
        experiment_config=experiment,
        evaluation_config=body.evaluation_config,
        env_config=body.env_config,
        advanced_config=body.advanced_config,
        secrets=body.secrets,
        # Not a file of the repository: where the worker writes the config in the checkout.
        config_path=f"configs/eval/official-cli/{stem}.toml",
        config_toml=submit_source.config_text(
            experiment=experiment.model_dump(exclude_none=True),
            evaluation=body.evaluation_config,
            advanced=body.advanced_config,
            env=body.env_config,
            required=body.secrets.required,
        ),
        repository=RepositoryRef(
            origin_url=origin, commit_sha=source.commit_sha, branch=source.branch
        ),
    )


@router.get("/{run}")
def get_eval_run(run: str, db: Db, user: CurrentUser, request: Request) -> EvalRunView:
    """One run: what it ran, how, and its results (from the run's counters: no attempt is
    read, as the official CLI polls this while a run goes)."""
    found = runs.find_run(db, user=user, ref=run)
    summary = run_views.detail_summary(found)
    line = results(found, summary)
    line.pass_threshold = summary.pass_threshold
    line.total_tokens = summary.total_tokens
    line.total_dataset_rows = run_views.dataset_ref(db, run=found).rows
    line.resumed_count = summary.resumed_count
    creator = found.creator
    return EvalRunView(
        eval_run=EvalRunHeader(
            id=found.id,
            name=found.name,
            status=found.status,
            created_at=found.created_at.isoformat(),
            started_at=_iso(found.started_at),
            completed_at=_iso(found.completed_at),
            creator_name=creator.name if creator else None,
            creator_email=creator.email if creator else None,
        ),
        config=run_views.shown_config(found, settings=_settings(request)),
        results=line,
        dataset=NameRef(name=found.dataset_name),
        rollout=NameRef(name=found.rollout),
        entrypoint=found.entrypoint,
        branch=found.branch,
        commit_sha=found.commit_sha,
        env_config=json.loads(found.config).get("env") or {},
        resolved_secret_scopes={k: str(v) for k, v in json.loads(found.secret_scopes).items()},
    )


@router.get("/{run}/metrics")
def eval_run_metrics(run: str, db: Db, user: CurrentUser) -> EvalRunMetricsView:
    """The reference metrics once a run has them; its counters until then."""
    found = runs.find_run(db, user=user, ref=run)
    metrics = _metrics_summary(found)
    duration = run_views.duration_ms(found)
    if metrics is not None:
        overview = EvalMetricsOverview(
            duration_ms=round(duration) if duration is not None else None,
            **{key: metrics.get(key) for key in _OVERVIEW_KEYS},
        )
        pass_at_k = [PassAtK(k=p["k"], value=p["value"]) for p in metrics.get("pass_at_k") or []]
    else:
        counters = run_views.detail_summary(found)
        overview = EvalMetricsOverview(
            duration_ms=round(duration) if duration is not None else None,
            total_samples=counters.progress.total,
            completed_samples=counters.progress.completed,
            graded=counters.graded,
            passed=counters.passed,
            failed=counters.failed,
            skipped=counters.skipped,
            pass_rate=counters.pass_rate,
            pass_threshold=counters.pass_threshold,
            tokens_used=counters.total_tokens,
        )
        pass_at_k = []
    return EvalRunMetricsView(
        status=found.status,
        overview=overview,
        reward_stats=_reward_stats(metrics),
        pass_at_k=pass_at_k,
    )


_OVERVIEW_KEYS = (
    "total_samples",
    "completed_samples",
    "graded",
    "passed",
    "failed",
    "skipped",
    "pass_rate",
    "pass_threshold",
    "tokens_used",
)


@router.get("/{run}/logs")
def eval_run_logs(
    run: str,
    db: Db,
    user: CurrentUser,
    request: Request,
    limit: Annotated[int, Query(ge=1, le=MAX_CLI_LOG_PAGE)] = MAX_CLI_PAGE,
    cursor: Annotated[str | None, Query(max_length=64)] = None,
    direction: Annotated[str, Query(pattern="^(older|newer)$")] = "older",
) -> LogsPage:
    """Log entries oldest first from `cursor`; `direction` is accepted, pages run forward."""
    found = runs.find_run(db, user=user, ref=run)
    path = runs.run_dir(_settings(request), found.id) / run_files.LOG_FILE
    page = run_files.read_logs(path, cursor=cursor, limit=limit)
    return LogsPage(
        logs=[
            LogEntry(
                timestamp=_iso(entry.timestamp) or "",
                level=entry.level,
                step=entry.step,
                message=entry.message,
            )
            for entry in page.entries
        ],
        next_cursor=page.next_cursor,
    )


@router.post("/{run}/stop")
def stop_eval_run(run: str, db: Db, user: CurrentUser, request: Request) -> EvalRunOperation:
    """Stop a pending or running run, as `/api/eval-runs/{run}/stop` does."""
    return ours.stop_eval_run(run, db, user, request)


@router.post("/{run}/retry")
def retry_eval_run(
    run: str, db: Db, user: CurrentUser, request: Request, body: EvalRunRetryIn | None = None
) -> EvalRunRetriedView:
    """Run the failed and skipped attempts again, as `/api/eval-runs/{run}/retry` does."""
    given = EvalRunRetry(secrets=(body.secrets if body else None) or {})
    retried = ours.retry_eval_run(run, db, user, request, given)
    return EvalRunRetriedView(
        id=retried.id,
        name=retried.name,
        status=retried.status,
        workflow_id=retried.id,
        retryable_samples=retried.retryable_samples,
    )


@router.get("/{run}/samples/manifest")
def samples_manifest(
    run: str,
    db: Db,
    user: CurrentUser,
    request: Request,
    types: Annotated[str | None, Query(max_length=200)] = None,
    rows: Annotated[str | None, Query(max_length=2000)] = None,
) -> FileManifest:
    """The downloadable files of the run (path, size, sha256, type), as `/files` lists them."""
    return ours.eval_run_files(run, db, user, request, types=types, rows=rows)


@router.post("/{run}/samples/download-urls")
def samples_download_urls(
    run: str, body: DownloadUrlsIn, db: Db, user: CurrentUser, request: Request
) -> DownloadUrls:
    """A capability URL per file asked for: `GET` it, without a token, for `TTL_S` seconds."""
    found = runs.find_run(db, user=user, ref=run)
    directory = runs.run_dir(_settings(request), found.id)
    signer: CapabilitySigner = request.app.state.capability_signer
    now = time.time()
    items = []
    for item in body.items:
        run_files.layout_file(directory, item.path)  # a path outside the layout: refused here
        url = signer.url(
            str(request.base_url),
            method="GET",
            purpose=RUN_FILE,
            object_id=f"{found.id}/{item.path}",
            now=now,
        )
        items.append(DownloadUrl(path=item.path, url=url, token=item.token))
    return DownloadUrls(items=items, expires_in=TTL_S)
