"""Worker leases on runs, the platform's processes, and installation facts.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01

Issue 14: several API and worker processes share one database. A worker claims a run by
taking its lease (`claimed_by`, `heartbeat_at`, `lease_expires_at`; `lease_epoch` counts the
claims and fences a worker that lost its lease). Runs left `running` by an earlier server have
no holder, so any worker resumes them at once. `platform_processes` lists who is running (for
`osmosis server status` and to tell a dead holder on the same machine); `platform_meta` holds
the blob store's id, which every process checks against its blob directory at start.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("eval_runs") as batch:
        batch.add_column(sa.Column("claimed_by", sa.String(32), nullable=True))
        batch.add_column(sa.Column("heartbeat_at", sa.DateTime(timezone=True), nullable=True))
        batch.add_column(sa.Column("lease_expires_at", sa.DateTime(timezone=True), nullable=True))
        batch.add_column(sa.Column("lease_epoch", sa.Integer(), nullable=False, server_default="0"))
    op.create_table(
        "platform_processes",
        sa.Column("id", sa.String(32), nullable=False),
        sa.Column("role", sa.String(16), nullable=False),
        sa.Column("host", sa.String(255), nullable=False),
        sa.Column("node", sa.String(255), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("pid_start", sa.BigInteger(), nullable=True),
        sa.Column("url", sa.Text(), nullable=True),
        sa.Column("home", sa.Text(), nullable=False),
        sa.Column("version", sa.String(64), nullable=False),
        sa.Column("max_runs", sa.Integer(), nullable=True),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("heartbeat_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("stopped_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_platform_processes"),
    )
    op.create_table(
        "platform_meta",
        sa.Column("key", sa.String(64), nullable=False),
        sa.Column("value", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("key", name="pk_platform_meta"),
    )


def downgrade() -> None:
    op.drop_table("platform_meta")
    op.drop_table("platform_processes")
    with op.batch_alter_table("eval_runs") as batch:
        batch.drop_column("lease_epoch")
        batch.drop_column("lease_expires_at")
        batch.drop_column("heartbeat_at")
        batch.drop_column("claimed_by")
