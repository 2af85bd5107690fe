"""A run status for a run halted by its budget (`halted`).

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-05

Issue 28.1: a run whose engine stopped dispatching because its budget (tokens, dollars or model
calls) is spent ends `halted`, not `failed`: nothing went wrong, and a retry with a raised
budget resumes it. Going down, a halted run becomes `failed` (what it was called before).
"""

from __future__ import annotations

from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

_BEFORE = "status IN ('pending', 'running', 'finished', 'failed', 'stopped')"
_AFTER = "status IN ('pending', 'running', 'finished', 'failed', 'stopped', 'halted')"


# 0004 named it through the naming convention twice; from here on it has the models' name.
_OLD_NAME = "ck_eval_runs_ck_eval_runs_status"
_NAME = "ck_eval_runs_status"


def _check(drop: str, create: str, condition: str) -> None:
    with op.batch_alter_table("eval_runs") as batch:
        batch.drop_constraint(op.f(drop), type_="check")
        batch.create_check_constraint(op.f(create), condition)


def upgrade() -> None:
    _check(_OLD_NAME, _NAME, _AFTER)


def downgrade() -> None:
    op.execute("UPDATE eval_runs SET status = 'failed' WHERE status = 'halted'")
    _check(_NAME, _OLD_NAME, _BEFORE)
