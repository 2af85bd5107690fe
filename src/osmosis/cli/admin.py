"""`osmosis admin`: create, list and (de)activate users; issue, list and revoke their tokens
(needs an admin token)."""

from __future__ import annotations

import typer

from osmosis.cli.auth import EXPIRES_HELP
from osmosis.vocabulary import MAX_PAGE

app = typer.Typer(help="Manage platform users and tokens (admin only).", no_args_is_help=True)
user_app = typer.Typer(help="Create, list, deactivate and reactivate users.", no_args_is_help=True)
token_app = typer.Typer(help="Issue, list and revoke API tokens.", no_args_is_help=True)
app.add_typer(user_app, name="user")
app.add_typer(token_app, name="token")


@user_app.command("create")
def create_user(
    name: str = typer.Argument(..., help="User name: letters, digits, '_', '.', '-'."),
    email: str | None = typer.Option(
        None, "--email", help="The user's email address (optional; members can be added by it)."
    ),
    admin: bool = typer.Option(False, "--admin", help="Make the user an administrator."),
) -> None:
    """Create a user and print its first API token (once)."""
    from osmosis.cli.credentials import open_client, platform_errors, request_body
    from osmosis.cli.output import output
    from osmosis.wire import UserCreate

    request_body(UserCreate, name=name, email=email, is_admin=admin)  # every problem, first
    with platform_errors(), open_client(None) as client:
        created = client.admin.create_user(name=name, email=email, is_admin=admin)
    user = created.user
    from osmosis.cli.auth import SHOWN_ONCE, expiry_text

    output().operation(
        "admin.user.create",
        message=f"Created user {user.name} ({user.id}).\n"
        f"token: {created.token.token} ({expiry_text(created.token.expires_at)})\n{SHOWN_ONCE}",
        resource={
            **user.model_dump(mode="json"),
            "token": created.token.token,
            "token_name": created.token.name,
        },
    )


@user_app.command("list")
def list_users(
    limit: int = typer.Option(MAX_PAGE, "--limit", min=1, max=MAX_PAGE, help="Users per page."),
    offset: int = typer.Option(0, "--offset", min=0, help="Users to skip."),
) -> None:
    """List users."""
    from osmosis.cli.credentials import open_client, platform_errors
    from osmosis.cli.output import output

    with platform_errors(), open_client(None) as client:
        page = client.admin.list_users(limit=limit, offset=offset)
    from osmosis.cli.output import short_time

    output().listing(
        [user.model_dump(mode="json") for user in page.users],
        columns=["id", "name", "email", "is_admin", "created_at", "deactivated_at"],
        headers={"deactivated_at": "Deactivated"},
        cells={"created_at": short_time, "deactivated_at": short_time},
        title="Users",
        total_count=page.total_count,
        has_more=page.has_more,
        next_offset=page.next_offset,
        context={"platform_url": client.base_url},
    )


@user_app.command("deactivate")
def deactivate_user(
    user: str = typer.Argument(..., help="The user's id, name or email."),
    yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask for confirmation."),
) -> None:
    """Stop a user's tokens and dashboard sessions at once (asks first). Their runs,
    secrets and memberships stay; `reactivate` lets their tokens work again."""
    from osmosis.cli.credentials import open_client, platform_errors
    from osmosis.cli.output import output

    out = output()
    out.confirm(f"Deactivate {user}? Their tokens and sessions stop working now.", yes=yes)
    with platform_errors(), open_client(None) as client:
        done = client.admin.deactivate_user(user=user)
    message = f"Deactivated {done.user.name} ({done.user.id}); {done.sessions_ended} " + (
        "dashboard session ended." if done.sessions_ended == 1 else "dashboard sessions ended."
    )
    if done.workspaces_without_owner:
        message += (
            "\nNo active owner left in: " + ", ".join(done.workspaces_without_owner) + " "
            "(add one there: osmosis workspace member add EMAIL --role owner)"
        )
    out.operation("admin.user.deactivate", message=message, resource=done.model_dump(mode="json"))


@user_app.command("reactivate")
def reactivate_user(
    user: str = typer.Argument(..., help="The user's id, name or email."),
) -> None:
    """Let a deactivated user's tokens (those not revoked or expired) work again."""
    from osmosis.cli.credentials import open_client, platform_errors
    from osmosis.cli.output import output

    with platform_errors(), open_client(None) as client:
        public = client.admin.reactivate_user(user=user)
    output().operation(
        "admin.user.reactivate",
        message=f"Reactivated {public.name} ({public.id}).",
        resource=public.model_dump(mode="json"),
    )


@token_app.command("create")
def create_token(
    user_id: str = typer.Argument(..., help="The user's id (see `osmosis admin user list`)."),
    name: str = typer.Option("default", "--name", help="A label for the token."),
    expires_in: str | None = typer.Option(None, "--expires-in", help=EXPIRES_HELP),
) -> None:
    """Issue another API token for a user and print it (once)."""
    from osmosis.cli.auth import SHOWN_ONCE, expiry_text, lifetime
    from osmosis.cli.credentials import open_client, platform_errors, request_body
    from osmosis.cli.output import output
    from osmosis.wire import TokenCreate

    body = request_body(TokenCreate, name=name, expires_in=lifetime(expires_in))
    with platform_errors(), open_client(None) as client:
        issued = client.admin.create_token(
            user_id=user_id, name=body.name, expires_in=body.expires_in
        )
    output().operation(
        "admin.token.create",
        message=f"Issued token {issued.name!r} for user {issued.user_id}, "
        f"{expiry_text(issued.expires_at)}.\ntoken: {issued.token}\n{SHOWN_ONCE}",
        resource=issued.model_dump(mode="json"),
    )


@token_app.command("list")
def list_tokens(
    user_id: str = typer.Argument(..., help="The user's id (see `osmosis admin user list`)."),
) -> None:
    """List a user's tokens: id, name, created, last used, expires, revoked (never the
    secrets)."""
    from osmosis.cli.auth import TOKEN_COLUMNS, TOKEN_HEADERS, token_cells
    from osmosis.cli.credentials import open_client, platform_errors
    from osmosis.cli.output import output

    with platform_errors(), open_client(None) as client:
        page = client.admin.list_tokens(user_id=user_id)
    items = [token.model_dump(mode="json") for token in page.tokens]
    output().listing(
        items,
        columns=TOKEN_COLUMNS,
        headers=TOKEN_HEADERS,
        cells=token_cells(),
        title=f"Tokens of user {user_id}",
        context={"user_id": user_id, "platform_url": client.base_url},
    )


@token_app.command("revoke")
def revoke_token(
    token_id: str = typer.Argument(..., help="The token's id (see `osmosis admin token list`)."),
    yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask for confirmation."),
) -> None:
    """Revoke a token at once: every later request with it is refused (asks first)."""
    from osmosis.cli.auth import revoke

    revoke(token_id, yes=yes, own=False)
