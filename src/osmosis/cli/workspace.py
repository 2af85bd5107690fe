"""`osmosis workspace`: create and list platform workspaces, show the current repository's,
and manage its members.

The reference CLI has no `workspace` group any more (its platform links repositories in the
web UI); this self-hosted platform keeps one for what its server decides. The workspace is
named by the repository's `origin` (see `osmosis.workspace`); every workspace-scoped request
sends that identity as `X-Osmosis-Git`.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

if TYPE_CHECKING:
    from osmosis.workspace import Workspace

app = typer.Typer(
    help="Create and list workspaces, show the current one, manage its members.",
    no_args_is_help=True,
)
member_app = typer.Typer(
    help="List, add, remove and re-role workspace members (owners change members).",
    no_args_is_help=True,
)
app.add_typer(member_app, name="member")


def current_workspace(start: Path | None = None) -> Workspace:
    """The git workspace around `start` (default: the current directory), or a `CLIError`
    with code WORKSPACE_REQUIRED and the fix as its hint. Under `osmosis --workspace NAME`,
    the workspace is NAME, in a checkout or not."""
    from osmosis.cli.credentials import named_workspace
    from osmosis.cli.output import CLIError
    from osmosis.workspace import Workspace, WorkspaceError, resolve_workspace

    named = named_workspace()
    try:
        found = resolve_workspace(start or Path.cwd())
    except WorkspaceError as error:
        if named is None:
            raise CLIError(error.message, code=error.code, hint=error.hint or None) from None
        # `--workspace NAME` needs no checkout: requests name the workspace instead.
        return Workspace(directory=(start or Path.cwd()).resolve(), remote_url="", identity=named)
    return found if named is None else Workspace(found.directory, found.remote_url, named)


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


def _identity(origin: str | None) -> str:
    """The identity of `origin` (a URL or a path, relative to here), or of this repository."""
    from osmosis.cli.output import CLIError
    from osmosis.workspace import normalise_identity

    if origin is None:
        return current_workspace().identity
    try:
        return normalise_identity(origin, base=Path.cwd())
    except ValueError as error:
        raise CLIError(f"ORIGIN {origin!r}: {error}", details={"origin": origin}) from None


def _members(public: Any) -> list[dict[str, Any]]:
    return [
        {"name": m.name, "email": m.email, "role": m.role, "active": m.active, "user_id": m.user_id}
        for m in public.members
    ]


@app.command("create")
def create(
    origin: str | None = typer.Argument(
        None, help="A git URL or local path (default: this repository's origin)."
    ),
    owner: str | None = typer.Option(
        None, "--owner", help="Admins: the owner's email, name or id (default: you)."
    ),
) -> None:
    """Create the workspace of a git origin, owned by you or (admins) by --owner.

    Who may create one is the server's OSMOSIS_WORKSPACE_CREATION (default: admins only);
    the origin must be one the server may clone (OSMOSIS_CLONE_ALLOW).
    """
    from osmosis.cli.credentials import open_client, platform_errors
    from osmosis.cli.output import output

    identity = _identity(origin)
    with platform_errors(), open_client(None) as client:
        public = client.workspaces.create(identity=identity, owner=owner)
    owners = ", ".join(m.name for m in public.members if m.role == "owner")
    output().operation(
        "workspace.create",
        message=f"Created workspace {public.identity}, owned by {owners}.",
        resource={"id": public.id, "identity": public.identity, "members": _members(public)},
    )


@app.command("list")
def list_workspaces() -> None:
    """List the workspaces you belong to, with your role in each."""
    from osmosis.cli.credentials import open_client, platform_errors
    from osmosis.cli.output import output, short_time

    with platform_errors(), open_client(None) as client:
        page = client.workspaces.list()
    output().listing(
        [ws.model_dump(mode="json") for ws in page.workspaces],
        columns=["identity", "role", "members", "created_at", "id"],
        headers={"created_at": "Created"},
        cells={"created_at": short_time},
        title="Your workspaces",
        context={"platform_url": client.base_url},
    )


@app.command("info")
def info() -> None:
    """Show this repository's workspace and its members (an admin's first use creates it)."""
    from osmosis.cli.credentials import open_client, platform_errors
    from osmosis.cli.output import Mode, output
    from osmosis.workspace import redact_url

    workspace = current_workspace()
    with platform_errors(), open_client(None) as client:
        public = client.workspaces.get(git=workspace.identity)
    out = output()
    data: dict[str, Any] = {
        "identity": public.identity,
        "id": public.id,
        "role": public.role,
        "created_by": public.created_by,
        "created_at": public.created_at.isoformat(),
        "members": _members(public),
        "sandbox_network": public.sandbox_network or "default",
        "budget": _budget_data(public),
        **git_context(workspace, client.base_url),
    }
    if out.mode is not Mode.JSON:
        # A person reads names and roles, not a JSON dump of each member.
        data["members"] = ", ".join(
            f"{m.name}{f' <{m.email}>' if m.email else ''} "
            f"({m.role}{'' if m.active else ', deactivated'})"
            for m in public.members
        )
        data["git"] = redact_url(workspace.remote_url)
        data["budget"] = _budget_line(data["budget"]) if data["budget"] else "-"
    out.detail(data, title="Workspace")


@app.command("set")
def set_options(
    sandbox_network: str = typer.Option(
        ...,
        "--sandbox-network",
        help="bridge (the model bridge only), full (the internet too, never this host's "
        "loopback) or default (the platform's OSMOSIS_SANDBOX_NETWORK).",
    ),
) -> None:
    """Change this repository's workspace settings (admins only)."""
    from osmosis.cli.credentials import open_client, platform_errors
    from osmosis.cli.output import CLIError, output

    choices = {"bridge": "bridge", "full": "full", "default": None}
    if sandbox_network not in choices:
        raise CLIError(
            f"--sandbox-network must be bridge, full or default, got {sandbox_network!r}",
            code="VALIDATION",
        )
    workspace = current_workspace()
    with platform_errors(), open_client(None) as client:
        public = client.workspaces.update(
            git=workspace.identity, sandbox_network=choices[sandbox_network]
        )
    shown = public.sandbox_network or "the platform's default"
    output().operation(
        "workspace.set",
        message=f"Sandboxed rollouts of {public.identity} reach: {shown}.",
        resource={"identity": public.identity, "sandbox_network": public.sandbox_network},
    )


BUDGET_HELP = (
    "LIMIT=VALUE, repeatable: LIMIT is max_tokens_total, max_cost_usd or max_model_calls; "
    "VALUE a positive number, or none to unset it."
)


def _budget_values(option: str, pairs: list[str]) -> dict[str, object]:
    """`max_cost_usd=5` pairs as the server takes them; the server checks names and values
    (and says which is wrong), so a non-number goes through as given."""
    from osmosis.cli.output import CLIError

    values: dict[str, object] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key.strip():
            raise CLIError(
                f"{option} takes LIMIT=VALUE (e.g. max_tokens_total=200000), got {pair!r}",
                code="VALIDATION",
                details={"option": option, "value": pair},
            )
        raw = raw.strip()
        value: object = raw
        if raw.lower() in {"none", "null", "unset"}:
            value = None
        else:
            for parse in (int, float):
                try:
                    value = parse(raw)
                    break
                except ValueError:
                    continue
        values[key.strip()] = value
    return values


def _budget_data(public: Any) -> dict[str, Any]:
    budget = public.budget
    if budget is None:  # an older server
        return {}
    return {
        kind: getattr(budget, kind).model_dump()
        for kind in ("defaults", "ceilings", "platform_ceilings")
    }


@app.command("budget")
def budget(
    default: list[str] = typer.Option(
        [], "--default", help=f"A default for runs that set none (owners). {BUDGET_HELP}"
    ),
    ceiling: list[str] = typer.Option(
        [],
        "--ceiling",
        help=f"A ceiling every run of the workspace is clamped to (admins only). {BUDGET_HELP}",
    ),
) -> None:
    """Show or set this repository's workspace budget defaults and ceilings.

    A run's budget is its config's limit, else the workspace default, else the platform's
    ceiling (OSMOSIS_BUDGET_MAX_*); it is then clamped to the lower of the workspace ceiling
    and the platform's.
    """
    from osmosis.cli.credentials import open_client, platform_errors
    from osmosis.cli.output import Mode, output

    defaults = _budget_values("--default", default)
    ceilings = _budget_values("--ceiling", ceiling)
    workspace = current_workspace()
    with platform_errors(), open_client(None) as client:
        if defaults or ceilings:
            public = client.workspaces.set_budget(
                git=workspace.identity, defaults=defaults, ceilings=ceilings
            )
        else:
            public = client.workspaces.get(git=workspace.identity)
    data = {"identity": public.identity, **_budget_data(public)}
    out = output()
    if defaults or ceilings:
        out.operation(
            "workspace.budget",
            message=f"Budget of {public.identity}: {_budget_line(data)}.",
            resource=data,
        )
        return
    if out.mode is not Mode.JSON:
        # One line per limit: default, workspace ceiling, platform ceiling.
        for key in ("max_tokens_total", "max_cost_usd", "max_model_calls"):
            data[key] = ", ".join(
                f"{label} {_limit(data, kind, key)}"
                for label, kind in (
                    ("default", "defaults"),
                    ("ceiling", "ceilings"),
                    ("platform ceiling", "platform_ceilings"),
                )
            )
        for kind in ("defaults", "ceilings", "platform_ceilings"):
            data.pop(kind, None)
    out.detail(data, title="Workspace budget")


def _limit(data: dict[str, Any], kind: str, key: str) -> str:
    value = (data.get(kind) or {}).get(key)
    return "none" if value is None else f"{value:g}" if isinstance(value, float) else str(value)


def _budget_line(data: dict[str, Any]) -> str:
    parts = [
        f"{key} default {_limit(data, 'defaults', key)}, ceiling {_limit(data, 'ceilings', key)}"
        for key in ("max_tokens_total", "max_cost_usd", "max_model_calls")
    ]
    return "; ".join(parts)


ROLE_HELP = "owner (adds, removes and re-roles members) or member."


@member_app.command("list")
def list_members() -> None:
    """List this repository's workspace members: name, email, role, active."""
    from osmosis.cli.credentials import open_client, platform_errors
    from osmosis.cli.output import output

    workspace = current_workspace()
    with platform_errors(), open_client(None) as client:
        public = client.workspaces.get(git=workspace.identity)
    output().listing(
        _members(public),
        columns=["name", "email", "role", "active", "user_id"],
        title=f"Members of {public.identity}",
        context=git_context(workspace, client.base_url),
    )


@member_app.command("add")
def add_member(
    user: str = typer.Argument(..., help="The user's email address or id."),
    role: str = typer.Option("member", "--role", help=ROLE_HELP),
) -> None:
    """Add an existing platform user to this repository's workspace (owners only)."""
    from osmosis.cli.credentials import open_client, platform_errors, request_body
    from osmosis.cli.output import output
    from osmosis.wire import MemberAdd

    workspace = current_workspace()
    by = {"email": user} if "@" in user else {"user_id": user}
    request_body(MemberAdd, role=role, **by)
    with platform_errors(), open_client(None) as client:
        public = client.workspaces.add_member(git=workspace.identity, role=role, **by)
    output().operation(
        "workspace.member.add",
        message=f"Added {user} to workspace {public.identity} as {role}.",
        resource={"identity": public.identity, "members": _members(public)},
    )


@member_app.command("remove")
def remove_member(
    user: str = typer.Argument(..., help="The member's email, name or id (yours: leave)."),
    yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask for confirmation."),
) -> None:
    """Remove a member (owners only), or leave the workspace yourself (asks first). The
    last active owner cannot be removed; the member's runs stay."""
    from osmosis.cli.credentials import open_client, platform_errors
    from osmosis.cli.output import output

    workspace = current_workspace()
    out = output()
    out.confirm(f"Remove {user} from workspace {workspace.identity}?", yes=yes)
    with platform_errors(), open_client(None) as client:
        removed = client.workspaces.remove_member(git=workspace.identity, member=user)
    out.operation(
        "workspace.member.remove",
        message=f"Removed {removed.name} from workspace {workspace.identity}.",
        resource={"identity": workspace.identity, "member": removed.model_dump(mode="json")},
    )


@member_app.command("set-role")
def set_role(
    user: str = typer.Argument(..., help="The member's email, name or id."),
    role: str = typer.Argument(..., help=ROLE_HELP),
) -> None:
    """Make a member an owner, or an owner a member (owners only; one active owner stays)."""
    from osmosis.cli.credentials import open_client, platform_errors, request_body
    from osmosis.cli.output import output
    from osmosis.wire import MemberUpdate

    workspace = current_workspace()
    request_body(MemberUpdate, role=role)
    with platform_errors(), open_client(None) as client:
        public = client.workspaces.set_member_role(git=workspace.identity, member=user, role=role)
    output().operation(
        "workspace.member.set-role",
        message=f"{user} is now {'an owner' if role == 'owner' else 'a member'} of "
        f"{public.identity}.",
        resource={"identity": public.identity, "members": _members(public)},
    )
