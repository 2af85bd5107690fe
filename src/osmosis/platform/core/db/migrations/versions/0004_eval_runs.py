"""Evaluation runs and their recorded attempts.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "eval_runs",
        sa.Column("id", sa.String(32), nullable=False),
        sa.Column("name", sa.String(255), nullable=False),
        sa.Column("workspace_id", sa.String(32), nullable=False),
        sa.Column("created_by", sa.String(32), nullable=True),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("completed_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("payload", sa.Text(), nullable=False),
        sa.Column("config", sa.Text(), nullable=False),
        sa.Column("config_toml", sa.Text(), nullable=False),
        sa.Column("config_path", sa.String(1024), nullable=False),
        sa.Column("rollout", sa.String(255), nullable=False),
        sa.Column("entrypoint", sa.String(1024), nullable=False),
        sa.Column("model_path", sa.String(1024), nullable=False),
        sa.Column("dataset_name", sa.String(255), nullable=False),
        sa.Column("origin_url", sa.Text(), nullable=False),
        sa.Column("commit_sha", sa.String(40), nullable=False),
        sa.Column("branch", sa.String(255), nullable=True),
        sa.Column("dataset_version_id", sa.String(32), nullable=True),
        sa.Column("secrets_ciphertext", sa.Text(), nullable=True),
        sa.Column("secret_scopes", sa.Text(), nullable=False),
        sa.Column("total", sa.Integer(), nullable=False),
        sa.Column("completed", sa.Integer(), nullable=False),
        sa.Column("graded", sa.Integer(), nullable=False),
        sa.Column("passed", sa.Integer(), nullable=False),
        sa.Column("failed", sa.Integer(), nullable=False),
        sa.Column("skipped", sa.Integer(), nullable=False),
        sa.Column("avg_reward", sa.Float(), nullable=True),
        sa.Column("tokens", sa.BigInteger(), nullable=False),
        sa.Column("dataset_rows", sa.Integer(), nullable=True),
        sa.Column("resumed_count", sa.Integer(), nullable=False),
        sa.Column("summary", sa.Text(), nullable=True),
        sa.Column("duration_ms", sa.Float(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("stop_requested", sa.Boolean(), nullable=False),
        sa.Column("retry_failed", sa.Boolean(), nullable=False),
        sa.Column("worker_pid", sa.Integer(), nullable=True),
        sa.CheckConstraint(
            "status IN ('pending', 'running', 'finished', 'failed', 'stopped')",
            name="ck_eval_runs_status",
        ),
        sa.ForeignKeyConstraint(
            ["workspace_id"],
            ["workspaces.id"],
            name="fk_eval_runs_workspace_id_workspaces",
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["created_by"], ["users.id"], name="fk_eval_runs_created_by_users", ondelete="SET NULL"
        ),
        sa.ForeignKeyConstraint(
            ["dataset_version_id"],
            ["dataset_versions.id"],
            name="fk_eval_runs_dataset_version_id_dataset_versions",
            ondelete="SET NULL",
        ),
        sa.PrimaryKeyConstraint("id", name="pk_eval_runs"),
        sa.UniqueConstraint("name", name="uq_eval_runs_name"),
    )
    op.create_index("ix_eval_runs_workspace_created", "eval_runs", ["workspace_id", "created_at"])
    op.create_index("ix_eval_runs_status_created", "eval_runs", ["status", "created_at"])
    op.create_index("ix_eval_runs_dataset_version_id", "eval_runs", ["dataset_version_id"])
    op.create_table(
        "eval_attempts",
        sa.Column("run_id", sa.String(32), nullable=False),
        sa.Column("row_index", sa.Integer(), nullable=False),
        sa.Column("run_index", sa.Integer(), nullable=False),
        sa.Column("rollout_id", sa.String(32), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("reward", sa.Float(), nullable=True),
        sa.Column("tokens", sa.Integer(), nullable=True),
        sa.Column("duration_ms", sa.Float(), nullable=False),
        sa.Column("error_type", sa.String(255), nullable=True),
        sa.Column("cost_usd", sa.Float(), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint(
            "status IN ('success', 'failed', 'skipped')", name="ck_eval_attempts_status"
        ),
        sa.ForeignKeyConstraint(
            ["run_id"],
            ["eval_runs.id"],
            name="fk_eval_attempts_run_id_eval_runs",
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("run_id", "row_index", "run_index", name="pk_eval_attempts"),
    )
    op.create_index("ix_eval_attempts_run_status", "eval_attempts", ["run_id", "status"])
    op.create_index("ix_eval_attempts_run_reward", "eval_attempts", ["run_id", "reward"])
    op.create_index("ix_eval_attempts_run_duration", "eval_attempts", ["run_id", "duration_ms"])


def downgrade() -> None:
    op.drop_index("ix_eval_attempts_run_duration", table_name="eval_attempts")
    op.drop_index("ix_eval_attempts_run_reward", table_name="eval_attempts")
    op.drop_index("ix_eval_attempts_run_status", table_name="eval_attempts")
    op.drop_table("eval_attempts")
    op.drop_index("ix_eval_runs_dataset_version_id", table_name="eval_runs")
    op.drop_index("ix_eval_runs_status_created", table_name="eval_runs")
    op.drop_index("ix_eval_runs_workspace_created", table_name="eval_runs")
    op.drop_table("eval_runs")
