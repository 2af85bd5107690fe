"""`/api/workspace`: the caller's workspace (named by `X-Osmosis-Git`) and its members."""

from __future__ import annotations

from fastapi import APIRouter

from osmosis.platform import workspaces
from osmosis.platform.db.models import User, Workspace, WorkspaceMember
from osmosis.platform.deps import CurrentUser, CurrentWorkspace, Db, MemberWorkspace
from osmosis.platform.schemas import MemberAdd, WorkspaceMemberPublic, WorkspacePublic

router = APIRouter(prefix="/api/workspace", tags=["workspaces"])


def _member(member: WorkspaceMember) -> WorkspaceMemberPublic:
    return WorkspaceMemberPublic(
        user_id=member.user_id,
        name=member.user.name,
        email=member.user.email,
        role=member.role,
        added_at=member.created_at,
    )


def _public(db: Db, workspace: Workspace, user: User) -> WorkspacePublic:
    members = workspaces.members(db, workspace=workspace)
    creator = db.get(User, workspace.created_by) if workspace.created_by else None
    return WorkspacePublic(
        id=workspace.id,
        identity=workspace.identity,
        created_at=workspace.created_at,
        created_by=creator.name if creator else None,
        role=next(m.role for m in members if m.user_id == user.id),
        members=[_member(m) for m in members],
    )


@router.get("")
def get_workspace(db: Db, user: CurrentUser, workspace: CurrentWorkspace) -> WorkspacePublic:
    """The workspace with its members; the first request for an identity creates it."""
    return _public(db, workspace, user)


@router.post("/members", status_code=201)
def add_member(
    body: MemberAdd, db: Db, user: CurrentUser, workspace: MemberWorkspace
) -> WorkspacePublic:
    """Add an existing user (by id or email); any member may add one."""
    workspaces.add_member(db, workspace=workspace, user_id=body.user_id, email=body.email)
    db.commit()
    return _public(db, workspace, user)
