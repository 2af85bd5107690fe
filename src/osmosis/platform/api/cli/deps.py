"""Dependencies of the `/api/cli` routes: the caller's token, and the workspace the official CLI
names with `X-Osmosis-Git` (from a workspace directory) or `X-Osmosis-Workspace` (its root
`--workspace NAME`, where NAME is the workspace's identity as `GET /api/cli/workspaces` says it).
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends

from osmosis.platform.core.db.models import Workspace
from osmosis.platform.deps import CurrentUser, Db, GitIdentity, Rules
from osmosis.platform.services import workspaces

# The same two headers as our own API's, with the same rules (`osmosis.platform.deps`).
NamedIdentity = GitIdentity


def cli_workspace(db: Db, user: CurrentUser, identity: NamedIdentity, rules: Rules) -> Workspace:
    """The named workspace; on first use created for the caller when the server's rules allow
    (as `/api/workspace` does)."""
    return workspaces.open_workspace(db, identity=identity, user=user, rules=rules)


CliWorkspace = Annotated[Workspace, Depends(cli_workspace)]


def cli_member_workspace(db: Db, user: CurrentUser, identity: NamedIdentity) -> Workspace:
    """The named workspace if the caller belongs to it; never creates one."""
    return workspaces.find_for_member(db, identity=identity, user=user)


CliMemberWorkspace = Annotated[Workspace, Depends(cli_member_workspace)]
