"""`/api/cli/verify`, `/api/cli/workspaces` and `/api/cli/tokens/{id}`: who the official CLI
is signed in as (`osmosis auth login --token`, `auth whoami`), the workspaces they belong to,
and revoking a token on `auth logout`."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Header, Path

from osmosis.platform.core.db.models import ApiToken, User, Workspace
from osmosis.platform.core.errors import NotFound
from osmosis.platform.deps import CurrentToken, CurrentUser, Db
from osmosis.platform.services import users, workspaces
from osmosis.wire.official import (
    CliUser,
    CliVerify,
    CliWorkspaceList,
    CliWorkspaceRef,
    CliWorkspaceSummary,
    ConnectedRepo,
    TokenRevoked,
)

from .errors import OfficialRoute

router = APIRouter(route_class=OfficialRoute)

NO_EMAIL_DOMAIN = "osmosis.invalid"
"""A user without an email (the first admin, say) is shown as `<name>@osmosis.invalid`: the
official CLI refuses a user without one, and `.invalid` can never be delivered to."""


def cli_user(user: User) -> CliUser:
    return CliUser(id=user.id, email=user.email or f"{user.name}@{NO_EMAIL_DOMAIN}", name=user.name)


def github_repo(workspace: Workspace) -> str | None:
    """`owner/repo` when the workspace is a GitHub repository's (our identity for those)."""
    owner, slash, repo = workspace.identity.partition("/")
    if not slash or "/" in repo or "." in owner or ":" in owner:
        return None
    return workspace.identity


def _linked_workspace(db: Db, user: User, identity: str | None) -> CliWorkspaceRef | None:
    if not identity or not identity.strip():
        return None
    try:
        workspace = workspaces.find_for_member(db, identity=identity, user=user)
    except NotFound:
        # Verification answers who you are; a workspace you do not belong to is just absent.
        return None
    member = workspaces.membership(db, workspace_id=workspace.id, user_id=user.id)
    return CliWorkspaceRef(
        id=workspace.id, name=workspace.identity, role=member.role if member else None
    )


@router.get("/verify")
def verify(
    token: CurrentToken,
    db: Db,
    x_osmosis_git: Annotated[str | None, Header(alias=workspaces.GIT_HEADER)] = None,
) -> CliVerify:
    """The token's user, id and expiry, and the workspace `X-Osmosis-Git` names if the user
    belongs to it."""
    return CliVerify(
        user=cli_user(token.user),
        token_id=token.id,
        expires_at=token.expires_at.isoformat() if token.expires_at else None,
        workspace=_linked_workspace(db, token.user, x_osmosis_git),
    )


@router.get("/workspaces")
def list_workspaces(db: Db, user: CurrentUser) -> CliWorkspaceList:
    """The workspaces you belong to; `name` is what `osmosis --workspace NAME` takes."""
    found = workspaces.for_user(db, user=user)
    return CliWorkspaceList(
        workspaces=[
            CliWorkspaceSummary(
                id=ws.id,
                name=ws.identity,
                role=role,
                connected_repo=ConnectedRepo(repo_full_name=repo)
                if (repo := github_repo(ws))
                else None,
            )
            for ws, role, _members in found
        ]
    )


@router.delete("/tokens/{token_id}")
def revoke_token(
    token_id: Annotated[str, Path(min_length=1, max_length=64)], db: Db, user: CurrentUser
) -> TokenRevoked:
    """Revoke one of your tokens (`osmosis auth logout`); another user's id is a 404."""
    revoked: ApiToken = users.revoke_token(db, token_id=token_id, owner=user)
    db.commit()
    return TokenRevoked(id=revoked.id, revoked=True)
