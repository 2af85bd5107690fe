"""What every resource of the client shares: the connection, the error, the URL check.

    http = Transport("http://127.0.0.1:8765", token="osm_...")
    http.call("GET", "/api/auth/whoami", WhoAmI)   # the endpoint's pydantic model

Every failure is a `PlatformAPIError` carrying the server's `{code, message, details}`;
a connection that fails is code `NETWORK` and names the URL.
"""

from __future__ import annotations

import ssl
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

import httpx
from pydantic import BaseModel, ValidationError

from osmosis._version import __version__
from osmosis.loopback import is_loopback

_Model = TypeVar("_Model", bound=BaseModel)

_STATUS_CODES = {401: "AUTH_REQUIRED", 403: "FORBIDDEN", 404: "NOT_FOUND", 409: "CONFLICT"}


def _no_tls_needed() -> ssl.SSLContext:
    """The TLS context of a client to an `http://` platform, which speaks no TLS (the client
    follows no redirect and asks only paths): one trusting nothing, so TLS would fail closed.
    httpx's default loads the CA bundle, 0.1-0.25 s of every command that talks to a local
    platform."""
    return ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)


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


class Transport:
    """One `httpx.Client` to the platform, shared by every resource of a `PlatformClient`."""

    def __init__(
        self,
        base_url: str,
        token: str | None = None,
        *,
        timeout: float = 30.0,
        allow_insecure_http: bool = False,
        transport: httpx.BaseTransport | None = None,
        workspace: str | None = None,
    ) -> None:
        self.base_url = check_platform_url(base_url, allow_insecure_http=allow_insecure_http)
        self.workspace = workspace.strip() if workspace and workspace.strip() else None
        headers = {"User-Agent": f"osmosis/{__version__}", "X-Osmosis-CLI-Version": __version__}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        self.http = httpx.Client(
            base_url=self.base_url,
            headers=headers,
            timeout=timeout,
            transport=transport,
            verify=_no_tls_needed() if self.base_url.startswith("http://") else True,
            event_hooks={"request": [self._name_workspace]} if self.workspace else None,
            # A proxy from the environment must not see loopback traffic (or its token).
            trust_env=not is_loopback(urlsplit(self.base_url).hostname or ""),
        )

    def _name_workspace(self, request: httpx.Request) -> None:
        # `workspace` (osmosis --workspace NAME) names the scope instead of the checkout's
        # identity: every workspace-scoped request, streams and uploads included.
        if GIT_HEADER in request.headers and self.workspace:
            del request.headers[GIT_HEADER]
            request.headers[WORKSPACE_HEADER] = self.workspace

    def call(
        self,
        method: str,
        path: str,
        model: type[_Model],
        *,
        body: BaseModel | None = None,
        params: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
        content: Iterator[bytes] | None = None,
        timeout: httpx.Timeout | None = None,
    ) -> _Model:
        """One request, its answer parsed as `model`, any failure a `PlatformAPIError`."""
        url = f"{self.base_url}{path}"
        try:
            response = self.http.request(
                method,
                path,
                json=None if body is None else body.model_dump(mode="json", exclude_none=True),
                content=content,
                params=params,
                headers=headers,
                timeout=timeout or self.http.timeout,
            )
        except httpx.HTTPError as error:
            raise self.unreachable(error, path) from None
        if response.is_error:
            raise api_error(response)
        try:
            return model.model_validate_json(response.content or b"{}")
        except ValidationError as error:
            raise PlatformAPIError(
                f"unexpected response from {url}: {error.error_count()} field(s) do not match",
                code="PLATFORM_ERROR",
                status_code=response.status_code,
            ) from None

    def read_timeout(self, seconds: float) -> httpx.Timeout:
        """The usual connect timeout with a longer read: for answers that take minutes."""
        return httpx.Timeout(self.http.timeout.connect, read=seconds)

    def unreachable(self, error: httpx.HTTPError, path: str) -> PlatformAPIError:
        """A request that got no answer: code `NETWORK`, naming the URL."""
        return PlatformAPIError(
            f"cannot reach the platform at {self.base_url}: {error or type(error).__name__}",
            code="NETWORK",
            details={"url": f"{self.base_url}{path}"},
        )

    def close(self) -> None:
        self.http.close()


class Resource:
    """A group of endpoints (runs, datasets, ...) over the client's one `Transport`."""

    def __init__(self, transport: Transport) -> None:
        self._transport = transport


GIT_HEADER = "X-Osmosis-Git"
WORKSPACE_HEADER = "X-Osmosis-Workspace"
"""Sent instead of `X-Osmosis-Git` by a client made with `workspace=NAME`."""


def git_header(identity: str) -> dict[str, str]:
    """The workspace a request is about, by its git identity."""
    return {GIT_HEADER: identity}


class FileChanged(Exception):
    """The file being uploaded is shorter than when it was measured."""


def file_chunks(path: Path, size: int, chunk_size: int) -> Iterator[bytes]:
    """Exactly `size` bytes of `path`, a chunk at a time (never the whole file in memory)."""
    remaining = size
    with path.open("rb") as handle:
        while remaining > 0:
            block = handle.read(min(chunk_size, remaining))
            if not block:
                raise FileChanged(f"it ended after {size - remaining:,} of {size:,} bytes")
            remaining -= len(block)
            yield block


def changed_while_uploading(path: Path, error: FileChanged) -> PlatformAPIError:
    return PlatformAPIError(
        f"{path} changed while it was being uploaded: {error}",
        code="VALIDATION",
        details={"file": str(path)},
    )


def api_error(response: httpx.Response) -> PlatformAPIError:
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
