"""`osmosis admin`: create users and tokens on the platform (needs an admin token)."""

from __future__ import annotations

import typer

app = typer.Typer(help="Manage platform users and tokens (admin only).", no_args_is_help=True)
user_app = typer.Typer(help="Create and list users.", no_args_is_help=True)
token_app = typer.Typer(help="Issue, list and revoke API tokens.", no_args_is_help=True)
app.add_typer(user_app, name="user")
app.add_typer(token_app, name="token")

_SHOWN_ONCE = "Store this token now: it is shown only once."


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
    from osmosis.cli.main import output
    from osmosis.platform.schemas import UserCreate

    request_body(UserCreate, name=name, email=email, is_admin=admin)  # every problem, first
    with platform_errors(), open_client(None) as client:
        created = client.create_user(name=name, email=email, is_admin=admin)
    user = created.user
    output().operation(
        "admin.user.create",
        message=f"Created user {user.name} ({user.id}).\n"
        f"token: {created.token.token}\n{_SHOWN_ONCE}",
        resource={
            **user.model_dump(mode="json"),
            "token": created.token.token,
            "token_name": created.token.name,
        },
    )


@user_app.command("list")
def list_users(
    limit: int = typer.Option(50, "--limit", min=1, max=50, help="Users per page."),
    offset: int = typer.Option(0, "--offset", min=0, help="Users to skip."),
) -> None:
    """List users."""
    from osmosis.cli.credentials import open_client, platform_errors
    from osmosis.cli.main import output

    with platform_errors(), open_client(None) as client:
        page = client.list_users(limit=limit, offset=offset)
    output().listing(
        [user.model_dump(mode="json") for user in page.users],
        columns=["id", "name", "email", "is_admin", "created_at"],
        title="Users",
        total_count=page.total_count,
        has_more=page.has_more,
        next_offset=page.next_offset,
        context={"platform_url": client.base_url},
    )


@token_app.command("create")
def create_token(
    user_id: str = typer.Argument(..., help="The user's id (see `osmosis admin user list`)."),
    name: str = typer.Option("default", "--name", help="A label for the token."),
) -> None:
    """Issue another API token for a user and print it (once)."""
    from osmosis.cli.credentials import open_client, platform_errors, request_body
    from osmosis.cli.main import output
    from osmosis.platform.schemas import TokenCreate

    request_body(TokenCreate, name=name)
    with platform_errors(), open_client(None) as client:
        issued = client.create_token(user_id=user_id, name=name)
    output().operation(
        "admin.token.create",
        message=f"Issued token {issued.name!r} for user {issued.user_id}.\n"
        f"token: {issued.token}\n{_SHOWN_ONCE}",
        resource=issued.model_dump(mode="json"),
    )


@token_app.command("list")
def list_tokens(
    user_id: str = typer.Argument(..., help="The user's id (see `osmosis admin user list`)."),
) -> None:
    """List a user's tokens: id, name, created, last used, revoked (never the secrets)."""
    from osmosis.cli.credentials import open_client, platform_errors
    from osmosis.cli.main import output
    from osmosis.cli.output import short_time

    with platform_errors(), open_client(None) as client:
        page = client.list_tokens(user_id=user_id)
    items = [token.model_dump(mode="json") for token in page.tokens]
    output().listing(
        items,
        columns=["id", "name", "created_at", "last_used_at", "revoked_at"],
        headers={"created_at": "Created", "last_used_at": "Last Used", "revoked_at": "Revoked"},
        cells={"created_at": short_time, "last_used_at": short_time, "revoked_at": short_time},
        title=f"Tokens of user {user_id}",
        context={"user_id": user_id, "platform_url": client.base_url},
    )


@token_app.command("revoke")
def revoke_token(
    token_id: str = typer.Argument(..., help="The token's id (see `osmosis admin token list`)."),
    yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask for confirmation."),
) -> None:
    """Revoke a token at once: every later request with it is refused (asks first)."""
    from osmosis.cli.credentials import open_client, platform_errors
    from osmosis.cli.main import output

    out = output()
    out.confirm(f"Revoke token {token_id}? Anything using it stops working.", yes=yes)
    with platform_errors(), open_client(None) as client:
        revoked = client.revoke_token(token_id=token_id)
    out.operation(
        "admin.token.revoke",
        message=f"Revoked token {revoked.name!r} ({revoked.id}).",
        resource=revoked.model_dump(mode="json"),
    )
