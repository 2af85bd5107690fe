"""How often a run was resumed after its worker process was killed (`crash_resumes`).

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-03

Issue 25.8: a run whose worker is killed by a signal (SIGKILL, the OOM killer) is resumed from
its journal up to `OSMOSIS_RUN_CRASH_RESUMES` times; the count lives on the run, so every
worker process of the platform sees it. A retry starts it again at 0.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("eval_runs") as batch:
        batch.add_column(
            sa.Column("crash_resumes", sa.Integer(), nullable=False, server_default="0")
        )


def downgrade() -> None:
    with op.batch_alter_table("eval_runs") as batch:
        batch.drop_column("crash_resumes")
