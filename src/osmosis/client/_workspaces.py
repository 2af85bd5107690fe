"""`client.workspaces`: a git origin's workspace and its members (`/api/workspace[s]`).

`git` is the workspace's identity (`acme/evals`), sent as `X-Osmosis-Git`.

    client.workspaces.get(git="acme/evals").members
    client.workspaces.add_member(git="acme/evals", email="ada@example.com")
"""

from __future__ import annotations

from collections.abc import Mapping
from urllib.parse import quote

from osmosis.client._base import Resource, git_header
from osmosis.wire import (
    MemberAdd,
    MemberUpdate,
    WorkspaceBudgetUpdate,
    WorkspaceCreate,
    WorkspaceList,
    WorkspaceMemberPublic,
    WorkspacePublic,
    WorkspaceUpdate,
)


class Workspaces(Resource):
    """Workspaces the caller belongs to, and their members."""

    def get(self, *, git: str) -> WorkspacePublic:
        """The workspace for `git`, created with the caller as owner on first use."""
        return self._transport.call(
            "GET", "/api/workspace", WorkspacePublic, headers=git_header(git)
        )

    def create(self, *, identity: str, owner: str | None = None) -> WorkspacePublic:
        """Create the workspace of an origin identity; an admin may name its `owner`."""
        body = WorkspaceCreate(identity=identity, owner=owner)
        return self._transport.call("POST", "/api/workspaces", WorkspacePublic, body=body)

    def update(self, *, git: str, sandbox_network: str | None) -> WorkspacePublic:
        """Set the workspace's sandbox network (`bridge`, `full`, or None for the platform's
        default); admins only."""
        body = WorkspaceUpdate.model_validate({"sandbox_network": sandbox_network})
        return self._transport.call(
            "PATCH", "/api/workspace", WorkspacePublic, body=body, headers=git_header(git)
        )

    def set_budget(
        self,
        *,
        git: str,
        defaults: Mapping[str, object] | None = None,
        ceilings: Mapping[str, object] | None = None,
    ) -> WorkspacePublic:
        """Set budget limits by name (`max_tokens_total`, `max_cost_usd`, `max_model_calls`;
        None unsets one, a name left out stays): `defaults` for runs that set none (owners),
        `ceilings` every run is clamped to (admins only)."""
        body = WorkspaceBudgetUpdate(defaults=dict(defaults or {}), ceilings=dict(ceilings or {}))
        return self._transport.call(
            "PATCH", "/api/workspace/budget", WorkspacePublic, body=body, headers=git_header(git)
        )

    def list(self) -> WorkspaceList:
        return self._transport.call("GET", "/api/workspaces", WorkspaceList)

    def add_member(
        self,
        *,
        git: str,
        user_id: str | None = None,
        email: str | None = None,
        role: str = "member",
    ) -> WorkspacePublic:
        body = MemberAdd.model_validate({"user_id": user_id, "email": email, "role": role})
        return self._transport.call(
            "POST", "/api/workspace/members", WorkspacePublic, body=body, headers=git_header(git)
        )

    def set_member_role(self, *, git: str, member: str, role: str) -> WorkspacePublic:
        """Make a member (id, name or email) an owner or a member; owners only."""
        path = f"/api/workspace/members/{quote(member, safe='')}"
        body = MemberUpdate.model_validate({"role": role})
        return self._transport.call(
            "PATCH", path, WorkspacePublic, body=body, headers=git_header(git)
        )

    def remove_member(self, *, git: str, member: str) -> WorkspaceMemberPublic:
        """Remove a member (owners only), or leave when `member` is the caller."""
        path = f"/api/workspace/members/{quote(member, safe='')}"
        return self._transport.call("DELETE", path, WorkspaceMemberPublic, headers=git_header(git))
