"""Each platform attempt's row in the dataset file (`source_row_index`), as journals hold it.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-02

Rows of a run are numbered by their position in its selection; without `limit` the platform
samples rows at random, so `eval compare` could not tell whether two runs' row 0 were one
dataset row, and refused them. NULL for attempts stored before this revision.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("eval_attempts", sa.Column("source_row_index", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("eval_attempts") as batch:
        batch.drop_column("source_row_index")
