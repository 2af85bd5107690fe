"""Workspace identities in their one normalised form; token expiry; user deactivation.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01

Before this revision the server stored whatever `X-Osmosis-Git` said, so `…/alice.git`,
`…/alice/` and an upper-case host could be three workspaces. Each identity is rewritten to
`osmosis.workspace.canonical_identity`. When several rows meet in one identity they are not
merged: one may be a squatter's claim, and merging would hand its members the other's
datasets, secrets and runs. The row already in the normalised form keeps it (the CLI has
always sent that form, so it is the one people used), else the oldest; every other row, and
any identity that names no repository, is renamed `quarantined:<id>:<old identity>`. No
request can name such a workspace any more (no normalised identity has that form); its
members still see its runs and datasets on the dashboard, nothing is deleted, and each
rename is logged as a warning with what the row holds.
"""

from __future__ import annotations

import logging
from typing import Any

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

logger = logging.getLogger("osmosis.platform")

QUARANTINE = "quarantined"
MAX_IDENTITY = 1024


def upgrade() -> None:
    op.add_column("users", sa.Column("deactivated_at", sa.DateTime(timezone=True), nullable=True))
    op.add_column("api_tokens", sa.Column("expires_at", sa.DateTime(timezone=True), nullable=True))
    normalise_identities(op.get_bind())


def downgrade() -> None:
    # Identities stay normalised: the old spellings are not worth restoring.
    op.drop_column("api_tokens", "expires_at")
    op.drop_column("users", "deactivated_at")


def quarantined(row_id: str, identity: str) -> str:
    prefix = f"{QUARANTINE}:{row_id[:8]}:"
    return prefix + identity[: MAX_IDENTITY - len(prefix)]


def normalise_identities(connection: sa.Connection) -> None:
    # The application's own rule, so stored rows and later requests agree exactly.
    from osmosis.workspace import canonical_identity

    rows = connection.execute(
        sa.text("SELECT id, identity, created_at FROM workspaces ORDER BY created_at, id")
    ).all()
    groups: dict[str, list[Any]] = {}
    renames: dict[str, str] = {}
    for row in rows:
        if row.identity.startswith(f"{QUARANTINE}:"):
            continue
        try:
            canonical = canonical_identity(row.identity)
        except ValueError as error:
            renames[row.id] = quarantined(row.id, row.identity)
            _warn(connection, row, renames[row.id], f"it names no repository ({error})")
            continue
        groups.setdefault(canonical, []).append(row)
    for canonical, members in groups.items():
        keeper = next((r for r in members if r.identity == canonical), members[0])
        for row in members:
            if row is keeper:
                continue
            renames[row.id] = quarantined(row.id, row.identity)
            _warn(
                connection,
                row,
                renames[row.id],
                f"it is the same workspace as {keeper.identity!r} ({keeper.id}), which keeps "
                f"the identity {canonical!r}; nothing was merged",
            )
        if keeper.identity != canonical:
            renames[keeper.id] = canonical
            logger.info(
                "workspace %s: identity %r is now %r", keeper.id, keeper.identity, canonical
            )
    # Two passes: a row may take the identity another row is leaving.
    update = sa.text("UPDATE workspaces SET identity = :identity WHERE id = :id")
    for row_id in renames:
        connection.execute(update, {"identity": f"{QUARANTINE}:moving:{row_id}", "id": row_id})
    for row_id, identity in renames.items():
        connection.execute(update, {"identity": identity, "id": row_id})
    _warn_local_claims(connection)


def _warn_local_claims(connection: sa.Connection) -> None:
    """Local-path workspaces a non-admin created: the server cloned them for whoever asked
    first. They stay (their members may be legitimate); the operator should look at them."""
    claims = connection.execute(
        sa.text(
            "SELECT w.id, w.identity, u.name FROM workspaces w JOIN users u "
            "ON u.id = w.created_by WHERE w.identity LIKE 'file://%' AND NOT u.is_admin"
        )
    ).all()
    for claim in claims:
        logger.warning(
            "workspace %s %r was created by non-admin user %r before origins were checked: "
            "check that it is theirs (OSMOSIS_CLONE_ALLOW decides what runs may clone)",
            claim.id,
            claim.identity,
            claim.name,
        )


def _warn(connection: sa.Connection, row: Any, new: str, why: str) -> None:
    held = {
        table: connection.execute(
            sa.text(f"SELECT count(*) FROM {table} WHERE workspace_id = :id"),
            {"id": row.id},
        ).scalar_one()
        for table in ("workspace_members", "datasets", "secrets", "eval_runs")
    }
    logger.warning(
        "workspace %s %r renamed %r: %s. It keeps %d members, %d datasets, %d secrets and "
        "%d runs, visible to its members on the dashboard; no request can name it any more",
        row.id,
        row.identity,
        new,
        why,
        held["workspace_members"],
        held["datasets"],
        held["secrets"],
        held["eval_runs"],
    )
