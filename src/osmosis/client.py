"""A typed HTTP client for the osmosis platform API; the CLI speaks to the platform only here.

    with PlatformClient("http://127.0.0.1:8765", token="osm_...") as client:
        client.whoami().user.name  # 'admin'

Every failure is a `PlatformAPIError` carrying the server's `{code, message, details}`;
a connection that fails is code `NETWORK` and names the URL.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from types import TracebackType
from typing import Any, TypeVar
from urllib.parse import quote, urlsplit

import httpx
from pydantic import BaseModel, ValidationError

from osmosis._version import __version__
from osmosis.platform.schemas import (
    Health,
    MemberAdd,
    SecretCreate,
    SecretList,
    SecretPublic,
    TokenCreate,
    TokenCreated,
    UserCreate,
    UserCreated,
    UserList,
    WhoAmI,
    WorkspacePublic,
)

__all__ = ["PlatformAPIError", "PlatformClient", "check_platform_url", "is_loopback"]

_Model = TypeVar("_Model", bound=BaseModel)

_STATUS_CODES = {401: "AUTH_REQUIRED", 403: "FORBIDDEN", 404: "NOT_FOUND", 409: "CONFLICT"}


class PlatformAPIError(Exception):
    """A request that did not succeed: the server's error, or `NETWORK` when none arrived.

    `status_code` is 0 when no HTTP response was received.
    """

    def __init__(
        self,
        message: str,
        *,
        code: str,
        status_code: int = 0,
        details: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.status_code = status_code
        self.details = dict(details or {})


def is_loopback(host: str) -> bool:
    """True for `localhost` and loopback addresses (127.0.0.0/8, ::1)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_platform_url(url: str, *, allow_insecure_http: bool = False) -> str:
    """`url` without a trailing slash, or a `VALIDATION` error if it is unusable or unsafe.

    Plain http sends the token in clear, so it is allowed only to loopback unless
    `allow_insecure_http` is set.

        check_platform_url("http://127.0.0.1:8765/")  # 'http://127.0.0.1:8765'
    """
    parts = urlsplit(url)
    if parts.scheme not in {"http", "https"} or not parts.hostname:
        raise PlatformAPIError(
            f"not a platform URL: {url!r} (expected http(s)://host[:port])", code="VALIDATION"
        )
    if parts.scheme == "http" and not allow_insecure_http and not is_loopback(parts.hostname):
        raise PlatformAPIError(
            f"refusing plain http to {parts.hostname}: the token would travel unencrypted",
            code="VALIDATION",
            details={"platform_url": url},
        )
    return url.rstrip("/")


class PlatformClient:
    """Methods per API endpoint, each returning the endpoint's pydantic model.

    client = PlatformClient("http://127.0.0.1:8765", token="osm_...")
    created = client.create_user(name="ada", email="ada@example.com")
    created.token.token  # the new user's secret, shown once
    """

    def __init__(
        self,
        base_url: str,
        token: str | None = None,
        *,
        timeout: float = 30.0,
        allow_insecure_http: bool = False,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.base_url = check_platform_url(base_url, allow_insecure_http=allow_insecure_http)
        headers = {"User-Agent": f"osmosis/{__version__}", "X-Osmosis-CLI-Version": __version__}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        self._http = httpx.Client(
            base_url=self.base_url,
            headers=headers,
            timeout=timeout,
            transport=transport,
            # A proxy from the environment must not see loopback traffic (or its token).
            trust_env=not is_loopback(urlsplit(self.base_url).hostname or ""),
        )

    # -- endpoints ---------------------------------------------------------------------
    def health(self) -> Health:
        return self._call("GET", "/api/health", Health)

    def whoami(self) -> WhoAmI:
        return self._call("GET", "/api/auth/whoami", WhoAmI)

    def create_user(
        self, *, name: str, email: str | None = None, is_admin: bool = False
    ) -> UserCreated:
        body = UserCreate(name=name, email=email, is_admin=is_admin)
        return self._call("POST", "/api/admin/users", UserCreated, body=body)

    def list_users(self, *, limit: int = 50, offset: int = 0) -> UserList:
        params = {"limit": limit, "offset": offset}
        return self._call("GET", "/api/admin/users", UserList, params=params)

    def create_token(self, *, user_id: str, name: str = "default") -> TokenCreated:
        path = f"/api/admin/users/{quote(user_id, safe='')}/tokens"
        return self._call("POST", path, TokenCreated, body=TokenCreate(name=name))

    # -- workspaces and secrets (`git` is the workspace identity, sent as X-Osmosis-Git) --
    def workspace(self, *, git: str) -> WorkspacePublic:
        """The workspace for `git`, created with the caller as owner on first use."""
        return self._call("GET", "/api/workspace", WorkspacePublic, headers=_git(git))

    def add_workspace_member(
        self, *, git: str, user_id: str | None = None, email: str | None = None
    ) -> WorkspacePublic:
        body = MemberAdd(user_id=user_id, email=email)
        return self._call(
            "POST", "/api/workspace/members", WorkspacePublic, body=body, headers=_git(git)
        )

    def list_secrets(self, *, git: str, scope: str = "all") -> SecretList:
        """Metadata of the secrets visible to the caller; `scope`: all, workspace, personal."""
        params = {"scope": scope}
        return self._call("GET", "/api/secrets", SecretList, params=params, headers=_git(git))

    def set_secret(self, *, git: str, name: str, value: str, scope: str = "user") -> SecretPublic:
        """Create or replace a secret. The value travels once, in the body, never in the URL.

        client.set_secret(git="o/r", name="OPENAI_API_KEY", value=key, scope="workspace")
        """
        try:
            body = SecretCreate.model_validate({"value": value, "scope": scope})
        except ValidationError as error:
            # pydantic's message quotes the input; only the field and the rule may surface.
            problems = "; ".join(
                f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in error.errors()
            )
            raise PlatformAPIError(f"invalid secret: {problems}", code="VALIDATION") from None
        path = f"/api/secrets/{quote(name, safe='')}"
        return self._call("PUT", path, SecretPublic, body=body, headers=_git(git))

    def delete_secret(self, *, git: str, name: str, scope: str = "user") -> SecretPublic:
        path = f"/api/secrets/{quote(name, safe='')}"
        params = {"scope": scope}
        return self._call("DELETE", path, SecretPublic, params=params, headers=_git(git))

    # -- plumbing ----------------------------------------------------------------------
    def _call(
        self,
        method: str,
        path: str,
        model: type[_Model],
        *,
        body: BaseModel | None = None,
        params: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> _Model:
        url = f"{self.base_url}{path}"
        try:
            response = self._http.request(
                method,
                path,
                json=None if body is None else body.model_dump(mode="json", exclude_none=True),
                params=params,
                headers=headers,
            )
        except httpx.HTTPError as error:
            raise PlatformAPIError(
                f"cannot reach the platform at {self.base_url}: {error or type(error).__name__}",
                code="NETWORK",
                details={"url": url},
            ) from None
        if response.is_error:
            raise _api_error(response)
        try:
            return model.model_validate_json(response.content or b"{}")
        except ValidationError as error:
            raise PlatformAPIError(
                f"unexpected response from {url}: {error.error_count()} field(s) do not match",
                code="PLATFORM_ERROR",
                status_code=response.status_code,
            ) from None

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> PlatformClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def _git(identity: str) -> dict[str, str]:
    return {"X-Osmosis-Git": identity}


def _api_error(response: httpx.Response) -> PlatformAPIError:
    """The server's envelope as an exception; a body that is not one still gives a code."""
    status = response.status_code
    fallback = _STATUS_CODES.get(status, "PLATFORM_ERROR")
    try:
        payload = response.json()
    except ValueError:
        payload = None
    error = payload.get("error") if isinstance(payload, dict) else None
    if isinstance(error, dict):
        details = error.get("details")
        return PlatformAPIError(
            str(error.get("message") or f"HTTP {status}"),
            code=str(error.get("code") or fallback),
            status_code=status,
            details=details if isinstance(details, dict) else {},
        )
    return PlatformAPIError(
        f"HTTP {status} from {response.request.url}", code=fallback, status_code=status
    )
