"""Dependencies, aliased so route signatures read as prose: `def whoami(user: CurrentUser)`."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, Header, Query, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session

from osmosis.platform.core.db.models import ApiToken, User, Workspace
from osmosis.platform.core.errors import AuthRequired, Forbidden, PlatformError
from osmosis.platform.services import workspaces
from osmosis.platform.services.token_use import TokenUses
from osmosis.platform.services.users import check_token
from osmosis.wire.official import WORKSPACE_HEADER

# Page offsets stop far beyond any real listing but well inside the databases' 64-bit
# integers: a larger number would otherwise reach the SQL and overflow there (a 500).
MAX_OFFSET = 2**31 - 1
Offset = Annotated[int, Query(ge=0, le=MAX_OFFSET, description="Items to skip.")]

# auto_error=False: a missing header is ours to report, in our envelope, not FastAPI's 403.
_bearer = HTTPBearer(auto_error=False, description="An osmosis API token (osm_...).")


def get_db(request: Request) -> Iterator[Session]:
    """One session per request, from the factory `create_app` stored on the app."""
    with request.app.state.sessions() as session:
        yield session


Db = Annotated[Session, Depends(get_db)]


def token_uses(request: Request) -> TokenUses:
    """Token uses not yet written (`create_app` keeps one per process)."""
    uses: TokenUses = request.app.state.token_uses
    return uses


Uses = Annotated[TokenUses, Depends(token_uses)]


def current_token(
    db: Db,
    uses: Uses,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> ApiToken:
    if credentials is None:
        raise AuthRequired("an API token is required (Authorization: Bearer osm_...)")
    # Revoked, expired or of a deactivated user: refused, saying which. No write: the use
    # is noted in memory and written in the background.
    return check_token(db, secret=credentials.credentials, uses=uses)


CurrentToken = Annotated[ApiToken, Depends(current_token)]


def current_user(token: CurrentToken) -> User:
    return token.user


CurrentUser = Annotated[User, Depends(current_user)]


def admin_user(user: CurrentUser) -> User:
    if not user.is_admin:
        raise Forbidden("this needs an admin user")
    return user


AdminUser = Annotated[User, Depends(admin_user)]


class ScopeHeaderConflict(PlatformError):
    code = "WORKSPACE_SCOPE_HEADER_CONFLICT"
    status_code = 400


def scope_identity(git: str | None, named: str | None) -> str | None:
    """The workspace a request names: by `X-Osmosis-Git` (a workspace directory's identity) or
    `X-Osmosis-Workspace` (`osmosis --workspace NAME`, NAME being that same identity); None
    when neither is sent, and refused when both are."""
    git, named = (git or "").strip(), (named or "").strip()
    if git and named:
        raise ScopeHeaderConflict(
            f"send {workspaces.GIT_HEADER} or {WORKSPACE_HEADER}, not both",
            details={"headers": [workspaces.GIT_HEADER, WORKSPACE_HEADER]},
        )
    return git or named or None


def _git_identity(
    x_osmosis_git: Annotated[
        str | None,
        Header(
            alias="X-Osmosis-Git",
            description="The workspace identity, normalised from the git origin (owner/repo).",
        ),
    ] = None,
    x_osmosis_workspace: Annotated[
        str | None,
        Header(alias=WORKSPACE_HEADER, description="A workspace by name (its identity)."),
    ] = None,
) -> str:
    identity = scope_identity(x_osmosis_git, x_osmosis_workspace)
    if identity is None:
        raise workspaces.GitScopeHeaderRequired(
            f"this route is workspace-scoped: send {workspaces.GIT_HEADER} (run from a "
            f"workspace directory) or {WORKSPACE_HEADER} (osmosis --workspace NAME)",
            details={"header": workspaces.GIT_HEADER},
        )
    return identity


GitIdentity = Annotated[str, Depends(_git_identity)]


def workspace_rules(request: Request) -> workspaces.WorkspaceRules:
    """Who may create workspaces and what may be cloned, from the app's settings."""
    return workspaces.rules_for(request.app.state.settings)


Rules = Annotated[workspaces.WorkspaceRules, Depends(workspace_rules)]


def current_workspace(db: Db, user: CurrentUser, identity: GitIdentity, rules: Rules) -> Workspace:
    """The caller's workspace from `X-Osmosis-Git` or `X-Osmosis-Workspace`; on first use
    created with them as owner if the creation policy and the clone allowlist let them
    (`workspaces.open_workspace`)."""
    return workspaces.open_workspace(db, identity=identity, user=user, rules=rules)


CurrentWorkspace = Annotated[Workspace, Depends(current_workspace)]


def member_workspace(db: Db, user: CurrentUser, identity: GitIdentity) -> Workspace:
    """Like `CurrentWorkspace` but never creates: for changes to a workspace that must exist."""
    return workspaces.find_for_member(db, identity=identity, user=user)


MemberWorkspace = Annotated[Workspace, Depends(member_workspace)]


def owner_workspace(db: Db, user: CurrentUser, identity: GitIdentity) -> Workspace:
    """The workspace if the caller owns it (or is an admin): for changing its members."""
    return workspaces.find_for_owner(db, identity=identity, user=user)


OwnerWorkspace = Annotated[Workspace, Depends(owner_workspace)]
