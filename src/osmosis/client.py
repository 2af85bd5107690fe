"""A typed HTTP client for the osmosis platform API; the CLI speaks to the platform only here.

    with PlatformClient("http://127.0.0.1:8765", token="osm_...") as client:
        client.whoami().user.name  # 'admin'

Every failure is a `PlatformAPIError` carrying the server's `{code, message, details}`;
a connection that fails is code `NETWORK` and names the URL.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar
from urllib.parse import quote, urlsplit

import httpx
from pydantic import BaseModel, ValidationError

from osmosis._version import __version__
from osmosis.loopback import is_loopback
from osmosis.wire import (
    Health,
    MemberAdd,
    MemberUpdate,
    SecretCreate,
    SecretList,
    SecretPublic,
    TokenCreate,
    TokenCreated,
    TokenList,
    TokenPublic,
    UserCreate,
    UserCreated,
    UserDeactivated,
    UserList,
    UserPublic,
    WhoAmI,
    WorkspaceCreate,
    WorkspaceList,
    WorkspaceMemberPublic,
    WorkspacePublic,
    WorkspaceUpdate,
)
from osmosis.wire.datasets import (
    SHA256_HEADER,
    DatasetList,
    DatasetLogList,
    DatasetPreview,
    DatasetPublic,
    name_problem,
)
from osmosis.wire.runs import (
    AttemptList,
    EvalRunCreate,
    EvalRunCreated,
    EvalRunDetail,
    EvalRunList,
    EvalRunLogs,
    EvalRunOperation,
    EvalRunRetried,
    EvalRunRetry,
    EvalRunStop,
    FileManifest,
    ImportFileState,
    RunImportCreate,
    RunImportSession,
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

    def create_token(
        self, *, user_id: str, name: str = "default", expires_in: int | str | None = None
    ) -> TokenCreated:
        """Issue a token for a user (admin); `expires_in`: seconds, "never", or None for the
        server's default lifetime."""
        path = f"/api/admin/users/{quote(user_id, safe='')}/tokens"
        body = TokenCreate.model_validate({"name": name, "expires_in": expires_in})
        return self._call("POST", path, TokenCreated, body=body)

    def deactivate_user(self, *, user: str) -> UserDeactivated:
        """Stop a user's tokens and sessions at once (admin); `user`: id, name or email."""
        path = f"/api/admin/users/{quote(user, safe='')}/deactivate"
        return self._call("POST", path, UserDeactivated)

    def reactivate_user(self, *, user: str) -> UserPublic:
        path = f"/api/admin/users/{quote(user, safe='')}/reactivate"
        return self._call("POST", path, UserPublic)

    def create_own_token(
        self, *, name: str = "default", expires_in: int | str | None = None
    ) -> TokenCreated:
        """A new token of the caller's (never outliving the token this client presents)."""
        body = TokenCreate.model_validate({"name": name, "expires_in": expires_in})
        return self._call("POST", "/api/auth/tokens", TokenCreated, body=body)

    def list_own_tokens(self) -> TokenList:
        return self._call("GET", "/api/auth/tokens", TokenList)

    def revoke_own_token(self, *, token_id: str) -> TokenPublic:
        """Revoke one of the caller's tokens by id (another user's id is NOT_FOUND)."""
        return self._call("DELETE", f"/api/auth/tokens/{quote(token_id, safe='')}", TokenPublic)

    def list_tokens(self, *, user_id: str) -> TokenList:
        path = f"/api/admin/users/{quote(user_id, safe='')}/tokens"
        return self._call("GET", path, TokenList)

    def revoke_token(self, *, token_id: str | None = None) -> TokenPublic:
        """Revoke a token by id (admin), or with None the token this client presents."""
        if token_id is None:
            return self._call("DELETE", "/api/auth/token", TokenPublic)
        return self._call("DELETE", f"/api/admin/tokens/{quote(token_id, safe='')}", TokenPublic)

    # -- workspaces and secrets (`git` is the workspace identity, sent as X-Osmosis-Git) --
    def workspace(self, *, git: str) -> WorkspacePublic:
        """The workspace for `git`, created with the caller as owner on first use."""
        return self._call("GET", "/api/workspace", WorkspacePublic, headers=_git(git))

    def create_workspace(self, *, identity: str, owner: str | None = None) -> WorkspacePublic:
        """Create the workspace of an origin identity; an admin may name its `owner`."""
        body = WorkspaceCreate(identity=identity, owner=owner)
        return self._call("POST", "/api/workspaces", WorkspacePublic, body=body)

    def update_workspace(self, *, git: str, sandbox_network: str | None) -> WorkspacePublic:
        """Set the workspace's sandbox network (`bridge`, `full`, or None for the platform's
        default); admins only."""
        body = WorkspaceUpdate.model_validate({"sandbox_network": sandbox_network})
        return self._call("PATCH", "/api/workspace", WorkspacePublic, body=body, headers=_git(git))

    def list_workspaces(self) -> WorkspaceList:
        return self._call("GET", "/api/workspaces", WorkspaceList)

    def add_workspace_member(
        self,
        *,
        git: str,
        user_id: str | None = None,
        email: str | None = None,
        role: str = "member",
    ) -> WorkspacePublic:
        body = MemberAdd.model_validate({"user_id": user_id, "email": email, "role": role})
        return self._call(
            "POST", "/api/workspace/members", WorkspacePublic, body=body, headers=_git(git)
        )

    def set_workspace_member_role(self, *, git: str, member: str, role: str) -> WorkspacePublic:
        """Make a member (id, name or email) an owner or a member; owners only."""
        path = f"/api/workspace/members/{quote(member, safe='')}"
        body = MemberUpdate.model_validate({"role": role})
        return self._call("PATCH", path, WorkspacePublic, body=body, headers=_git(git))

    def remove_workspace_member(self, *, git: str, member: str) -> WorkspaceMemberPublic:
        """Remove a member (owners only), or leave when `member` is the caller."""
        path = f"/api/workspace/members/{quote(member, safe='')}"
        return self._call("DELETE", path, WorkspaceMemberPublic, headers=_git(git))

    def list_secrets(
        self, *, git: str, scope: str = "all", limit: int = 50, offset: int = 0
    ) -> SecretList:
        """A page of metadata of the secrets visible to the caller; `scope`: all, workspace,
        personal."""
        params = {"scope": scope, "limit": limit, "offset": offset}
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

    # -- datasets (`git`: the workspace identity; `name`: a dataset name, its file's stem) --
    def upload_dataset(
        self,
        *,
        git: str,
        path: Path,
        size: int,
        sha256: str,
        overwrite: bool = False,
        chunk_size: int = 1 << 20,
    ) -> DatasetPublic:
        """Stream the file at `path` as a new dataset (or, with `overwrite`, a new version).

        `size` and `sha256` are what was validated locally; the server refuses anything else,
        and exactly `size` bytes are sent, read from disk a chunk at a time.

            info = validate_dataset(path)
            client.upload_dataset(git="o/r", path=path, size=info.size, sha256=info.sha256)
        """
        params = {
            "file_name": path.name,
            "size": size,
            "sha256": sha256,
            "overwrite": "true" if overwrite else "false",
        }
        headers = {
            **_git(git),
            "Content-Type": "application/octet-stream",
            "Content-Length": str(size),  # a declared length, not chunked: the server checks it
        }
        # The server answers after validating the whole file, which can take minutes.
        timeout = httpx.Timeout(self._http.timeout.connect, read=3600.0)
        try:
            return self._call(
                "POST",
                "/api/datasets",
                DatasetPublic,
                params=params,
                headers=headers,
                content=_file_chunks(path, size, chunk_size),
                timeout=timeout,
            )
        except _FileChanged as error:
            raise PlatformAPIError(
                f"{path} changed while it was being uploaded: {error}",
                code="VALIDATION",
                details={"file": str(path)},
            ) from None

    def list_datasets(self, *, git: str, limit: int = 50, offset: int = 0) -> DatasetList:
        params = {"limit": limit, "offset": offset}
        return self._call("GET", "/api/datasets", DatasetList, params=params, headers=_git(git))

    def dataset_info(self, *, git: str, name: str, version: int | None = None) -> DatasetPublic:
        params = {"version": version} if version else None
        return self._call(
            "GET", _dataset_path(name), DatasetPublic, params=params, headers=_git(git)
        )

    def preview_dataset(
        self, *, git: str, name: str, rows: int = 5, version: int | None = None
    ) -> DatasetPreview:
        params: dict[str, Any] = {"rows": rows}
        if version:
            params["version"] = version
        path = _dataset_path(name, "preview")
        return self._call("GET", path, DatasetPreview, params=params, headers=_git(git))

    def dataset_logs(
        self, *, git: str, name: str, limit: int = 200, cursor: str | None = None
    ) -> DatasetLogList:
        """Processing logs, oldest first; pass `next_cursor` back to read on (None at the end)."""
        params: dict[str, Any] = {"limit": limit}
        if cursor:
            params["cursor"] = cursor
        path = _dataset_path(name, "logs")
        return self._call("GET", path, DatasetLogList, params=params, headers=_git(git))

    def download_dataset(
        self, *, git: str, name: str, dest: Path, version: int | None = None
    ) -> int:
        """Stream a dataset's file to `dest`; returns its size.

        The bytes go to `<dest>.partial`, are checked against the size and SHA-256 the server
        declares, and only then renamed to `dest`: `dest` is never left half-written.
        """
        url_path = _dataset_path(name, "download")
        partial = dest.with_name(dest.name + ".partial")
        digest = hashlib.sha256()
        written = 0
        try:
            with self._http.stream(
                "GET",
                url_path,
                params={"version": version} if version else None,
                headers=_git(git),
            ) as response:
                if response.is_error:
                    response.read()
                    raise _api_error(response)
                expected_sha = response.headers.get(SHA256_HEADER, "")
                expected_size = int(response.headers.get("content-length", "-1"))
                with partial.open("wb") as handle:
                    for chunk in response.iter_bytes():
                        handle.write(chunk)
                        digest.update(chunk)
                        written += len(chunk)
                    handle.flush()
                    os.fsync(handle.fileno())
            if written != expected_size or digest.hexdigest() != expected_sha:
                raise PlatformAPIError(
                    f"the download of dataset {name} is corrupt: got {written:,} bytes with "
                    f"sha256 {digest.hexdigest()}, expected {expected_size:,} bytes with "
                    f"sha256 {expected_sha or '(not sent)'}",
                    code="PLATFORM_ERROR",
                    details={"name": name},
                )
            os.replace(partial, dest)
        except httpx.HTTPError as error:
            raise PlatformAPIError(
                f"cannot reach the platform at {self.base_url}: {error or type(error).__name__}",
                code="NETWORK",
                details={"url": f"{self.base_url}{url_path}"},
            ) from None
        finally:
            partial.unlink(missing_ok=True)
        return written

    # -- eval runs (`run` is a run's name or id) ---------------------------------------------
    def submit_eval_run(self, *, git: str, body: EvalRunCreate) -> EvalRunCreated:
        """Submit an evaluation run of the workspace `git`; the server clones the commit.

        created = client.submit_eval_run(git="o/r", body=EvalRunCreate(...))
        """
        return self._call("POST", "/api/eval-runs", EvalRunCreated, body=body, headers=_git(git))

    def list_eval_runs(
        self,
        *,
        git: str | None = None,
        limit: int = 50,
        offset: int = 0,
        all_workspaces: bool = False,
    ) -> EvalRunList:
        """Runs of the workspace `git`, newest first; `all_workspaces`: every workspace of
        the caller (then `git` may be None)."""
        params: dict[str, Any] = {"limit": limit, "offset": offset}
        if all_workspaces:
            params["all"] = "true"
        headers = _git(git) if git else None
        return self._call("GET", "/api/eval-runs", EvalRunList, params=params, headers=headers)

    def get_eval_run(self, run: str) -> EvalRunDetail:
        return self._call("GET", _run_path(run), EvalRunDetail)

    def eval_run_logs(self, run: str, *, limit: int = 50, cursor: str | None = None) -> EvalRunLogs:
        """Log entries oldest first; pass `next_cursor` back to read on (None at the end)."""
        params: dict[str, Any] = {"limit": limit}
        if cursor:
            params["cursor"] = cursor
        return self._call("GET", _run_path(run, "logs"), EvalRunLogs, params=params)

    def stop_eval_run(self, run: str) -> EvalRunOperation:
        return self._call("POST", _run_path(run, "stop"), EvalRunOperation, body=EvalRunStop())

    def retry_eval_run(
        self, run: str, *, secrets: Mapping[str, str] | None = None
    ) -> EvalRunRetried:
        """Re-run the failed and skipped attempts of a finished, failed or stopped run."""
        body = EvalRunRetry(secrets=dict(secrets or {}))
        return self._call("POST", _run_path(run, "retry"), EvalRunRetried, body=body)

    def eval_run_files(
        self, run: str, *, types: Iterable[str] | None = None, rows: str | None = None
    ) -> FileManifest:
        """The downloadable files (path, size, sha256, type); `types` default to
        metrics and trajectories, `rows` ("3,7,10-20") filters trajectories and artifacts."""
        params: dict[str, Any] = {}
        if types is not None:
            params["types"] = ",".join(types)
        if rows:
            params["rows"] = rows
        return self._call("GET", _run_path(run, "files"), FileManifest, params=params)

    def download_eval_run_file(self, run: str, path: str, dest: Path) -> int:
        """Stream one file of the run to `dest` (parents created); returns the bytes written.

        No verification here: the caller compares size and sha256 with the manifest.
        """
        url_path = _run_path(run, "files") + "/" + quote(path, safe="/")
        written = 0
        try:
            with self._http.stream("GET", url_path) as response:
                if response.is_error:
                    response.read()
                    raise _api_error(response)
                dest.parent.mkdir(parents=True, exist_ok=True)
                with dest.open("wb") as handle:
                    for chunk in response.iter_bytes():
                        handle.write(chunk)
                        written += len(chunk)
        except httpx.HTTPError as error:
            raise PlatformAPIError(
                f"cannot reach the platform at {self.base_url}: {error or type(error).__name__}",
                code="NETWORK",
                details={"url": f"{self.base_url}{url_path}"},
            ) from None
        return written

    def eval_run_attempts(
        self,
        run: str,
        *,
        limit: int = 50,
        offset: int = 0,
        status: str | None = None,
        min_reward: float | None = None,
        max_reward: float | None = None,
        sort: str | None = None,
    ) -> AttemptList:
        """One page of the run's attempts (for the dashboard); `sort` e.g. "-reward"."""
        params: dict[str, Any] = {"limit": limit, "offset": offset}
        optional = {
            "status": status,
            "min_reward": min_reward,
            "max_reward": max_reward,
            "sort": sort,
        }
        params.update({key: value for key, value in optional.items() if value is not None})
        return self._call("GET", _run_path(run, "attempts"), AttemptList, params=params)

    # -- imports of local runs (`eval upload`; `git` is the workspace identity) ---------------
    def start_run_import(self, *, git: str, body: RunImportCreate) -> RunImportSession:
        """Start or resume the upload of a finished local run; send its `pending` files.

        session = client.start_run_import(git="o/r", body=RunImportCreate(...))
        """
        return self._call(
            "POST", "/api/eval-runs/imports", RunImportSession, body=body, headers=_git(git)
        )

    def upload_run_import_file(
        self, session_id: str, path: str, file: Path, *, size: int, chunk_size: int = 1 << 20
    ) -> ImportFileState:
        """Stream `file` as the declared `path` of the session (exactly `size` bytes)."""
        url_path = (
            f"/api/eval-runs/imports/{quote(session_id, safe='')}/files/{quote(path, safe='/')}"
        )
        headers = {"Content-Type": "application/octet-stream", "Content-Length": str(size)}
        timeout = httpx.Timeout(self._http.timeout.connect, read=3600.0)
        try:
            return self._call(
                "PUT",
                url_path,
                ImportFileState,
                headers=headers,
                content=_file_chunks(file, size, chunk_size),
                timeout=timeout,
            )
        except _FileChanged as error:
            raise PlatformAPIError(
                f"{file} changed while it was being uploaded: {error}",
                code="VALIDATION",
                details={"file": str(file)},
            ) from None

    def finalize_run_import(self, session_id: str) -> RunImportSession:
        """Check the uploaded run on the server and store it as a finished run."""
        path = f"/api/eval-runs/imports/{quote(session_id, safe='')}/finalize"
        timeout = httpx.Timeout(self._http.timeout.connect, read=300.0)
        return self._call("POST", path, RunImportSession, timeout=timeout)

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
        content: Iterator[bytes] | None = None,
        timeout: httpx.Timeout | None = None,
    ) -> _Model:
        url = f"{self.base_url}{path}"
        try:
            response = self._http.request(
                method,
                path,
                json=None if body is None else body.model_dump(mode="json", exclude_none=True),
                content=content,
                params=params,
                headers=headers,
                timeout=timeout or self._http.timeout,
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


def _dataset_path(name: str, *parts: str) -> str:
    # Checked here too: a name such as ".." would otherwise change which URL is requested.
    problem = name_problem(name)
    if problem is not None:
        raise PlatformAPIError(problem, code="VALIDATION", details={"name": name})
    return "/".join(["/api/datasets", quote(name, safe=""), *parts])


class _FileChanged(Exception):
    """The file being uploaded is shorter than when it was measured."""


def _file_chunks(path: Path, size: int, chunk_size: int) -> Iterator[bytes]:
    """Exactly `size` bytes of `path`, a chunk at a time (never the whole file in memory)."""
    remaining = size
    with path.open("rb") as handle:
        while remaining > 0:
            block = handle.read(min(chunk_size, remaining))
            if not block:
                raise _FileChanged(f"it ended after {size - remaining:,} of {size:,} bytes")
            remaining -= len(block)
            yield block


def _run_path(run: str, *parts: str) -> str:
    return "/".join(["/api/eval-runs", quote(run, safe=""), *parts])


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
