"""A workspace's own sandbox network: `bridge`, `full`, or NULL for the platform's setting.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01

Issue 12: sandboxed rollouts reach only the model bridge unless the platform
(`OSMOSIS_SANDBOX_NETWORK`) or, for agents whose tools need the internet, one workspace says
`full`. NULL (every existing workspace) follows the platform.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("workspaces", sa.Column("sandbox_network", sa.String(16), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("workspaces") as batch:
        batch.drop_column("sandbox_network")
