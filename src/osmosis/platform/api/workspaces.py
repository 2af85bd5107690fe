"""Workspaces: `/api/workspaces` (create, list yours) and `/api/workspace` (the one named by
`X-Osmosis-Git`, and its members)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Path, Request

from osmosis.platform.core.db.models import User, Workspace, WorkspaceMember
from osmosis.platform.core.errors import Forbidden
from osmosis.platform.core.settings import Settings
from osmosis.platform.deps import (
    CurrentUser,
    CurrentWorkspace,
    Db,
    GitIdentity,
    OwnerWorkspace,
    Rules,
)
from osmosis.platform.services import users, workspaces
from osmosis.wire import (
    BudgetLimits,
    MemberAdd,
    MemberUpdate,
    WorkspaceBudget,
    WorkspaceBudgetUpdate,
    WorkspaceCreate,
    WorkspaceList,
    WorkspaceMemberPublic,
    WorkspacePublic,
    WorkspaceSummary,
    WorkspaceUpdate,
)

router = APIRouter(tags=["workspaces"])


def _settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


AppSettings = Annotated[Settings, Depends(_settings)]

MemberRef = Annotated[
    str, Path(min_length=1, max_length=320, description="The member's user id, name or email.")
]


def _member(member: WorkspaceMember) -> WorkspaceMemberPublic:
    return WorkspaceMemberPublic(
        user_id=member.user_id,
        name=member.user.name,
        email=member.user.email,
        role=member.role,
        added_at=member.created_at,
        active=member.user.is_active,
    )


def _public(db: Db, workspace: Workspace, user: User, settings: Settings) -> WorkspacePublic:
    members = workspaces.members(db, workspace=workspace)
    creator = db.get(User, workspace.created_by) if workspace.created_by else None
    return WorkspacePublic(
        id=workspace.id,
        identity=workspace.identity,
        created_at=workspace.created_at,
        created_by=creator.name if creator else None,
        role=next((m.role for m in members if m.user_id == user.id), None),
        members=[_member(m) for m in members],
        sandbox_network=workspace.sandbox_network,
        budget=WorkspaceBudget(
            defaults=BudgetLimits.model_validate(workspaces.budget_limits(workspace, "default")),
            ceilings=BudgetLimits.model_validate(workspaces.budget_limits(workspace, "ceiling")),
            platform_ceilings=BudgetLimits.model_validate(
                {key: getattr(settings, f"budget_{key}") for key in workspaces.BUDGET_LIMITS}
            ),
        ),
    )


@router.post("/api/workspaces", status_code=201)
def create_workspace(
    body: WorkspaceCreate, db: Db, user: CurrentUser, rules: Rules, settings: AppSettings
) -> WorkspacePublic:
    """Create a workspace for an origin (OSMOSIS_WORKSPACE_CREATION says who may); an admin
    may name its owner."""
    owner = None
    if body.owner and body.owner not in {user.id, user.name, user.email}:
        if not user.is_admin:  # refused before any lookup: says nothing about that user
            raise Forbidden("only an admin creates a workspace for another user")
        owner = users.get_user(db, user_id=body.owner, by_name=True)
    workspace = workspaces.create_workspace(
        db, identity=body.identity, user=user, rules=rules, owner=owner
    )
    return _public(db, workspace, user, settings)


@router.get("/api/workspaces")
def list_workspaces(db: Db, user: CurrentUser) -> WorkspaceList:
    """The workspaces you belong to, with your role in each."""
    return WorkspaceList(
        workspaces=[
            WorkspaceSummary(
                id=ws.id, identity=ws.identity, role=role, created_at=ws.created_at, members=n
            )
            for ws, role, n in workspaces.for_user(db, user=user)
        ]
    )


@router.get("/api/workspace")
def get_workspace(
    db: Db, user: CurrentUser, workspace: CurrentWorkspace, settings: AppSettings
) -> WorkspacePublic:
    """The workspace with its members; an admin's first request for an identity creates it
    (any user's, with OSMOSIS_WORKSPACE_CREATION=open)."""
    return _public(db, workspace, user, settings)


@router.patch("/api/workspace")
def update_workspace(
    body: WorkspaceUpdate,
    db: Db,
    user: CurrentUser,
    workspace: OwnerWorkspace,
    settings: AppSettings,
) -> WorkspacePublic:
    """Set what this workspace's sandboxed rollouts may reach (`full`: the internet too, never
    the host's loopback). Admins only: it widens what every member's code reaches."""
    if not user.is_admin:
        raise Forbidden("only an admin changes a workspace's sandbox network")
    workspaces.set_sandbox_network(db, workspace=workspace, network=body.sandbox_network)
    db.commit()
    return _public(db, workspace, user, settings)


@router.patch("/api/workspace/budget")
def update_workspace_budget(
    body: WorkspaceBudgetUpdate,
    db: Db,
    user: CurrentUser,
    identity: GitIdentity,
    settings: AppSettings,
) -> WorkspacePublic:
    """Set the workspace's budget defaults (its owners or an admin) and ceilings (admins only:
    they cap what the owners themselves may spend); a limit absent stays, null unsets it. A
    run's budget is its config's limit, else the default, else the platform's ceiling, clamped
    to the lower of the two ceilings."""
    workspace = workspaces.find_for_budget(db, identity=identity, user=user)
    workspaces.set_budget(
        db, workspace=workspace, user=user, defaults=body.defaults, ceilings=body.ceilings
    )
    db.commit()
    return _public(db, workspace, user, settings)


@router.post("/api/workspace/members", status_code=201)
def add_member(
    body: MemberAdd, db: Db, user: CurrentUser, workspace: OwnerWorkspace, settings: AppSettings
) -> WorkspacePublic:
    """Add an existing user (by id or email) as a member or an owner; owners only, so no one
    else learns whether an address is registered."""
    workspaces.add_member(
        db, workspace=workspace, user_id=body.user_id, email=body.email, role=body.role
    )
    db.commit()
    return _public(db, workspace, user, settings)


@router.patch("/api/workspace/members/{member}")
def update_member(
    member: MemberRef,
    body: MemberUpdate,
    db: Db,
    user: CurrentUser,
    workspace: OwnerWorkspace,
    settings: AppSettings,
) -> WorkspacePublic:
    """Change a member's role; owners only, and the last active owner stays one."""
    found = workspaces.find_member(db, workspace=workspace, ref=member)
    workspaces.set_role(db, workspace=workspace, member=found, role=body.role)
    db.commit()
    return _public(db, workspace, user, settings)


@router.delete("/api/workspace/members/{member}")
def remove_member(
    member: MemberRef, db: Db, user: CurrentUser, identity: GitIdentity
) -> WorkspaceMemberPublic:
    """Remove a member (owners only), or leave the workspace yourself; the last active owner
    stays. Their runs stay in the workspace."""
    leaving = member in {user.id, user.name, user.email}
    if leaving:
        workspace = workspaces.find_for_member(db, identity=identity, user=user)
    else:
        workspace = workspaces.find_for_owner(db, identity=identity, user=user)
    found = workspaces.find_member(db, workspace=workspace, ref=member)
    removed = _member(found)
    workspaces.remove_member(db, workspace=workspace, member=found)
    db.commit()
    return removed
