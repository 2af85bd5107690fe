"""`osmosis auth`: save a platform token, forget it, show whom it belongs to, and manage
one's own tokens (`auth token create|list|revoke`)."""

from __future__ import annotations

import os
from typing import Any

import typer

app = typer.Typer(
    help="Log in to a platform, inspect the current identity, manage your tokens.",
    no_args_is_help=True,
)
token_app = typer.Typer(help="Create, list and revoke your own API tokens.", no_args_is_help=True)
app.add_typer(token_app, name="token")

SHOWN_ONCE = "Store this token now: it is shown only once."
EXPIRES_HELP = (
    "Lifetime: 30d, 12h, 45m, 90s, 2w (a bare number is days) or 'never'. "
    "Default: the platform's OSMOSIS_TOKEN_TTL_DAYS."
)
# Columns of a token table (auth token list, admin token list).
TOKEN_COLUMNS = ["id", "name", "created_at", "last_used_at", "expires_at", "revoked_at"]
TOKEN_HEADERS = {
    "created_at": "Created",
    "last_used_at": "Last Used",
    "expires_at": "Expires",
    "revoked_at": "Revoked",
}


def lifetime(text: str | None) -> int | str | None:
    """`--expires-in` as the API's `expires_in`, or a VALIDATION `CLIError` saying the form."""
    from osmosis.cli.output import CLIError
    from osmosis.wire.tokens import parse_lifetime

    if text is None:
        return None
    try:
        return parse_lifetime(text)
    except ValueError as error:
        raise CLIError(f"--expires-in: {error}", details={"field": "expires_in"}) from None


def token_cells() -> dict[str, Any]:
    from osmosis.cli.output import short_time

    return {column: short_time for column in TOKEN_HEADERS}


def expiry_text(expires_at: Any) -> str:
    from osmosis.cli.output import short_time

    return f"expires {short_time(expires_at.isoformat())}" if expires_at else "never expires"


@app.command("login")
def login(
    token: str | None = typer.Option(
        None, "--token", help="An API token (osm_...); prompted for when interactive."
    ),
) -> None:
    """Verify a token with the platform and save it, keyed by platform URL.

    Saved owner-only in $OSMOSIS_CONFIG_DIR/credentials.json (default ~/.osmosis/).
    """
    from osmosis.cli.credentials import allow_insecure_http, platform_errors, resolve, save_login
    from osmosis.cli.output import CLIError, output
    from osmosis.client import PlatformClient

    out = output()
    if not token:
        if not out.interactive:
            raise CLIError(
                "a token is needed: pass --token",
                code="INTERACTIVE_REQUIRED",
                hint="osmosis auth login --token osm_... [--platform URL]",
            )
        token = typer.prompt("API token", hide_input=True)
    url = resolve(None, os.environ).url
    with (
        platform_errors(),
        PlatformClient(url, token, allow_insecure_http=allow_insecure_http(os.environ)) as client,
    ):
        identity = client.auth.whoami()
        path = save_login(os.environ, url=client.base_url, token=token, user=identity.user.name)
    out.operation(
        "auth.login",
        message=f"Logged in to {client.base_url} as {identity.user.name}.",
        resource={
            "platform_url": client.base_url,
            "user": identity.user.name,
            "is_admin": identity.user.is_admin,
            "credentials_file": str(path),
        },
    )


@app.command("logout")
def logout(
    revoke: bool = typer.Option(
        False, "--revoke", help="Also revoke the saved token on the platform, everywhere."
    ),
) -> None:
    """Forget the saved token for the platform; with --revoke the platform refuses it too
    (otherwise it stays valid wherever else it is used)."""
    from osmosis.cli.credentials import (
        allow_insecure_http,
        as_cli_error,
        forget_login,
        load_logins,
        resolve,
    )
    from osmosis.cli.output import output
    from osmosis.client import PlatformAPIError, PlatformClient

    out = output()
    url = resolve(None, os.environ).url
    saved = load_logins(os.environ)["platforms"].get(url)
    if revoke and isinstance(saved, dict) and saved.get("token"):
        # Revoke first: if the platform cannot be reached, the login stays to retry with.
        try:
            with PlatformClient(
                url, str(saved["token"]), allow_insecure_http=allow_insecure_http(os.environ)
            ) as client:
                client.auth.revoke_current_token()
        except PlatformAPIError as error:
            if error.status_code != 401:  # a 401: the token is dead already
                raise as_cli_error(error) from None
    removed = forget_login(os.environ, url=url)
    if os.environ.get("OSMOSIS_TOKEN"):
        out.warn("OSMOSIS_TOKEN is set and still provides a token")
    message = f"Logged out of {url}." if removed else f"No saved login for {url}."
    if removed and revoke:
        message = f"Logged out of {url} and revoked the token."
    out.operation(
        "auth.logout",
        message=message,
        resource={"platform_url": url, "removed": removed, "revoked": removed and revoke},
    )


@app.command("whoami")
def whoami() -> None:
    """Show the user behind the current token, and where the platform and token came from."""
    from osmosis.cli.credentials import open_client, platform_errors, resolve
    from osmosis.cli.output import output

    connection = resolve(None, os.environ)
    with platform_errors(), open_client(None) as client:
        identity = client.auth.whoami()
    expires = identity.token.expires_at
    output().detail(
        {
            "platform_url": client.base_url,
            "user": identity.user.name,
            "user_id": identity.user.id,
            "email": identity.user.email,
            "is_admin": identity.user.is_admin,
            "token_name": identity.token.name,
            "token_expires_at": expires.isoformat() if expires else None,
            "token_source": connection.token_source,
        },
        title="Logged in",
    )


@token_app.command("create")
def create_token(
    name: str = typer.Option("default", "--name", help="A label for the token."),
    expires_in: str | None = typer.Option(None, "--expires-in", help=EXPIRES_HELP),
) -> None:
    """Create another token of yours and print it (once). It never outlives the token you
    run this with; your first token comes from an admin (osmosis admin user create)."""
    from osmosis.cli.credentials import open_client, platform_errors, request_body
    from osmosis.cli.output import output
    from osmosis.wire import TokenCreate

    body = request_body(TokenCreate, name=name, expires_in=lifetime(expires_in))
    with platform_errors(), open_client(None) as client:
        issued = client.auth.create_token(name=body.name, expires_in=body.expires_in)
    output().operation(
        "auth.token.create",
        message=f"Created token {issued.name!r} ({issued.id}), "
        f"{expiry_text(issued.expires_at)}.\ntoken: {issued.token}\n{SHOWN_ONCE}",
        resource=issued.model_dump(mode="json"),
    )


@token_app.command("list")
def list_tokens() -> None:
    """List your tokens: id, name, created, last used, expires, revoked (never the secrets)."""
    from osmosis.cli.credentials import open_client, platform_errors
    from osmosis.cli.output import output

    with platform_errors(), open_client(None) as client:
        page = client.auth.list_tokens()
        current = client.auth.whoami().token.id
    items = [{**t.model_dump(mode="json"), "current": t.id == current} for t in page.tokens]
    output().listing(
        items,
        columns=[*TOKEN_COLUMNS, "current"],
        headers=TOKEN_HEADERS,
        cells=token_cells(),
        title="Your tokens",
        context={"platform_url": client.base_url},
    )


@token_app.command("revoke")
def revoke_token(
    token_id: str = typer.Argument(..., help="The token's id (see `osmosis auth token list`)."),
    yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask for confirmation."),
) -> None:
    """Revoke one of your tokens at once: every later request with it is refused."""
    revoke(token_id, yes=yes, own=True)


def revoke(token_id: str, *, yes: bool, own: bool) -> None:
    """Ask, revoke `token_id` (one's own, or with `own=False` any user's: admins) and say so."""
    from osmosis.cli.credentials import open_client, platform_errors
    from osmosis.cli.output import output

    out = output()
    out.confirm(f"Revoke token {token_id}? Anything using it stops working.", yes=yes)
    with platform_errors(), open_client(None) as client:
        if own:
            revoked = client.auth.revoke_token(token_id=token_id)
        else:
            revoked = client.admin.revoke_token(token_id=token_id)
    out.operation(
        "auth.token.revoke" if own else "admin.token.revoke",
        message=f"Revoked token {revoked.name!r} ({revoked.id}).",
        resource=revoked.model_dump(mode="json"),
    )
