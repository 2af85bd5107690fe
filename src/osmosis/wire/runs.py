"""Wire models of the evaluation-run API (`/api/eval-runs`), shared by the server and the client.

    body = EvalRunCreate(experiment_config=..., config_path="configs/eval/x.toml",
                         config_toml=text, repository=RepositoryRef(origin_url=..., ...))
    created = client.runs.submit(git="owner/repo", body=body)  # EvalRunCreated

Pydantic only: importing this module pulls in no server code.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from osmosis.vocabulary import AttemptStatus, RunStatus

FileType = Literal["metrics", "trajectories", "artifacts", "logs"]
FILE_TYPES: tuple[FileType, ...] = ("metrics", "trajectories", "artifacts", "logs")
DEFAULT_FILE_TYPES: tuple[FileType, ...] = ("metrics", "trajectories")
SecretSource = Literal["user", "workspace", "run"]
CacheMode = Literal["off", "use", "replay"]
ATTEMPT_SORTS = (
    "row_index",
    "-row_index",
    "reward",
    "-reward",
    "duration_ms",
    "-duration_ms",
    "tokens",
    "-tokens",
)
"""`sort` values of the attempts list; a leading `-` sorts descending."""

CommitSha = Annotated[str, Field(pattern=r"^[0-9a-f]{40}$", description="A full commit id.")]


class _Model(BaseModel):
    model_config = ConfigDict(from_attributes=True, extra="ignore")


class _Strict(BaseModel):
    # Request bodies reject unknown fields: a typo should fail loudly, not be ignored.
    model_config = ConfigDict(extra="forbid")


# -- submit ---------------------------------------------------------------------------------
class ExperimentConfigIn(_Strict):
    """The `[experiment]` table as the reference payload sends it."""

    rollout: str = Field(min_length=1, max_length=255)
    entrypoint: str = Field(min_length=1, max_length=1024)
    model_path: str = Field(min_length=1, max_length=1024)
    dataset: str = Field(min_length=1, max_length=255)
    branch: str | None = Field(default=None, max_length=255)
    commit_sha: str | None = Field(default=None, max_length=40)


class RunSecrets(_Strict):
    """Names the config requires, and values given for this run only (never stored plain)."""

    required: list[str] = Field(default_factory=list)
    provided: dict[str, str] = Field(default_factory=dict)


class RepositoryRef(_Strict):
    """Where the server clones the code from: the commit resolved once, at submit."""

    origin_url: str = Field(min_length=1, max_length=4096)
    commit_sha: CommitSha
    branch: str | None = Field(default=None, max_length=255)


class EvalRunCreate(_Strict):
    """`POST /api/eval-runs`: the reference payload plus what a self-hosted server clones.

    Config values come from `config_toml` (the local file's text), code from `repository`.
    """

    experiment_config: ExperimentConfigIn
    evaluation_config: dict[str, Any] = Field(default_factory=dict)
    env_config: dict[str, str] = Field(default_factory=dict)
    advanced_config: dict[str, Any] = Field(default_factory=dict)
    secrets: RunSecrets = Field(default_factory=RunSecrets)
    config_path: str = Field(min_length=1, max_length=1024, examples=["configs/eval/smoke.toml"])
    config_toml: str = Field(min_length=1, max_length=1024 * 1024)
    repository: RepositoryRef
    # Ours, not the reference's (the official CLI sends neither): record and replay.
    cache: CacheMode | None = Field(
        default=None,
        description="Model calls answered from a record: off, use (the record, else the "
        "model) or replay (the record only; a miss fails the call with cache_miss). Null: "
        "the config's `cache`, or `replay` when `replay_from` is given and the config says "
        "off.",
    )
    replay_from: str | None = Field(
        default=None,
        min_length=1,
        max_length=255,
        description="A run of the same workspace (name or id) whose recorded model calls "
        "answer this run's.",
    )


class EvalRunCreated(_Model):
    id: str
    name: str
    status: RunStatus
    created_at: datetime


# -- list and detail ------------------------------------------------------------------------
class RunProgress(_Model):
    completed: int
    total: int
    unit: Literal["samples"] = "samples"


class RunSummary(_Model):
    """The results line of a run; over what finished so far (null rates before anything did)."""

    avg_reward: float | None = None
    pass_rate: float | None = None
    graded: int = 0
    passed: int = 0
    failed: int = 0
    skipped: int = 0
    progress: RunProgress


class EvalRunSummary(_Model):
    """One run as `eval list` shows it."""

    id: str
    name: str
    status: RunStatus
    workspace: str
    created_at: datetime
    started_at: datetime | None
    completed_at: datetime | None
    model: str
    dataset: str
    rollout: str
    creator_name: str | None
    creator_email: str | None
    summary: RunSummary


class EvalRunList(_Model):
    eval_runs: list[EvalRunSummary]
    total_count: int
    has_more: bool
    next_offset: int | None


class EvalRunInfo(EvalRunSummary):
    duration_ms: float | None = None
    error: str | None = None
    """Why the run failed (or was stopped), in one line; null otherwise."""
    waiting_reason: str | None = None
    """Why a pending run has not started yet, in one line ("2 of 2 run slots held by your
    other runs …"); null otherwise."""
    crash_resumes: int = 0
    """Times the run was resumed from its journal after its worker process was killed by a
    signal (SIGKILL, the OOM killer)."""


class RunDetailSummary(RunSummary):
    pass_threshold: float
    total_tokens: int = 0
    dataset_rows: int | None = None
    resumed_count: int = 0


class DatasetRef(_Model):
    name: str
    version: int
    sha256: str
    rows: int | None
    format: str


class RunLogEntry(_Model):
    timestamp: datetime | None
    level: str
    step: str
    message: str


class RunCache(_Model):
    """How a run's model calls were answered: from the provider (`off`), from a record when
    it holds the call (`use`), or from the record only (`replay`)."""

    mode: CacheMode = "off"
    replay_from: str | None = None
    """The run whose record answers this one's calls (its name; its id once it is gone)."""
    replay_from_id: str | None = None
    hits: int | None = None
    """Calls answered from the record; null until the worker has written the run's metrics."""
    misses: int | None = None
    """Calls the record could not answer (in replay mode, failed with `cache_miss`)."""


class EvalRunDetail(_Model):
    """`GET /api/eval-runs/{run}`: what `eval info` and the detail page show."""

    eval_run: EvalRunInfo
    summary: RunDetailSummary
    config: dict[str, Any]
    entrypoint: str
    branch: str | None
    commit_sha: str
    env_config: dict[str, str]
    resolved_secret_scopes: dict[str, SecretSource]
    dataset: DatasetRef
    metrics: dict[str, Any] | None
    metrics_available: bool
    errors_by_type: dict[str, int]
    cost_usd: float | None
    recent_logs: list[RunLogEntry]
    flaky_rows: list[int] = Field(default_factory=list)
    """Rows whose scored attempts disagree within the run (some passed, some not)."""
    cache: RunCache = Field(default_factory=RunCache)
    """Record and replay of the run's model calls (`eval submit --cache`, `--replay-from`)."""


class EvalRunLogs(_Model):
    logs: list[RunLogEntry]
    next_cursor: str | None
    end_cursor: str | None = None
    """Where to read on once more is written, also at the end (`eval logs --follow`)."""


# -- operations -----------------------------------------------------------------------------
class EvalRunStop(_Strict):
    """`POST /api/eval-runs/{run}/stop` takes an empty object."""


class EvalRunOperation(_Model):
    id: str
    name: str
    status: RunStatus
    message: str


class EvalRunRetry(_Strict):
    """Values for secrets the run was given at submit (they are wiped when a run ends), and
    budget limits that replace the config's from this retry on (a `halted` run's way on)."""

    secrets: dict[str, str] = Field(default_factory=dict)
    max_tokens_total: int | None = Field(default=None, ge=1)
    max_cost_usd: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    max_model_calls: int | None = Field(default=None, ge=1)


class EvalRunRetried(_Model):
    id: str
    name: str
    status: RunStatus
    retryable_samples: int
    budget_clamped: list[str] = Field(default_factory=list)
    """A budget limit the retry raised past a ceiling: the line saying what the run gets."""


# -- files and attempts ---------------------------------------------------------------------
class RunFile(_Model):
    path: str
    size: int
    sha256: str
    type: FileType


class TypeTotals(_Model):
    files: int
    bytes: int


class FileTotals(_Model):
    files: int
    bytes: int
    by_type: dict[str, TypeTotals]


class FileManifest(_Model):
    files: list[RunFile]
    totals: FileTotals


class AttemptPublic(_Model):
    row_index: int
    run_index: int
    source_row_index: int | None = Field(
        default=None,
        description="The row's position in the dataset file; null for attempts stored before "
        "the platform kept it.",
    )
    rollout_id: str
    status: AttemptStatus
    reward: float | None
    tokens: int | None
    duration_ms: float | None
    error_type: str | None


class AttemptList(_Model):
    attempts: list[AttemptPublic]
    total_count: int
    has_more: bool
    next_offset: int | None


# -- imports of local runs (`eval upload`) ----------------------------------------------------
Sha256 = Annotated[str, Field(pattern=r"^[0-9a-f]{64}$", description="SHA-256, lowercase hex.")]
ImportStatus = Literal["uploading", "finalized"]


class ImportFileIn(_Strict):
    """One file of a local run directory, as the upload declares it."""

    path: str = Field(min_length=1, max_length=1024, examples=["trajectories/row_0_run_0.json"])
    size: int = Field(ge=0)
    sha256: Sha256


class ImportRunIn(BaseModel):
    """The run as the reference's import names it; only `name` is read (the files decide the
    rest, and are checked), other reference keys are accepted and ignored."""

    model_config = ConfigDict(extra="allow")

    name: str = Field(min_length=1, max_length=255)


class RunImportCreate(_Strict):
    """`POST /api/eval-runs/imports`: start (or resume) the upload of a finished local run."""

    schema_version: Literal[1] = 1
    local_run_id: str = Field(pattern=r"^[0-9a-f]{32}$")
    manifest_digest: Sha256
    run: ImportRunIn
    files: list[ImportFileIn] = Field(min_length=1, max_length=200_000)
    reimport: bool = False
    """Replace the results of the run this local run was uploaded as (`--replace`)."""


class ImportFileState(_Model):
    path: str
    size: int
    sha256: str
    state: Literal["pending", "uploaded"]


class RunImportSession(_Model):
    """Where an upload stands: files still `pending` are the ones to send."""

    session_id: str
    status: ImportStatus
    expected_files: int
    uploaded_files: int
    files: list[ImportFileState]
    eval_run_id: str | None = None
    eval_run_name: str | None = None


__all__ = [
    "ATTEMPT_SORTS",
    "DEFAULT_FILE_TYPES",
    "FILE_TYPES",
    "AttemptList",
    "AttemptPublic",
    "AttemptStatus",
    "CacheMode",
    "DatasetRef",
    "EvalRunCreate",
    "EvalRunCreated",
    "EvalRunDetail",
    "EvalRunInfo",
    "EvalRunList",
    "EvalRunLogs",
    "EvalRunOperation",
    "EvalRunRetried",
    "EvalRunRetry",
    "EvalRunStop",
    "EvalRunSummary",
    "ExperimentConfigIn",
    "FileManifest",
    "FileTotals",
    "FileType",
    "ImportFileIn",
    "ImportFileState",
    "ImportRunIn",
    "ImportStatus",
    "RepositoryRef",
    "RunCache",
    "RunDetailSummary",
    "RunFile",
    "RunImportCreate",
    "RunImportSession",
    "RunLogEntry",
    "RunProgress",
    "RunSecrets",
    "RunStatus",
    "RunSummary",
    "SecretSource",
    "Sha256",
    "TypeTotals",
]
