"""`osmosis secret`: set, list and delete the secrets of this repository's workspace.

A value never comes from the command line (argv is visible to other users in `ps`): it is
read from the environment variable named by `--env`, or from a hidden prompt.

    OPENAI_API_KEY=sk-... osmosis secret set OPENAI_API_KEY --env OPENAI_API_KEY
    osmosis secret list --scope workspace
"""

from __future__ import annotations

import os
import re
from enum import StrEnum
from typing import Any

import typer

from osmosis.vocabulary import MAX_PAGE

app = typer.Typer(help="Manage workspace and personal secrets.", no_args_is_help=True)


class Scope(StrEnum):
    personal = "personal"
    workspace = "workspace"


class ListScope(StrEnum):
    all = "all"
    workspace = "workspace"
    personal = "personal"


ScopeOption = typer.Option(
    Scope.personal,
    "--scope",
    help="personal: only you see it (overrides a workspace secret of the same name); "
    "workspace: every member sees it.",
)


def _check_name(name: str) -> None:
    from osmosis.cli.output import CLIError
    from osmosis.wire import SECRET_NAME_MAX, SECRET_NAME_PATTERN

    if not (1 <= len(name) <= SECRET_NAME_MAX) or not re.match(SECRET_NAME_PATTERN, name):
        # `openai-api-key` most likely means OPENAI_API_KEY: offer it when that is valid.
        suggestion = name.upper().replace("-", "_")
        usable = len(suggestion) <= SECRET_NAME_MAX and re.match(SECRET_NAME_PATTERN, suggestion)
        raise CLIError(
            f"invalid secret name {name!r}: use A-Z, 0-9 and _, starting with a letter "
            f"(at most {SECRET_NAME_MAX} characters)",
            code="VALIDATION",
            details={"name": name[:SECRET_NAME_MAX], "pattern": SECRET_NAME_PATTERN},
            hint=f"did you mean {suggestion}?" if usable else "for example OPENAI_API_KEY",
        )


def _row(secret: Any) -> dict[str, Any]:
    return {
        "name": secret.name,
        "scope": "personal" if secret.scope == "user" else "workspace",
        "updated_at": secret.updated_at.isoformat(timespec="seconds"),
        "updated_by": secret.updated_by,
    }


def _read_value(name: str, env_var: str | None, *, interactive: bool) -> str:
    from osmosis.cli.output import CLIError

    if env_var:
        value = os.environ.get(env_var)
        if value is None:
            raise CLIError(
                f"--env {env_var}: the variable is not set",
                code="VALIDATION",
                details={"env": env_var},
                hint=f"export {env_var}=... first, or pass --env-file FILE",
            )
    elif interactive:
        value = typer.prompt(f"Value for {name}", hide_input=True)
    else:
        raise CLIError(
            "a secret value is read from a hidden prompt, which needs an interactive terminal",
            code="INTERACTIVE_REQUIRED",
            details={"flags": ["--env"]},
            hint=f"osmosis secret set {name} --env VARIABLE_HOLDING_THE_VALUE",
        )
    if not value:
        source = f"--env {env_var}: the variable is set but" if env_var else "the value"
        raise CLIError(
            f"{source} is empty; a secret needs a value",
            code="VALIDATION",
            details={"name": name, "env": env_var},
        )
    return value


@app.command("set")
def set_secret(
    name: str = typer.Argument(..., help="Secret name, e.g. OPENAI_API_KEY."),
    scope: Scope = ScopeOption,
    env_var: str | None = typer.Option(
        None, "--env", metavar="VAR", help="Read the value from this environment variable."
    ),
) -> None:
    """Create or replace a secret; the value comes from --env VAR or a hidden prompt."""
    from osmosis.cli.credentials import open_client, platform_errors
    from osmosis.cli.output import output
    from osmosis.cli.workspace import current_workspace, git_context

    out = output()
    _check_name(name)
    workspace = current_workspace()
    value = _read_value(name, env_var, interactive=out.interactive)
    with platform_errors(), open_client(None) as client:
        secret = client.secrets.set(
            git=workspace.identity, name=name, value=value, scope=scope.value
        )
    out.operation(
        "secret.set",
        message=f"Set {scope.value} secret {name} in workspace {workspace.identity}.",
        resource={**_row(secret), **git_context(workspace, client.base_url)},
    )


@app.command("list")
def list_secrets(
    scope: ListScope = typer.Option(ListScope.all, "--scope", help="Which secrets to list."),
    limit: int = typer.Option(
        MAX_PAGE,
        "--limit",
        min=1,
        max=MAX_PAGE,
        help=f"Secrets to show (1-{MAX_PAGE}).",
    ),
    everything: bool = typer.Option(False, "--all", help="Every secret, page after page."),
) -> None:
    """List secret names (never values) visible to you in this workspace."""
    from osmosis.cli.credentials import open_client, platform_errors
    from osmosis.cli.output import output, short_time
    from osmosis.cli.paging import check_limit, collect
    from osmosis.cli.workspace import current_workspace, git_context

    check_limit(limit, everything=everything)
    workspace = current_workspace()
    with platform_errors(), open_client(None) as client:
        page = collect(
            lambda limit, offset: client.secrets.list(
                git=workspace.identity, scope=scope.value, limit=limit, offset=offset
            ),
            items=lambda page: page.secrets,
            limit=limit,
            everything=everything,
        )
    output().listing(
        [_row(secret) for secret in page.items],
        columns=["name", "scope", "updated_at", "updated_by"],
        headers={"updated_at": "Updated"},
        cells={"updated_at": short_time},
        title=f"Secrets of {workspace.identity}",
        total_count=page.total_count,
        has_more=page.has_more,
        next_offset=page.next_offset,
        context=git_context(workspace, client.base_url),
    )


@app.command("delete")
def delete_secret(
    name: str = typer.Argument(..., help="Secret name."),
    scope: Scope = ScopeOption,
    yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask for confirmation."),
) -> None:
    """Delete a secret (asks first unless --yes)."""
    from osmosis.cli.credentials import open_client, platform_errors
    from osmosis.cli.output import CLIError, output
    from osmosis.cli.paging import collect
    from osmosis.cli.workspace import current_workspace, git_context

    out = output()
    _check_name(name)
    workspace = current_workspace()
    with platform_errors(), open_client(None) as client:
        # Check before asking: a typo should fail at once, with a hint to the other scope.
        visible = collect(
            lambda limit, offset: client.secrets.list(
                git=workspace.identity, limit=limit, offset=offset
            ),
            items=lambda page: page.secrets,
            limit=MAX_PAGE,
            everything=True,
        ).items
        wire = "user" if scope is Scope.personal else "workspace"
        if not any(s.name == name and s.scope == wire for s in visible):
            other = Scope.workspace if scope is Scope.personal else Scope.personal
            hint = (
                f"a {other.value} secret {name} exists: add --scope {other.value}"
                if any(s.name == name for s in visible)
                else "osmosis secret list shows the names"
            )
            raise CLIError(
                f"no {scope.value} secret {name} in workspace {workspace.identity}",
                code="NOT_FOUND",
                details={"name": name, "scope": scope.value},
                hint=hint,
            )
        out.confirm(f"Delete {scope.value} secret {name} from {workspace.identity}?", yes=yes)
        secret = client.secrets.delete(git=workspace.identity, name=name, scope=wire)
    out.operation(
        "secret.delete",
        message=f"Deleted {scope.value} secret {name} from {workspace.identity}.",
        resource={**_row(secret), **git_context(workspace, client.base_url)},
    )
