"""The platform as a dashboard source: the database, scoped to the signed-in viewer, and each
run's directory in the blob store (`runs.run_dir`: `<home>/runs/<id>/`, or the shared
`OSMOSIS_BLOB_DIR`'s `runs/<id>/`), so any API process shows any run, finished or running,
whichever worker writes it.

    source = PlatformSource(db, viewer=viewer, settings=settings, indexes=cache)

A run page's numbers are `detail_public`'s (what `GET /api/eval-runs/{run}` and `eval info`
show); a run's samples are read from its journal like a local run's, since the journal is the
authority the `eval_attempts` table mirrors and it alone holds error messages and dataset
rows. A run without a journal is read from the table.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from fastapi import Request
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from osmosis.eval.results.metrics import summarize
from osmosis.platform.core.db.dataset_models import DatasetVersion
from osmosis.platform.core.db.run_models import EvalAttempt, EvalRun
from osmosis.platform.core.settings import Settings
from osmosis.platform.services import datasets, runs, secrets
from osmosis.platform.services.run_views import detail_public
from osmosis.platform.web import run_queries
from osmosis.platform.web.samples_index import DatasetFile, IndexCache, SampleIndex
from osmosis.platform.web.session import Viewer, page_viewer
from osmosis.platform.web.source import (
    FilterChoices,
    RunDetail,
    RunFilters,
    RunsPage,
    RunView,
    Tally,
)
from osmosis.vocabulary import RUN_STATUSES
from osmosis.wire.runs import EvalRunDetail, EvalRunSummary


class PlatformSource:
    """Runs of the workspaces `viewer` belongs to."""

    read_only = False

    def __init__(
        self,
        db: Session,
        *,
        viewer: Viewer,
        settings: Settings,
        indexes: IndexCache,
        sessions: sessionmaker[Session],
    ) -> None:
        self.db = db
        self.sessions = sessions
        self.viewer: Viewer | None = viewer
        self.settings = settings
        self._indexes = indexes
        self._orm: dict[str, EvalRun] = {}

    @property
    def user(self) -> Any:
        assert self.viewer is not None
        return self.viewer.user

    def list_runs(self, filters: RunFilters, *, limit: int, offset: int) -> RunsPage:
        page = run_queries.list_runs(
            self.db, user=self.user, filters=filters, limit=limit, offset=offset
        )
        return RunsPage(
            rows=[_view(row.run, row.public) for row in page.rows],
            total=page.total,
            offset=page.offset,
            limit=page.limit,
            params=page.params,
        )

    def filter_choices(self) -> FilterChoices:
        found = run_queries.filter_choices(self.db, user=self.user)
        return FilterChoices(
            statuses=RUN_STATUSES,
            datasets=found.datasets,
            models=found.models,
            rollouts=found.rollouts,
            workspaces=found.workspaces,
        )

    def find(self, ref: str) -> RunView:
        run = runs.find_run(self.db, user=self.user, ref=ref)
        self._orm[run.name] = run
        detail = detail_public(self.db, settings=self.settings, run=run)
        return _view(run, detail.eval_run, detail)

    def orm(self, view: RunView) -> EvalRun:
        return self._orm.get(view.ref) or runs.find_run(self.db, user=self.user, ref=view.ref)

    def run_dir(self, run: RunView) -> Path:
        return runs.run_dir(self.settings, run.id)

    def results(self, run: RunView) -> dict[str, Any]:
        orm = self.orm(run)
        written = run_queries.run_metrics(orm)
        if written is not None:
            return written
        attempts = run_queries.attempt_columns(self.db, run=orm)
        return summarize(attempts, pass_threshold=run_queries.pass_threshold(orm))

    def rewards(self, run: RunView) -> list[float]:
        return run_queries.reward_values(self.db, run=self.orm(run))

    def samples(self, run: RunView) -> SampleIndex:
        orm = self.orm(run)
        directory = self.run_dir(run)
        version = (
            self.db.get(DatasetVersion, orm.dataset_version_id) if orm.dataset_version_id else None
        )
        sessions = self.sessions

        def make() -> SampleIndex:
            # Blobs are named by their SHA-256, so the file is the version's bytes.
            dataset = (
                DatasetFile(datasets.version_path(self.settings, version)) if version else None
            )
            return SampleIndex(
                directory,
                pass_threshold=run_queries.pass_threshold(orm),
                dataset=dataset,
                fallback=lambda: _attempt_rows(sessions, orm.id),
            )

        return self._indexes.get(str(directory), make)


def _attempt_rows(sessions: sessionmaker[Session], run_id: str) -> list[Any]:
    # A session of its own: the index outlives the request that made it.
    with sessions() as db:
        return list(db.scalars(select(EvalAttempt).where(EvalAttempt.run_id == run_id)))


def _view(run: EvalRun, public: EvalRunSummary, detail: EvalRunDetail | None = None) -> RunView:
    summary = public.summary
    return RunView(
        ref=run.name,
        id=run.id,
        name=run.name,
        status=public.status,
        dataset=public.dataset,
        model=public.model,
        rollout=public.rollout,
        workspace=public.workspace,
        creator=public.creator_name,
        tally=Tally(
            completed=summary.progress.completed,
            total=summary.progress.total,
            graded=summary.graded,
            passed=summary.passed,
            failed=summary.failed,
            skipped=summary.skipped,
            tokens=run.tokens,
            avg_reward=summary.avg_reward,
            pass_rate=summary.pass_rate,
        ),
        created_at=public.created_at,
        started_at=public.started_at,
        completed_at=public.completed_at,
        duration_ms=detail.eval_run.duration_ms if detail else None,
        error=detail.eval_run.error if detail else None,
        stop_requested=run.stop_requested,
        detail=_detail(run, detail) if detail else None,
    )


def _detail(run: EvalRun, detail: EvalRunDetail) -> RunDetail:
    return RunDetail(
        config=dict(detail.config),
        config_path=run.config_path,
        entrypoint=detail.entrypoint,
        branch=detail.branch,
        commit_sha=detail.commit_sha,
        env=dict(detail.env_config),
        # The word users see: a personal secret, not the wire value `user`.
        secret_scopes={
            str(name): "personal" if scope == secrets.USER else str(scope)
            for name, scope in detail.resolved_secret_scopes.items()
        },
        dataset_version=detail.dataset.version or None,
        dataset_rows=detail.dataset.rows,
        dataset_sha256=detail.dataset.sha256 or None,
        pass_threshold=detail.summary.pass_threshold,
        cost_usd=detail.cost_usd,
        errors_by_type=dict(detail.errors_by_type),
    )


def platform_sources(request: Request) -> Iterator[PlatformSource]:
    """`app.state.run_source` of the platform: a session and the signed-in viewer (a visitor
    who is not signed in is sent to the login page)."""
    with request.app.state.sessions() as db:
        viewer = page_viewer(request, db)
        yield PlatformSource(
            db,
            viewer=viewer,
            settings=request.app.state.settings,
            indexes=request.app.state.sample_indexes,
            sessions=request.app.state.sessions,
        )
