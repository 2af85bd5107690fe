"""Store functions for workspaces and their members. Keyword arguments, no HTTP in sight.

workspace = get_or_create(db, identity="example-org/ws", user=ada)  # ada becomes owner
add_member(db, workspace=workspace, email="bob@example.com")
"""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from osmosis.platform.db.models import User, Workspace, WorkspaceMember, utcnow
from osmosis.platform.errors import Conflict, NotFound, PlatformError, ValidationFailed

OWNER = "owner"
MEMBER = "member"
MAX_IDENTITY = 1024


GIT_HEADER = "X-Osmosis-Git"


class GitScopeHeaderRequired(PlatformError):
    code = "GIT_SCOPE_HEADER_REQUIRED"
    status_code = 400


class WorkspaceNotFound(NotFound):
    """Raised alike for a workspace that does not exist and one the caller is not in."""


def not_found(identity: str) -> WorkspaceNotFound:
    # One message for both cases, so the answer never tells whether the workspace exists.
    return WorkspaceNotFound(
        "workspace not found among your workspaces",
        details={"git": identity, "hint": "ask a member to run `osmosis workspace member add`"},
    )


def check_identity(identity: str) -> str:
    identity = identity.strip()
    if not identity or len(identity) > MAX_IDENTITY or not identity.isprintable():
        raise ValidationFailed(
            f"X-Osmosis-Git must be a workspace identity of 1-{MAX_IDENTITY} printable "
            "characters, such as owner/repo"
        )
    return identity


def membership(db: Session, *, workspace_id: str, user_id: str) -> WorkspaceMember | None:
    return db.get(WorkspaceMember, (workspace_id, user_id))


def find_for_member(db: Session, *, identity: str, user: User) -> Workspace:
    """The workspace `identity` if `user` belongs to it, else `WorkspaceNotFound`."""
    identity = check_identity(identity)
    workspace = db.scalar(select(Workspace).where(Workspace.identity == identity))
    if workspace is None or membership(db, workspace_id=workspace.id, user_id=user.id) is None:
        raise not_found(identity)
    return workspace


def get_or_create(db: Session, *, identity: str, user: User) -> Workspace:
    """The workspace `identity`, created with `user` as its owner on first use.

    An existing workspace the user is not a member of is a `WorkspaceNotFound`.
    """
    identity = check_identity(identity)
    workspace = db.scalar(select(Workspace).where(Workspace.identity == identity))
    if workspace is None:
        workspace = Workspace(identity=identity, created_by=user.id, created_at=utcnow())
        db.add(workspace)
        db.add(WorkspaceMember(workspace=workspace, user_id=user.id, role=OWNER))
        try:
            db.commit()
        except IntegrityError:  # another request created it first; it is theirs, not ours
            db.rollback()
        else:
            return workspace
    return find_for_member(db, identity=identity, user=user)


def members(db: Session, *, workspace: Workspace) -> list[WorkspaceMember]:
    query = (
        select(WorkspaceMember)
        .where(WorkspaceMember.workspace_id == workspace.id)
        .order_by(WorkspaceMember.created_at, WorkspaceMember.user_id)
    )
    return list(db.scalars(query))


def add_member(
    db: Session, *, workspace: Workspace, user_id: str | None = None, email: str | None = None
) -> WorkspaceMember:
    """Add an existing user, named by id or email; unknown users are `NotFound`."""
    if (user_id is None) == (email is None):
        raise ValidationFailed("name the user by exactly one of user_id or email")
    if user_id is not None:
        user = db.get(User, user_id)
    else:
        user = db.scalar(select(User).where(User.email == email))
    if user is None:
        named = f"with email {email}" if email is not None else f"with id {user_id!r}"
        raise NotFound(
            f"no user {named}; an admin creates users (osmosis admin user create)",
            details={"user_id": user_id, "email": email},
        )
    if membership(db, workspace_id=workspace.id, user_id=user.id) is not None:
        raise Conflict(
            f"user {user.name!r} is already a member of this workspace",
            details={"user_id": user.id},
        )
    member = WorkspaceMember(
        workspace_id=workspace.id, user_id=user.id, role=MEMBER, created_at=utcnow()
    )
    db.add(member)
    try:
        db.flush()
    except IntegrityError:  # added concurrently by another member
        db.rollback()
        raise Conflict("the user is already a member of this workspace") from None
    return member
