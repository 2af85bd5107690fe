"""Evaluation-run tables: a submitted run, and one row per finished attempt.

The run's directory (`<home>/runs/<id>/`, written by the engine) is the authority for results:
its `events.jsonl` journal decides what is recorded. `eval_attempts` mirrors the journal for the
API and the dashboard (sorting, filtering, paging) and is re-synced from it after a crash.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
)
from sqlalchemy.orm import Mapped, mapped_column, relationship

from osmosis.platform.core.db.models import Base, User, UtcDateTime, Workspace, new_id, utcnow
from osmosis.vocabulary import ATTEMPT_STATUSES, RUN_STATUSES


def _one_of(statuses: tuple[str, ...]) -> str:
    """The CHECK condition allowing exactly `statuses`: `status IN ('a', 'b')`, as the
    migrations spell it (they are history and keep their own literal copy)."""
    return "status IN ({})".format(", ".join(f"'{status}'" for status in statuses))


class EvalRun(Base):
    """One submitted evaluation run: what to run, where it stands, and what it found."""

    __tablename__ = "eval_runs"
    __table_args__ = (
        CheckConstraint(_one_of(RUN_STATUSES), name="status"),
        # The list is newest first within a workspace; the scheduler takes pending runs
        # oldest first.
        Index("ix_eval_runs_workspace_created", "workspace_id", "created_at"),
        Index("ix_eval_runs_status_created", "status", "created_at"),
    )

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    name: Mapped[str] = mapped_column(String(255), unique=True)
    workspace_id: Mapped[str] = mapped_column(
        String(32), ForeignKey("workspaces.id", ondelete="CASCADE")
    )
    created_by: Mapped[str | None] = mapped_column(
        String(32), ForeignKey("users.id", ondelete="SET NULL")
    )
    status: Mapped[str] = mapped_column(String(16), default="pending")
    created_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)
    started_at: Mapped[datetime | None] = mapped_column(UtcDateTime)
    completed_at: Mapped[datetime | None] = mapped_column(UtcDateTime)

    # What was submitted. `payload` is the request without secret values; `config` is the
    # resolved evaluation config (JSON) the list and detail views show.
    payload: Mapped[str] = mapped_column(Text)
    config: Mapped[str] = mapped_column(Text)
    config_toml: Mapped[str] = mapped_column(Text)
    config_path: Mapped[str] = mapped_column(String(1024))
    rollout: Mapped[str] = mapped_column(String(255))
    entrypoint: Mapped[str] = mapped_column(String(1024))
    model_path: Mapped[str] = mapped_column(String(1024))
    dataset_name: Mapped[str] = mapped_column(String(255))
    origin_url: Mapped[str] = mapped_column(Text)
    commit_sha: Mapped[str] = mapped_column(String(40))
    branch: Mapped[str | None] = mapped_column(String(255))
    dataset_version_id: Mapped[str | None] = mapped_column(
        String(32), ForeignKey("dataset_versions.id", ondelete="SET NULL"), index=True
    )

    # Secrets: the values given for this run only, as one Fernet ciphertext of a JSON object
    # (wiped when the run ends), and where each required name resolved at submit.
    secrets_ciphertext: Mapped[str | None] = mapped_column(Text)
    secret_scopes: Mapped[str] = mapped_column(Text, default="{}")

    # Progress, kept current by the worker from the attempts it records.
    total: Mapped[int] = mapped_column(Integer, default=0)
    completed: Mapped[int] = mapped_column(Integer, default=0)
    graded: Mapped[int] = mapped_column(Integer, default=0)
    passed: Mapped[int] = mapped_column(Integer, default=0)
    failed: Mapped[int] = mapped_column(Integer, default=0)
    skipped: Mapped[int] = mapped_column(Integer, default=0)
    avg_reward: Mapped[float | None] = mapped_column(Float)
    tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    dataset_rows: Mapped[int | None] = mapped_column(Integer)
    resumed_count: Mapped[int] = mapped_column(Integer, default=0)
    # Resumes after its worker process was killed by a signal (`OSMOSIS_RUN_CRASH_RESUMES`).
    crash_resumes: Mapped[int] = mapped_column(Integer, default=0)

    # Results and control.
    summary: Mapped[str | None] = mapped_column(Text)  # metrics.json, as the engine wrote it
    duration_ms: Mapped[float | None] = mapped_column(Float)
    error: Mapped[str | None] = mapped_column(Text)
    stop_requested: Mapped[bool] = mapped_column(Boolean, default=False)
    retry_failed: Mapped[bool] = mapped_column(Boolean, default=False)
    worker_pid: Mapped[int | None] = mapped_column(Integer)

    # The lease of the worker process executing the run (`osmosis.platform.worker.leases`): who
    # holds it (a `platform_processes` id), when it was last renewed and when it runs out.
    # `lease_epoch` counts the claims: the holder's every write names it, so a worker that
    # lost its lease cannot end a run another worker has taken over.
    claimed_by: Mapped[str | None] = mapped_column(String(32))
    heartbeat_at: Mapped[datetime | None] = mapped_column(UtcDateTime)
    lease_expires_at: Mapped[datetime | None] = mapped_column(UtcDateTime)
    lease_epoch: Mapped[int] = mapped_column(Integer, default=0)

    workspace: Mapped[Workspace] = relationship()
    creator: Mapped[User | None] = relationship(foreign_keys=[created_by])


class EvalAttempt(Base):
    """One recorded attempt of a run, as its journal holds it (the latest line per slot)."""

    __tablename__ = "eval_attempts"
    __table_args__ = (
        CheckConstraint(_one_of(ATTEMPT_STATUSES), name="status"),
        # The dashboard's filters and sorts within one run.
        Index("ix_eval_attempts_run_status", "run_id", "status"),
        Index("ix_eval_attempts_run_reward", "run_id", "reward"),
        Index("ix_eval_attempts_run_duration", "run_id", "duration_ms"),
    )

    run_id: Mapped[str] = mapped_column(
        String(32), ForeignKey("eval_runs.id", ondelete="CASCADE"), primary_key=True
    )
    row_index: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_index: Mapped[int] = mapped_column(Integer, primary_key=True)
    source_row_index: Mapped[int | None] = mapped_column(Integer)
    """The row's position in the dataset file (`row_index` is its place in the selection)."""
    rollout_id: Mapped[str] = mapped_column(String(32))
    status: Mapped[str] = mapped_column(String(16))
    reward: Mapped[float | None] = mapped_column(Float)
    tokens: Mapped[int | None] = mapped_column(Integer)
    duration_ms: Mapped[float] = mapped_column(Float)
    error_type: Mapped[str | None] = mapped_column(String(255))
    cost_usd: Mapped[float | None] = mapped_column(Float)
    finished_at: Mapped[datetime] = mapped_column(UtcDateTime)
