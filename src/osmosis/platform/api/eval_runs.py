"""Evaluation-run routes: submit, list, detail, logs, stop, retry, files and attempts, and
the import of finished local runs (`/imports`, `osmosis eval upload`).

Every `{run}` is a name or an id, looked up among the caller's workspaces; a run elsewhere is a
404 that does not say whether it exists.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import APIRouter, Header, Query, Request
from fastapi.responses import FileResponse

from osmosis.platform.core.db.run_models import EvalRun
from osmosis.platform.core.errors import Conflict, ValidationFailed
from osmosis.platform.core.settings import Settings
from osmosis.platform.deps import CurrentUser, CurrentWorkspace, Db, Offset, Rules, scope_identity
from osmosis.platform.services import run_files, run_upload, run_views, runs, workspaces
from osmosis.platform.worker.scheduler import Scheduler
from osmosis.vocabulary import MAX_PAGE, TERMINAL_RUN_STATUSES
from osmosis.wire.official import WORKSPACE_HEADER
from osmosis.wire.runs import (
    ATTEMPT_SORTS,
    AttemptList,
    EvalRunCreate,
    EvalRunCreated,
    EvalRunDetail,
    EvalRunList,
    EvalRunLogs,
    EvalRunOperation,
    EvalRunRetried,
    EvalRunRetry,
    EvalRunStop,
    FileManifest,
    ImportFileState,
    RunImportCreate,
    RunImportSession,
)

router = APIRouter(prefix="/api/eval-runs", tags=["eval runs"])

RunRef = Annotated[str, "a run's name or id"]
_STOP_WAIT_SEC = 20.0


def _settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


def _scheduler(request: Request) -> Scheduler:
    scheduler: Scheduler = request.app.state.scheduler
    return scheduler


@router.post("", status_code=201)
def submit_eval_run(
    body: EvalRunCreate,
    db: Db,
    user: CurrentUser,
    workspace: CurrentWorkspace,
    request: Request,
) -> EvalRunCreated:
    """Check the config, dataset and secrets, then queue the run (`pending`)."""
    run = runs.create_run(
        db,
        settings=_settings(request),
        box=request.app.state.secret_box,
        workspace=workspace,
        user=user,
        body=body,
    )
    _scheduler(request).wake()
    return EvalRunCreated(id=run.id, name=run.name, status="pending", created_at=run.created_at)


@router.get("")
def list_eval_runs(
    db: Db,
    user: CurrentUser,
    rules: Rules,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = MAX_PAGE,
    offset: Offset = 0,
    all: Annotated[bool, Query(description="Every workspace of the caller.")] = False,
    x_osmosis_git: Annotated[str | None, Header(alias="X-Osmosis-Git")] = None,
    x_osmosis_workspace: Annotated[str | None, Header(alias=WORKSPACE_HEADER)] = None,
) -> EvalRunList:
    """Runs newest first, of the workspace in `X-Osmosis-Git` (or `X-Osmosis-Workspace`) or
    (`all=true`) of every one."""
    workspace = None
    if not all:
        identity = scope_identity(x_osmosis_git, x_osmosis_workspace)
        if identity is None:
            raise workspaces.GitScopeHeaderRequired(
                f"send the {workspaces.GIT_HEADER} or {WORKSPACE_HEADER} header, or all=true "
                "for every workspace",
                details={"header": workspaces.GIT_HEADER},
            )
        # Through the creation policy, as every workspace-scoped route (issue 13.3).
        workspace = workspaces.open_workspace(db, identity=identity, user=user, rules=rules)
    page = runs.list_runs(db, user=user, workspace=workspace, limit=limit, offset=offset)
    return EvalRunList(
        eval_runs=[run_views.summary_public(run) for run in page.runs],
        total_count=page.total_count,
        has_more=page.has_more,
        next_offset=page.next_offset,
    )


@router.get("/{run}")
def get_eval_run(run: RunRef, db: Db, user: CurrentUser, request: Request) -> EvalRunDetail:
    found = runs.find_run(db, user=user, ref=run)
    return run_views.detail_public(db, settings=_settings(request), run=found)


@router.get("/{run}/logs")
def eval_run_logs(
    run: RunRef,
    db: Db,
    user: CurrentUser,
    request: Request,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
    cursor: str | None = None,
) -> EvalRunLogs:
    """Log entries oldest first, from `cursor` (a `next_cursor` of an earlier page)."""
    found = runs.find_run(db, user=user, ref=run)
    path = runs.run_dir(_settings(request), found.id) / run_files.LOG_FILE
    page = run_files.read_logs(path, cursor=cursor, limit=limit)
    return EvalRunLogs(logs=page.entries, next_cursor=page.next_cursor, end_cursor=page.end_cursor)


@router.post("/{run}/stop")
def stop_eval_run(
    run: RunRef, db: Db, user: CurrentUser, request: Request, body: EvalRunStop | None = None
) -> EvalRunOperation:
    """Stop a pending or running run; what finished is kept and its metrics computed."""
    found = runs.find_run(db, user=user, ref=run)
    if not runs.request_stop(db, run=found):
        _scheduler(request).stop_worker(found.id)
        _wait_until_terminal(db, found)
    if found.status == "stopped":
        message = f'Evaluation run "{found.name}" stopped.'
    elif found.status in TERMINAL_RUN_STATUSES:  # it ended on its own while the stop was on its way
        message = f'Evaluation run "{found.name}" {found.status} before it could be stopped.'
    else:
        message = f'Evaluation run "{found.name}" is stopping; what finished is kept.'
    return EvalRunOperation(id=found.id, name=found.name, status=found.status, message=message)


def _wait_until_terminal(db: Db, run: EvalRun) -> None:
    # The worker writes the outputs for what finished, then marks the run; a short wait lets
    # the answer say `stopped` in the common case without holding the request for long.
    deadline = time.monotonic() + _STOP_WAIT_SEC
    while time.monotonic() < deadline:
        db.refresh(run)
        if run.status in TERMINAL_RUN_STATUSES:
            return
        time.sleep(0.1)


@router.post("/{run}/retry")
def retry_eval_run(
    run: RunRef, db: Db, user: CurrentUser, request: Request, body: EvalRunRetry | None = None
) -> EvalRunRetried:
    """Run the failed and skipped attempts again (fresh rollout ids); metrics are recomputed."""
    found = runs.find_run(db, user=user, ref=run)
    given = body or EvalRunRetry()
    raised = given.model_dump(include=set(runs.BUDGET_KEYS), exclude_none=True)
    retryable = runs.request_retry(
        db,
        box=request.app.state.secret_box,
        run=found,
        secrets=given.secrets,
        budget=raised,
    )
    _scheduler(request).wake()
    evaluation = json.loads(found.config)["evaluation"]
    return EvalRunRetried(
        id=found.id,
        name=found.name,
        status=found.status,
        retryable_samples=retryable,
        # A raised limit still meets the workspace's and the platform's ceilings: say so.
        budget_clamped=workspaces.raised_budget_clamps(
            evaluation, found.workspace, _settings(request), raised
        ),
    )


@router.get("/{run}/files")
def eval_run_files(
    run: RunRef,
    db: Db,
    user: CurrentUser,
    request: Request,
    types: str | None = None,
    rows: str | None = None,
) -> FileManifest:
    """The downloadable files: path, size, sha256 and type (default metrics, trajectories)."""
    found = runs.find_run(db, user=user, ref=run)
    chosen, selected = run_files.parse_types(types), run_files.parse_rows(rows)
    if found.status == "pending":
        raise Conflict(
            f'eval run "{found.name}" is pending: its files exist once it runs',
            details={"eval_run": found.name, "status": found.status},
        )
    directory = runs.run_dir(_settings(request), found.id)
    return run_files.file_manifest(directory, types=chosen, rows=selected)


@router.get("/{run}/files/{path:path}", response_class=FileResponse)
def download_eval_run_file(
    run: RunRef, path: str, db: Db, user: CurrentUser, request: Request
) -> FileResponse:
    """One file of the download layout, as bytes."""
    found = runs.find_run(db, user=user, ref=run)
    file = run_files.layout_file(runs.run_dir(_settings(request), found.id), path)
    return FileResponse(file, media_type="application/octet-stream")


@router.get("/{run}/attempts")
def eval_run_attempts(
    run: RunRef,
    db: Db,
    user: CurrentUser,
    limit: Annotated[int, Query(ge=1, le=run_views.MAX_ATTEMPTS_PAGE)] = 50,
    offset: Offset = 0,
    status: str | None = None,
    min_reward: float | None = None,
    max_reward: float | None = None,
    sort: Annotated[str, Query(description=", ".join(ATTEMPT_SORTS))] = "row_index",
) -> AttemptList:
    """The run's attempts, filtered by status and reward, sorted, one page at a time."""
    found = runs.find_run(db, user=user, ref=run)
    return run_views.attempts_page(
        db,
        run=found,
        limit=limit,
        offset=offset,
        status=status,
        min_reward=min_reward,
        max_reward=max_reward,
        sort=sort,
    )


# -- imports of finished local runs (`osmosis eval upload`; see services.run_upload) --
@router.post("/imports")
def start_run_import(
    body: RunImportCreate, db: Db, user: CurrentUser, workspace: CurrentWorkspace, request: Request
) -> RunImportSession:
    """Start, or resume, the upload of a finished local run; `pending` files are to be sent."""
    return run_upload.start_import(
        db, settings=_settings(request), workspace=workspace, user=user, body=body
    )


@router.put("/imports/{session}/files/{path:path}")
async def upload_run_import_file(
    session: str, path: str, db: Db, user: CurrentUser, request: Request
) -> ImportFileState:
    """One declared file as the raw body, checked against its declared size and SHA-256."""
    from starlette.requests import ClientDisconnect

    async def chunks() -> AsyncIterator[bytes]:
        try:
            async for chunk in request.stream():
                yield chunk
        except ClientDisconnect:
            raise ValidationFailed(f"the upload of {path} was interrupted") from None

    return await run_upload.receive_file(
        db, settings=_settings(request), user=user, session_id=session, path=path, chunks=chunks()
    )


@router.post("/imports/{session}/finalize")
def finalize_run_import(
    session: str, db: Db, user: CurrentUser, request: Request
) -> RunImportSession:
    """Check the complete run and store it as a finished run of the workspace."""
    return run_upload.finalize_import(
        db, settings=_settings(request), user=user, session_id=session
    )
