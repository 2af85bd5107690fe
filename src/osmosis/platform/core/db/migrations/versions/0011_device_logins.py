"""The official CLI's browser (device) logins, RFC 8628 (`device_logins`).

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-05

Issue 26: `osmosis auth login` of the official CLI asks for a device code, a signed-in user
approves it on the dashboard's `/device` page, and the CLI collects a new token of theirs.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "device_logins",
        sa.Column("id", sa.String(32), nullable=False),
        sa.Column("device_code_hash", sa.String(64), nullable=False),
        sa.Column("user_code", sa.String(16), nullable=False),
        sa.Column("device_name", sa.String(200), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_polled_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("decided_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("user_id", sa.String(32), nullable=True),
        sa.Column("token_expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("token_id", sa.String(32), nullable=True),
        sa.ForeignKeyConstraint(
            ["user_id"], ["users.id"], name="fk_device_logins_user_id_users", ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["token_id"],
            ["api_tokens.id"],
            name="fk_device_logins_token_id_api_tokens",
            ondelete="SET NULL",
        ),
        sa.PrimaryKeyConstraint("id", name="pk_device_logins"),
        sa.UniqueConstraint("device_code_hash", name="uq_device_logins_device_code_hash"),
        sa.UniqueConstraint("user_code", name="uq_device_logins_user_code"),
    )
    op.create_index("ix_device_logins_user_id", "device_logins", ["user_id"])


def downgrade() -> None:
    op.drop_index("ix_device_logins_user_id", table_name="device_logins")
    op.drop_table("device_logins")
