"""Dependencies of the `/api/cli` routes: the caller's token, and the workspace the official CLI
names with `X-Osmosis-Git` (from a workspace directory) or `X-Osmosis-Workspace` (its root
`--workspace NAME`, where NAME is the workspace's identity as `GET /api/cli/workspaces` says it).
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Header

from osmosis.platform.core.db.models import Workspace
from osmosis.platform.core.errors import PlatformError
from osmosis.platform.deps import CurrentUser, Db, Rules
from osmosis.platform.services import workspaces
from osmosis.wire.official import WORKSPACE_HEADER


class ScopeHeaderConflict(PlatformError):
    code = "WORKSPACE_SCOPE_HEADER_CONFLICT"
    status_code = 400


def _named_identity(
    x_osmosis_git: Annotated[
        str | None,
        Header(alias=workspaces.GIT_HEADER, description="The workspace's git identity."),
    ] = None,
    x_osmosis_workspace: Annotated[
        str | None,
        Header(alias=WORKSPACE_HEADER, description="A workspace name (its identity)."),
    ] = None,
) -> str:
    git = (x_osmosis_git or "").strip()
    named = (x_osmosis_workspace or "").strip()
    if git and named:
        raise ScopeHeaderConflict(
            f"send {workspaces.GIT_HEADER} or {WORKSPACE_HEADER}, not both",
            details={"headers": [workspaces.GIT_HEADER, WORKSPACE_HEADER]},
        )
    if not (git or named):
        raise workspaces.GitScopeHeaderRequired(
            f"this route is workspace-scoped: send {workspaces.GIT_HEADER} (run from a "
            f"workspace directory) or {WORKSPACE_HEADER} (osmosis --workspace NAME)",
            details={"header": workspaces.GIT_HEADER},
        )
    return git or named


NamedIdentity = Annotated[str, Depends(_named_identity)]


def cli_workspace(db: Db, user: CurrentUser, identity: NamedIdentity, rules: Rules) -> Workspace:
    """The named workspace; on first use created for the caller when the server's rules allow
    (as `/api/workspace` does)."""
    return workspaces.open_workspace(db, identity=identity, user=user, rules=rules)


CliWorkspace = Annotated[Workspace, Depends(cli_workspace)]


def cli_member_workspace(db: Db, user: CurrentUser, identity: NamedIdentity) -> Workspace:
    """The named workspace if the caller belongs to it; never creates one."""
    return workspaces.find_for_member(db, identity=identity, user=user)


CliMemberWorkspace = Annotated[Workspace, Depends(cli_member_workspace)]
