"""The shapes the official `osmosis` CLI (osmosis-ai 0.3.x) exchanges under `/api/cli`.

Our own API speaks `osmosis.wire`; these are the reference client's names for the same data,
so the platform can serve that client unchanged. Errors here are flat:
`{"code": "NOT_FOUND", "message": "...", **details}`, as the reference client reads them.

    DatasetFilePublic(id="d1", file_name="qa", file_size=120, status="uploaded", ...)
    parse_cli_version("0.3.8")  # (0, 3, 8)

Pydantic only: importing this module pulls in no server code.
"""

from __future__ import annotations

import re
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field

from osmosis.wire.runs import ExperimentConfigIn, RunSecrets

# -- versions --------------------------------------------------------------------------------
CLI_VERSION_HEADER: Final = "X-Osmosis-CLI-Version"
"""Sent by the official CLI on every request: its package version."""
VERSION_STATUS_HEADER: Final = "X-Osmosis-Version-Status"
VERSION_MESSAGE_HEADER: Final = "X-Osmosis-Version-Message"
WORKSPACE_HEADER: Final = "X-Osmosis-Workspace"
"""The official CLI's root `--workspace NAME`; the alternative to `X-Osmosis-Git`."""

OLDEST_CLI: Final = (0, 3, 0)
"""Older official CLIs are answered 426 (upgrade required): they predate the routes served."""
REVIEWED_CLI_RANGE: Final = ((0, 3, 8), (0, 4, 0))
"""The official CLI versions this contract was checked against: from 0.3.8 up to, not
including, 0.4.0. A test fails when the interop environment holds another version."""

_VERSION = re.compile(r"^\s*v?(\d+)\.(\d+)(?:\.(\d+))?")


def parse_cli_version(text: str) -> tuple[int, int, int] | None:
    """`(major, minor, patch)` of a version string such as `0.3.8` or `0.3.8rc1`, else None."""
    match = _VERSION.match(text)
    if match is None:
        return None
    major, minor, patch = match.groups()
    return int(major), int(minor), int(patch or 0)


def in_reviewed_range(version: tuple[int, int, int]) -> bool:
    low, high = REVIEWED_CLI_RANGE
    return low <= version < high


# -- pages -----------------------------------------------------------------------------------
MAX_CLI_PAGE: Final = 50
"""The official client's page size for lists (`DEFAULT_PAGE_SIZE`)."""
MAX_CLI_LOG_PAGE: Final = 200


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore")


# -- account ---------------------------------------------------------------------------------
class CliUser(_Model):
    id: str
    email: str = Field(description="Never empty: the official CLI refuses a user without one.")
    name: str | None


class CliWorkspaceRef(_Model):
    id: str
    name: str = Field(description="Our workspace identity, e.g. `owner/repo`.")
    role: str | None


class CliVerify(_Model):
    """`GET /api/cli/verify`: whose token this is, until when, and the workspace it names."""

    user: CliUser
    token_id: str
    expires_at: str | None = Field(description="Timezone-aware ISO 8601; null: never.")
    workspace: CliWorkspaceRef | None


class ConnectedRepo(_Model):
    repo_full_name: str


class CliWorkspaceSummary(_Model):
    id: str
    name: str
    role: str
    connected_repo: ConnectedRepo | None


class CliWorkspaceList(_Model):
    workspaces: list[CliWorkspaceSummary]


class TokenRevoked(_Model):
    id: str
    revoked: bool


# -- device login (RFC 8628) -----------------------------------------------------------------
class DeviceAuthorizeIn(_Model):
    """`POST /api/cli/device/authorize`: the official CLI names its machine (its hostname)."""

    device_name: str = Field(default="", alias="deviceName", max_length=200)


class DeviceAuthorization(_Model):
    """A device code for the CLI to poll with, and the code a person approves in a browser."""

    device_code: str
    user_code: str = Field(description="Shown as `XXXX-XXXX`; dashes and case do not matter.")
    verification_uri: str
    verification_uri_complete: str
    expires_in: int = Field(description="Seconds both codes stay valid.")
    interval: int = Field(description="Seconds to wait between polls.")


class DeviceTokenIn(_Model):
    """`POST /api/cli/device/token`: one poll."""

    device_code: str = Field(min_length=1, max_length=200)


class DeviceToken(_Model):
    """The approved login: a new token of the user who approved it."""

    token: str
    token_id: str
    expires_at: str = Field(description="Timezone-aware ISO 8601, in the future.")
    user: CliUser


# -- environment secrets ---------------------------------------------------------------------
SecretScope = Literal["user", "workspace"]


class EnvironmentSecretSet(_Model):
    """`POST /api/cli/environment-secrets`: create or replace (upsert) one secret."""

    name: str = Field(min_length=1, max_length=255)
    value: str = Field(max_length=65_536)
    scope: SecretScope = "user"


class EnvironmentSecretDelete(_Model):
    """The JSON body of `DELETE /api/cli/environment-secrets`."""

    name: str = Field(min_length=1, max_length=255)
    scope: SecretScope = "user"


class EnvironmentSecretPublic(_Model):
    """A secret's metadata; values never leave the server."""

    id: str
    name: str
    scope: SecretScope
    created_at: str
    updated_at: str
    creator_name: str | None
    updater_name: str | None


class EnvironmentSecretList(_Model):
    environment_secrets: list[EnvironmentSecretPublic]
    total_count: int
    has_more: bool
    next_offset: int | None


# -- datasets --------------------------------------------------------------------------------
class DatasetCreate(_Model):
    """`POST /api/cli/datasets`: `file_name` is the dataset's name (the file's stem)."""

    file_name: str = Field(min_length=1, max_length=300)
    file_size: int = Field(ge=0)
    extension: str = Field(min_length=1, max_length=16)
    overwrite_dataset_id: str | None = Field(default=None, max_length=64)


class DatasetComplete(_Model):
    file_extension: str | None = None
    parts: list[dict[str, Any]] | None = None


class UploadInstructions(_Model):
    method: Literal["simple"] = "simple"
    presigned_url: str = Field(description="A capability URL: PUT the bytes, no token.")
    expires_in: int


class DatasetFilePublic(_Model):
    """A dataset as the official CLI's `DatasetFile` reads it."""

    id: str
    file_name: str = Field(description="The dataset's name: the uploaded file's stem.")
    file_size: int
    status: str
    data_preview: list[dict[str, Any]] | None
    file_format: str | None
    original_file_format: str | None
    row_count: int | None
    original_file_size: int | None
    creator_name: str | None
    created_at: str
    updated_at: str
    upload: UploadInstructions | None = None


class DatasetFileList(_Model):
    datasets: list[DatasetFilePublic]
    total_count: int
    has_more: bool
    next_offset: int | None


class DownloadInstructions(_Model):
    presigned_url: str = Field(description="A capability URL: GET the bytes, no token.")
    expires_in: int
    file_name: str


class LogEntry(_Model):
    timestamp: str
    level: str
    step: str
    message: str
    details: dict[str, Any] | None = None


class LogsPage(_Model):
    """One page of logs, oldest first within the page."""

    logs: list[LogEntry]
    next_cursor: str | None


# -- eval runs -------------------------------------------------------------------------------
class NameRef(_Model):
    """How the official CLI names a model, dataset or rollout: an object with a `name`."""

    name: str


class EvalRewardStats(_Model):
    mean: float | None = None
    median: float | None = None
    std: float | None = None
    min: float | None = None
    max: float | None = None
    pass_at_k: dict[str, float] = Field(
        default_factory=dict, description='pass@k by k as a string: {"1": 0.5, "2": 0.75}.'
    )


class EvalResults(_Model):
    """A run's results line: `score` is the mean reward, `total_runs` the attempts done."""

    score: float | None
    pass_rate: float | None
    graded: int
    passed: int
    failed: int
    skipped: int
    total_runs: int
    sampled_rows: int | None
    pass_threshold: float | None = None
    total_tokens: int | None = None
    total_dataset_rows: int | None = None
    resumed_count: int | None = None
    reward_stats: EvalRewardStats | None = None


class EvalRunRow(_Model):
    """One run as `osmosis eval list` reads it."""

    id: str
    name: str
    status: str
    created_at: str
    started_at: str | None
    completed_at: str | None
    model: NameRef
    dataset: NameRef
    rollout: NameRef
    creator_name: str | None
    creator_email: str | None
    results: EvalResults


class EvalRunRows(_Model):
    eval_runs: list[EvalRunRow]
    total_count: int
    has_more: bool
    next_offset: int | None


class EvalRunHeader(_Model):
    id: str
    name: str
    status: str
    created_at: str
    started_at: str | None
    completed_at: str | None
    creator_name: str | None
    creator_email: str | None


class EvalRunView(_Model):
    """`GET /api/cli/eval-runs/{run}`: what `osmosis eval info` reads."""

    eval_run: EvalRunHeader
    config: dict[str, Any]
    results: EvalResults
    dataset: NameRef
    rollout: NameRef
    entrypoint: str
    branch: str | None
    commit_sha: str | None
    env_config: dict[str, str]
    resolved_secret_scopes: dict[str, str]


class PassAtK(_Model):
    k: int
    value: float


class EvalMetricsOverview(_Model):
    duration_ms: int | None
    total_samples: int | None
    completed_samples: int | None
    graded: int | None
    passed: int | None
    failed: int | None
    skipped: int | None
    pass_rate: float | None
    pass_threshold: float | None
    tokens_used: int | None


class EvalRunMetricsView(_Model):
    """`GET /api/cli/eval-runs/{run}/metrics`."""

    status: str
    overview: EvalMetricsOverview
    reward_stats: EvalRewardStats | None
    pass_at_k: list[PassAtK]


class EvalRunSubmitIn(BaseModel):
    """`POST /eval-runs` as the official CLI sends it: the config's values only. The server
    finds the repository (the workspace's origin), the commit and the config text itself."""

    model_config = ConfigDict(extra="forbid")  # a key we do not read must not pass silently

    experiment_config: ExperimentConfigIn
    evaluation_config: dict[str, Any] = Field(default_factory=dict)
    advanced_config: dict[str, Any] = Field(default_factory=dict)
    env_config: dict[str, str] = Field(default_factory=dict)
    secrets: RunSecrets = Field(default_factory=RunSecrets)


class EvalRunRetryIn(_Model):
    secrets: dict[str, str] | None = None


class EvalRunRetriedView(_Model):
    id: str
    name: str
    status: str
    workflow_id: str = Field(description="Our runs have no workflow engine: the run's id.")
    retryable_samples: int


class DownloadItem(_Model):
    path: str = Field(min_length=1, max_length=1024)
    token: str | None = Field(default=None, max_length=256)


class DownloadUrlsIn(_Model):
    items: list[DownloadItem] = Field(min_length=1, max_length=500)


class DownloadUrl(_Model):
    path: str
    url: str
    token: str | None = None


class DownloadUrls(_Model):
    items: list[DownloadUrl]
    expires_in: int


# -- eval upload (run imports) ------------------------------------------------------------------
class RunImportStartIn(_Model):
    """`POST /api/cli/eval-runs/imports`: our `RunImportCreate` plus what the official client
    adds beside it (`schema_versions`, `provenance`), kept with the run."""

    schema_version: Literal[1] = 1
    local_run_id: str = Field(pattern=r"^[0-9a-f]{32}$")
    manifest_digest: str = Field(pattern=r"^[0-9a-f]{64}$")
    run: dict[str, Any]
    schema_versions: dict[str, Any] = Field(default_factory=dict)
    provenance: dict[str, Any] = Field(default_factory=dict)
    files: list[dict[str, Any]] = Field(min_length=1, max_length=200_000)
    reimport: bool = False


class RunImportUploadsIn(_Model):
    """`POST /api/cli/eval-runs/imports/{session}/uploads`: the files to get URLs for."""

    paths: list[str] = Field(min_length=1, max_length=100)


class RunImportUploadCompleteIn(_Model):
    """`POST .../uploads/complete`: a no-op for a simple upload (the PUT checked the bytes)."""

    path: str = Field(min_length=1, max_length=1024)
    parts: list[dict[str, Any]] | None = None


class RunImportUpload(_Model):
    path: str
    size: int
    sha256: str
    upload: UploadInstructions


class RunImportUploads(_Model):
    files: list[RunImportUpload]


class RunImportFile(_Model):
    path: str
    size: int
    sha256: str
    state: Literal["pending", "uploaded"]


class RunImportView(_Model):
    """An import session as the official client's `EvalRunImportResult` reads it."""

    session_id: str
    status: Literal["uploading", "finalized"]
    expected_files: int
    uploaded_files: int
    files: list[RunImportFile]
    expires_at: str | None = None
    eval_run_id: str | None = None
    eval_run_name: str | None = None
    platform_url: str | None = None


__all__ = [
    "CLI_VERSION_HEADER",
    "MAX_CLI_LOG_PAGE",
    "MAX_CLI_PAGE",
    "OLDEST_CLI",
    "REVIEWED_CLI_RANGE",
    "VERSION_MESSAGE_HEADER",
    "VERSION_STATUS_HEADER",
    "WORKSPACE_HEADER",
    "CliUser",
    "CliVerify",
    "CliWorkspaceList",
    "CliWorkspaceRef",
    "CliWorkspaceSummary",
    "ConnectedRepo",
    "DatasetComplete",
    "DatasetCreate",
    "DatasetFileList",
    "DatasetFilePublic",
    "DeviceAuthorization",
    "DeviceAuthorizeIn",
    "DeviceToken",
    "DeviceTokenIn",
    "DownloadInstructions",
    "DownloadItem",
    "DownloadUrl",
    "DownloadUrls",
    "DownloadUrlsIn",
    "EnvironmentSecretDelete",
    "EnvironmentSecretList",
    "EnvironmentSecretPublic",
    "EnvironmentSecretSet",
    "EvalMetricsOverview",
    "EvalResults",
    "EvalRewardStats",
    "EvalRunHeader",
    "EvalRunMetricsView",
    "EvalRunRetriedView",
    "EvalRunRetryIn",
    "EvalRunRow",
    "EvalRunRows",
    "EvalRunSubmitIn",
    "EvalRunView",
    "LogEntry",
    "LogsPage",
    "NameRef",
    "PassAtK",
    "RunImportFile",
    "RunImportStartIn",
    "RunImportUpload",
    "RunImportUploadCompleteIn",
    "RunImportUploads",
    "RunImportUploadsIn",
    "RunImportView",
    "SecretScope",
    "TokenRevoked",
    "UploadInstructions",
    "in_reviewed_range",
    "parse_cli_version",
]
