"""Adaptive model limits shared by every worker (`model_limits`, `model_limit_demands`).

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-05

Issue 28.3: the AIMD limit on calls in flight to one provider key is shared by every platform
worker through the database, so two runs on one key share it instead of fighting. Keys are
hashes; no API key is stored.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "model_limits",
        sa.Column("key", sa.String(64), nullable=False),
        sa.Column("in_flight_limit", sa.Float(), nullable=False),
        sa.Column("throttled", sa.BigInteger(), nullable=False),
        sa.Column("cut_at", sa.Float(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("key", name=op.f("pk_model_limits")),
    )
    op.create_table(
        "model_limit_demands",
        sa.Column("key", sa.String(64), nullable=False),
        sa.Column("worker", sa.String(32), nullable=False),
        sa.Column("demand", sa.Integer(), nullable=False),
        sa.Column("ceiling", sa.Integer(), nullable=False),
        sa.Column("seen_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("key", "worker", name=op.f("pk_model_limit_demands")),
    )


def downgrade() -> None:
    op.drop_table("model_limit_demands")
    op.drop_table("model_limits")
