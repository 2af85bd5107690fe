"""`osmosis workspace`: the platform workspace of the current git repository, and its members.

The workspace is named by the repository's `origin` (see `osmosis.workspace`); every
workspace-scoped request sends that identity as `X-Osmosis-Git`.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

if TYPE_CHECKING:
    from osmosis.workspace import Workspace

app = typer.Typer(help="Show the current workspace and manage its members.", no_args_is_help=True)
member_app = typer.Typer(help="Manage workspace members.", no_args_is_help=True)
app.add_typer(member_app, name="member")


def current_workspace(start: Path | None = None) -> Workspace:
    """The git workspace around `start` (default: the current directory), or a `CLIError`
    with code WORKSPACE_REQUIRED and the fix as its hint."""
    from osmosis.cli.output import CLIError
    from osmosis.workspace import WorkspaceError, resolve_workspace

    try:
        return resolve_workspace(start or Path.cwd())
    except WorkspaceError as error:
        raise CLIError(error.message, code=error.code, hint=error.hint or None) from None


def git_context(workspace: Workspace, platform_url: str | None = None) -> dict[str, Any]:
    """The context every workspace-scoped JSON envelope carries (as in the reference CLI)."""
    from osmosis.workspace import redact_url

    context: dict[str, Any] = {
        "git": {"identity": workspace.identity, "remote_url": redact_url(workspace.remote_url)},
        "workspace_directory": str(workspace.directory),
    }
    if platform_url:
        context["platform_url"] = platform_url
    return context


@app.command("info")
def info() -> None:
    """Show this repository's workspace and its members (creates it on first use)."""
    from osmosis.cli.credentials import open_client, platform_errors
    from osmosis.cli.main import output
    from osmosis.cli.output import Mode
    from osmosis.workspace import redact_url

    workspace = current_workspace()
    with platform_errors(), open_client(None) as client:
        public = client.workspace(git=workspace.identity)
    out = output()
    data: dict[str, Any] = {
        "identity": public.identity,
        "id": public.id,
        "role": public.role,
        "created_by": public.created_by,
        "created_at": public.created_at.isoformat(),
        "members": [
            {"name": m.name, "email": m.email, "role": m.role, "user_id": m.user_id}
            for m in public.members
        ],
        **git_context(workspace, client.base_url),
    }
    if out.mode is not Mode.JSON:
        # A person reads names and roles, not a JSON dump of each member.
        data["members"] = ", ".join(
            f"{m.name}{f' <{m.email}>' if m.email else ''} ({m.role})" for m in public.members
        )
        data["git"] = redact_url(workspace.remote_url)
    out.detail(data, title="Workspace")


@member_app.command("add")
def add_member(
    user: str = typer.Argument(..., help="The user's email address or id."),
) -> None:
    """Add an existing platform user to this repository's workspace."""
    from osmosis.cli.credentials import open_client, platform_errors, request_body
    from osmosis.cli.main import output
    from osmosis.platform.schemas import MemberAdd

    workspace = current_workspace()
    by = {"email": user} if "@" in user else {"user_id": user}
    request_body(MemberAdd, **by)
    with platform_errors(), open_client(None) as client:
        public = client.add_workspace_member(git=workspace.identity, **by)
    output().operation(
        "workspace.member.add",
        message=f"Added {user} to workspace {public.identity}.",
        resource={
            "identity": public.identity,
            "members": [m.model_dump(mode="json") for m in public.members],
        },
    )
