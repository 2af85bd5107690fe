"""A workspace's own budget defaults and ceilings, one column per limit; NULL: none.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-05

Issue 28.1: a run that sets no `max_tokens_total`, `max_cost_usd` or `max_model_calls` gets its
workspace's default, and every run of the workspace is clamped to the workspace's ceiling (then
to the platform's `OSMOSIS_BUDGET_MAX_*`). NULL (every existing workspace) adds no limit.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None

_COLUMNS = (
    ("budget_default_tokens_total", sa.BigInteger()),
    ("budget_default_cost_usd", sa.Float()),
    ("budget_default_model_calls", sa.BigInteger()),
    ("budget_ceiling_tokens_total", sa.BigInteger()),
    ("budget_ceiling_cost_usd", sa.Float()),
    ("budget_ceiling_model_calls", sa.BigInteger()),
)


def upgrade() -> None:
    with op.batch_alter_table("workspaces") as batch:
        for name, kind in _COLUMNS:
            batch.add_column(sa.Column(name, kind, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("workspaces") as batch:
        for name, _ in reversed(_COLUMNS):
            batch.drop_column(name)
