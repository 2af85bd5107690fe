"""Workspaces, their members, and encrypted secrets.

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "workspaces",
        sa.Column("id", sa.String(32), nullable=False),
        sa.Column("identity", sa.String(1024), nullable=False),
        sa.Column("created_by", sa.String(32), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["created_by"],
            ["users.id"],
            name="fk_workspaces_created_by_users",
            ondelete="SET NULL",
        ),
        sa.PrimaryKeyConstraint("id", name="pk_workspaces"),
        sa.UniqueConstraint("identity", name="uq_workspaces_identity"),
    )
    op.create_table(
        "workspace_members",
        sa.Column("workspace_id", sa.String(32), nullable=False),
        sa.Column("user_id", sa.String(32), nullable=False),
        sa.Column("role", sa.String(16), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["workspace_id"],
            ["workspaces.id"],
            name="fk_workspace_members_workspace_id_workspaces",
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["user_id"],
            ["users.id"],
            name="fk_workspace_members_user_id_users",
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("workspace_id", "user_id", name="pk_workspace_members"),
    )
    op.create_index("ix_workspace_members_user_id", "workspace_members", ["user_id"])
    op.create_table(
        "secrets",
        sa.Column("id", sa.String(32), nullable=False),
        sa.Column("name", sa.String(255), nullable=False),
        sa.Column("scope", sa.String(16), nullable=False),
        sa.Column("workspace_id", sa.String(32), nullable=False),
        sa.Column("owner_id", sa.String(32), nullable=True),
        sa.Column("ciphertext", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_by", sa.String(32), nullable=True),
        sa.CheckConstraint("scope IN ('user', 'workspace')", name="ck_secrets_scope"),
        sa.CheckConstraint(
            "(scope = 'user' AND owner_id IS NOT NULL) "
            "OR (scope = 'workspace' AND owner_id IS NULL)",
            name="ck_secrets_owner_matches_scope",
        ),
        sa.ForeignKeyConstraint(
            ["workspace_id"],
            ["workspaces.id"],
            name="fk_secrets_workspace_id_workspaces",
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["owner_id"], ["users.id"], name="fk_secrets_owner_id_users", ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["updated_by"], ["users.id"], name="fk_secrets_updated_by_users", ondelete="SET NULL"
        ),
        sa.PrimaryKeyConstraint("id", name="pk_secrets"),
    )
    op.create_index("ix_secrets_workspace_id", "secrets", ["workspace_id"])
    # Partial unique indexes: a NULL owner would make a plain unique constraint toothless.
    op.create_index(
        "uq_secrets_workspace_name",
        "secrets",
        ["workspace_id", "name"],
        unique=True,
        sqlite_where=sa.text("scope = 'workspace'"),
        postgresql_where=sa.text("scope = 'workspace'"),
    )
    op.create_index(
        "uq_secrets_user_name",
        "secrets",
        ["workspace_id", "owner_id", "name"],
        unique=True,
        sqlite_where=sa.text("scope = 'user'"),
        postgresql_where=sa.text("scope = 'user'"),
    )


def downgrade() -> None:
    op.drop_index("uq_secrets_user_name", table_name="secrets")
    op.drop_index("uq_secrets_workspace_name", table_name="secrets")
    op.drop_index("ix_secrets_workspace_id", table_name="secrets")
    op.drop_table("secrets")
    op.drop_index("ix_workspace_members_user_id", table_name="workspace_members")
    op.drop_table("workspace_members")
    op.drop_table("workspaces")
