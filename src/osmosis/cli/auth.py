"""`osmosis auth`: save a platform token, forget it, and show whom it belongs to."""

from __future__ import annotations

import os

import typer

app = typer.Typer(
    help="Log in to a platform and inspect the current identity.", no_args_is_help=True
)


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
    from osmosis.cli.main import output
    from osmosis.cli.output import CLIError
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
        identity = client.whoami()
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
    from osmosis.cli.main import output
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
                client.revoke_token()
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
    from osmosis.cli.main import output

    connection = resolve(None, os.environ)
    with platform_errors(), open_client(None) as client:
        identity = client.whoami()
    output().detail(
        {
            "platform_url": client.base_url,
            "user": identity.user.name,
            "user_id": identity.user.id,
            "email": identity.user.email,
            "is_admin": identity.user.is_admin,
            "token_name": identity.token.name,
            "token_source": connection.token_source,
        },
        title="Logged in",
    )
