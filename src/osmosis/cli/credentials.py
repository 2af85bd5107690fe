"""Where the CLI keeps platform tokens, and which platform and token a command uses.

Resolution, first match wins:

1. `--platform` / `OSMOSIS_PLATFORM_URL` for the URL, `OSMOSIS_TOKEN` for the token (refused
   when `OSMOSIS_TOKEN_PLATFORM_URL`, as the official CLI reads it, binds it to another
   platform: a CI token is never sent where it was not meant to go);
2. the CLI credentials file (`$OSMOSIS_CONFIG_DIR/credentials.json`, default
   `~/.osmosis/credentials.json`), written by `osmosis auth login`, keyed by platform URL;
3. the embedded server's `<OSMOSIS_HOME>/credentials.json`, so a local platform needs no login.

Nothing heavy at module level: `osmosis.cli.main` imports this module at start-up.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from pydantic import BaseModel

    from osmosis.cli.output import CLIError
    from osmosis.client import PlatformAPIError, PlatformClient

_Body = TypeVar("_Body", bound="BaseModel")

DEFAULT_CONFIG_DIR = Path("~/.osmosis")
DEFAULT_HOME = Path("~/.osmosis/platform")
DEFAULT_PLATFORM_URL = "http://127.0.0.1:8765"

LOGIN_HINT = "run `osmosis auth login --token TOKEN [--platform URL]` or set OSMOSIS_TOKEN"

# `--platform URL`, taken from anywhere on the line by `osmosis.cli.main` before parsing.
_global_platform: ContextVar[str | None] = ContextVar("osmosis_platform", default=None)


def use_platform(url: str | None) -> None:
    """Make `url` the platform of every command in this context (the global `--platform`)."""
    _global_platform.set(url)


# `--workspace NAME`, the same way: the workspace requests name, instead of the checkout's.
_global_workspace: ContextVar[str | None] = ContextVar("osmosis_workspace", default=None)


def use_workspace(name: str | None) -> None:
    """Make workspace `name` the scope of every command in this context (`--workspace`)."""
    _global_workspace.set(name.strip() if name and name.strip() else None)


def named_workspace() -> str | None:
    """The workspace `--workspace` named, if any."""
    return _global_workspace.get()


@dataclass(frozen=True)
class Connection:
    """The platform a command talks to, the token it presents, and where each came from."""

    url: str
    token: str | None
    url_source: str
    token_source: str | None


def config_dir(env: Mapping[str, str]) -> Path:
    return Path(env.get("OSMOSIS_CONFIG_DIR") or DEFAULT_CONFIG_DIR).expanduser()


def cli_credentials_file(env: Mapping[str, str]) -> Path:
    return config_dir(env) / "credentials.json"


def embedded_credentials_file(env: Mapping[str, str]) -> Path:
    return Path(env.get("OSMOSIS_HOME") or DEFAULT_HOME).expanduser() / "credentials.json"


def allow_insecure_http(env: Mapping[str, str]) -> bool:
    return env.get("OSMOSIS_ALLOW_INSECURE_HTTP", "").strip().lower() in {"1", "true", "yes"}


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as error:
        from osmosis.cli.output import CLIError

        raise CLIError(
            f"cannot read {path}: {error}",
            code="VALIDATION",
            hint="fix or delete the file, then log in again",
        ) from None
    return data if isinstance(data, dict) else {}


def _normalise(url: str) -> str:
    return url.strip().rstrip("/")


def load_logins(env: Mapping[str, str]) -> dict[str, Any]:
    """The CLI credentials file: `{"current": url, "platforms": {url: {"token", "user"}}}`."""
    data = _read_json(cli_credentials_file(env))
    platforms = data.get("platforms")
    return {
        "current": data.get("current"),
        "platforms": platforms if isinstance(platforms, dict) else {},
    }


def save_login(env: Mapping[str, str], *, url: str, token: str, user: str) -> Path:
    """Remember `token` for `url` and make it the current platform; returns the file."""
    from osmosis.private_file import write_private_json

    logins = load_logins(env)
    logins["platforms"][_normalise(url)] = {"token": token, "user": user}
    logins["current"] = _normalise(url)
    path = cli_credentials_file(env)
    write_private_json(path, logins)
    return path


def forget_login(env: Mapping[str, str], *, url: str) -> bool:
    """Drop the saved token for `url`; False when there was none."""
    from osmosis.private_file import write_private_json

    logins = load_logins(env)
    if logins["platforms"].pop(_normalise(url), None) is None:
        return False
    if logins["current"] == _normalise(url):
        logins["current"] = next(iter(logins["platforms"]), None)
    write_private_json(cli_credentials_file(env), logins)
    return True


def resolve(platform: str | None, env: Mapping[str, str]) -> Connection:
    """Which platform and token to use (see the module docstring for the order); `platform`
    None means the global `--platform`, if one was given."""
    platform = platform or _global_platform.get()
    logins = load_logins(env)
    embedded = _read_json(embedded_credentials_file(env))
    if platform:
        url, url_source = platform, "--platform"
    elif env.get("OSMOSIS_PLATFORM_URL"):
        url, url_source = env["OSMOSIS_PLATFORM_URL"], "OSMOSIS_PLATFORM_URL"
    elif logins["current"]:
        url, url_source = str(logins["current"]), str(cli_credentials_file(env))
    elif embedded.get("platform_url"):
        url, url_source = str(embedded["platform_url"]), str(embedded_credentials_file(env))
    else:
        url, url_source = DEFAULT_PLATFORM_URL, "default"
    url = _normalise(url)
    _check_token_store(env)

    saved = logins["platforms"].get(url)
    if env.get("OSMOSIS_TOKEN"):
        _check_token_binding(env, url=url, url_source=url_source)
        token, token_source = env["OSMOSIS_TOKEN"], "OSMOSIS_TOKEN"
    elif isinstance(saved, dict) and saved.get("token"):
        token, token_source = str(saved["token"]), str(cli_credentials_file(env))
    elif embedded.get("token") and _normalise(str(embedded.get("platform_url", ""))) == url:
        token, token_source = str(embedded["token"]), str(embedded_credentials_file(env))
    else:
        return Connection(url=url, token=None, url_source=url_source, token_source=None)
    return Connection(url=url, token=token, url_source=url_source, token_source=token_source)


_TOKEN_STORES = ("auto", "keyring", "file")


def _check_token_binding(env: Mapping[str, str], *, url: str, url_source: str) -> None:
    """`OSMOSIS_TOKEN_PLATFORM_URL` names the platform `OSMOSIS_TOKEN` belongs to (the
    official CLI's convention): another platform gets no token, and the error says so."""
    from osmosis.cli.output import CLIError

    bound = env.get("OSMOSIS_TOKEN_PLATFORM_URL", "").strip()
    if bound and _without_scheme(bound) != _without_scheme(url):
        raise CLIError(
            f"OSMOSIS_TOKEN is bound to {_normalise(bound)} (OSMOSIS_TOKEN_PLATFORM_URL) but "
            f"this command talks to {url} (from {url_source}); the token was not sent",
            code="ENV_TOKEN_PLATFORM_MISMATCH",
            details={"token_platform_url": _normalise(bound), "platform_url": url},
            hint="point OSMOSIS_PLATFORM_URL (or --platform) at the token's platform, or set "
            "OSMOSIS_TOKEN_PLATFORM_URL to this one",
        )


def _without_scheme(url: str) -> str:
    """`url` as the binding compares it: the official CLI accepts a scheme-less URL."""
    return _normalise(url).split("://", 1)[-1].lower()


def _check_token_store(env: Mapping[str, str]) -> None:
    """`OSMOSIS_TOKEN_STORE` (official: auto, keyring, file): a value outside those is a
    mistake worth saying; ours always keeps logins in `credentials.json`."""
    from osmosis.cli.output import CLIError

    store = env.get("OSMOSIS_TOKEN_STORE", "").strip()
    if store and store not in _TOKEN_STORES:
        raise CLIError(
            f"OSMOSIS_TOKEN_STORE must be one of {', '.join(_TOKEN_STORES)}, got {store!r}",
            code="VALIDATION",
            details={"variable": "OSMOSIS_TOKEN_STORE", "value": store},
            hint="osmosis keeps logins in $OSMOSIS_CONFIG_DIR/credentials.json (0600) "
            "whichever of them is set",
        )


def as_cli_error(error: PlatformAPIError) -> CLIError:
    """The client's error as the CLI's, with a hint for the failures users can fix."""
    from osmosis.cli.output import CLIError

    hints = {
        "AUTH_REQUIRED": LOGIN_HINT,
        "FORBIDDEN": "this needs an admin token",
        "NETWORK": "is the platform running? `osmosis server status` shows the local one",
        "VALIDATION": "set OSMOSIS_ALLOW_INSECURE_HTTP=1 to allow plain http anyway"
        if "plain http" in error.message
        else None,
    }
    details = {**error.details}
    if error.status_code:
        details.setdefault("status_code", error.status_code)
    hint = hints.get(error.code)
    if error.status_code == 401:
        # A rejected token: say which one, or the user re-logs in while OSMOSIS_TOKEN (or a
        # stale saved login) keeps sending the same dead token.
        source = resolve(None, os.environ).token_source
        if source is not None:
            details.setdefault("token_source", source)
            hint = (
                "OSMOSIS_TOKEN holds a token the platform rejects: unset it or set a valid one"
                if source == "OSMOSIS_TOKEN"
                else f"the token from {source} was rejected; {LOGIN_HINT}"
            )
    return CLIError(error.message, code=error.code, details=details, hint=hint)


def request_body(model: type[_Body], **fields: Any) -> _Body:
    """`model(**fields)`, or a VALIDATION `CLIError` naming every bad field and its rule, so
    a typo never reaches the platform (or a traceback reaches the user).

        body = request_body(UserCreate, name="ada", email=None)
    """
    from pydantic import ValidationError

    from osmosis.cli.output import CLIError

    try:
        return model(**fields)
    except ValidationError as error:
        problems = []
        for issue in error.errors():
            field = ".".join(str(part) for part in issue["loc"]) or "body"
            info = model.model_fields.get(str(issue["loc"][0])) if issue["loc"] else None
            # A field's description states its rule better than a regular expression does.
            if issue["type"] == "string_pattern_mismatch" and info and info.description:
                problems.append(f"{field} {issue['input']!r}: {info.description.rstrip('.')}")
            else:
                problems.append(f"{field}: {issue['msg']}")
        raise CLIError("invalid " + "; ".join(problems), details={"problems": problems}) from None


@contextmanager
def platform_errors() -> Iterator[None]:
    """Turn a `PlatformAPIError` raised inside the block into the matching `CLIError`."""
    from osmosis.client import PlatformAPIError

    try:
        yield
    except PlatformAPIError as error:
        raise as_cli_error(error) from None


def open_client(
    platform: str | None,
    env: Mapping[str, str] | None = None,
    *,
    require_token: bool = True,
) -> PlatformClient:
    """A `PlatformClient` for the resolved connection, or a `CLIError` saying what is missing.

    with open_client(None) as client:
        client.auth.whoami()
    """
    from osmosis.cli.output import CLIError
    from osmosis.client import PlatformAPIError, PlatformClient, check_platform_url

    source = os.environ if env is None else env
    connection = resolve(platform, source)
    # The URL is checked first: an unsafe URL is the problem to report, not a missing token.
    try:
        check_platform_url(connection.url, allow_insecure_http=allow_insecure_http(source))
    except PlatformAPIError as error:
        raise as_cli_error(error) from None
    if require_token and connection.token is None:
        raise CLIError(
            f"not logged in to {connection.url}",
            code="AUTH_REQUIRED",
            details={"platform_url": connection.url},
            hint=LOGIN_HINT,
        )
    try:
        return PlatformClient(
            connection.url,
            connection.token,
            allow_insecure_http=allow_insecure_http(source),
            workspace=named_workspace(),
        )
    except PlatformAPIError as error:
        raise as_cli_error(error) from None
