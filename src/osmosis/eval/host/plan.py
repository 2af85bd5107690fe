"""Planning a local `osmosis eval run`: every check that can fail, before anything is written.

    plan = plan_run(Path("configs/eval/multiply.toml"), RunOptions())

A bad config, dataset, row spec or secrets file raises `PlanError` naming every problem, and
no run directory exists afterwards. The plan carries the resolved inputs that lock a resume.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from osmosis._version import __version__
from osmosis.eval.host.run_name import default_run_name
from osmosis.eval.inputs.config import (
    ConfigError,
    EvalConfig,
    check_config_location,
    load_eval_config,
)
from osmosis.eval.inputs.dataset import (
    DatasetError,
    DatasetInfo,
    RowSpecError,
    Selection,
    select_rows,
    validate_dataset,
)
from osmosis.eval.inputs.dataset_formats import DATASET_SUFFIXES
from osmosis.eval.inputs.secrets import ResolvedSecrets, SecretsError, read_dotenv, resolve_secrets
from osmosis.eval.inputs.sources import source_digest
from osmosis.eval.model.bridge_budget import Budget
from osmosis.eval.model.bridge_record import CACHE_MODES, RECORD_FILE, CacheMode
from osmosis.eval.results.trial_outputs import ArtifactLimits
from osmosis.rollout.types import PROTOCOL_VERSION


class PlanError(Exception):
    """The run cannot start. The message names every problem; `details` is for JSON output."""

    def __init__(self, message: str, *, details: Mapping[str, Any] | None = None, hint: str = ""):
        super().__init__(message)
        self.details = dict(details or {})
        self.hint = hint


class EntrypointMissing(PlanError):
    """The config's entrypoint is not in the checkout. Locally: create it or fix the config;
    on the platform the likely cause is a commit that was never pushed (the worker says so)."""


class DatasetNotFound(PlanError):
    """No `--dataset-file` and no `data/<dataset>.*`: the CLI may fetch the platform's."""


@dataclass(frozen=True)
class RunOptions:
    """The `eval run` flags that shape a run."""

    name: str | None = None
    output: Path | None = None
    dataset_file: Path | None = None
    secrets_file: Path | None = None
    rows: str | None = None
    fresh: bool = False
    retry_failed: bool = False
    max_in_flight: int | None = None
    environ: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    env_cache: Path | None = None
    """Where rollout venvs are cached; default `<workspace>/.osmosis/envs`. The platform
    points every run's checkout at one shared cache."""
    env_scope: str | None = None
    """Whose venvs a run may reuse: a venv built for one scope never serves another. None: the
    workspace's directory; the platform passes the workspace's id."""
    replicas: int | None = 1
    """Rollout servers started for the run (recorded in the manifest's provenance; a resume
    may use another number). None, with the Ray executor: one per alive node."""
    bridge_host: str = "127.0.0.1"
    """Where the model bridge listens (loopback unless rollouts run elsewhere)."""
    bridge_url: str | None = None
    """The bridge's root URL as rollouts reach it, when not the address it binds."""
    outage_wait_s: float | None = None
    """How long a provider outage may last before the run halts; None: the engine's default."""
    stall_after_s: float | None = None
    """Seconds of provider silence (calls waiting) before the bridge suspects an outage;
    None: the bridge's default."""
    bridge_max_tokens: int | None = None
    """The most tokens one model call may ask for (above it: refused, the cap named); None:
    the bridge's default (`DEFAULT_MAX_TOKENS`)."""
    bridge_max_request_bytes: int | None = None
    """The largest model call request body; None: the bridge's default."""
    artifact_limits: ArtifactLimits | None = None
    """What of each attempt's artifacts is copied; None: `DEFAULT_ARTIFACT_LIMITS`."""
    executor: str = "local"
    """Where the rollout servers run: `local` (this machine) or `ray` (a Ray cluster)."""
    ray_address: str | None = None
    """The Ray cluster to use (`host:port`); None: `RAY_ADDRESS`, else the one running here."""
    max_replicas: int | None = None
    """With Ray, at most this many rollout servers (the platform's per-run fairness cap)."""
    sample_fraction: float | None = None
    """Rows run when neither `limit` nor `--rows` says: None, every row (the reference's local
    `eval run`); the platform worker passes `SAMPLE_FRACTION`, its random 10 % sample."""
    max_tokens_total: int | None = None
    """Budget override (`--max-tokens-total`); None: the config's `max_tokens_total`."""
    max_cost_usd: float | None = None
    """Budget override (`--max-cost-usd`); None: the config's `max_cost_usd`."""
    max_model_calls: int | None = None
    """Budget override (`--max-model-calls`); None: the config's `max_model_calls`."""
    dataset_origin: str = "explicit"
    """How `dataset_file` was found, as the plan shows it: explicit (--dataset-file), cache or
    download (the platform dataset, fetched by the CLI)."""
    cache: str | None = None
    """`--cache off|use|replay`: model calls answered from the run's record; None: the config's
    `cache` (or `replay` when `replay_from` is given and the config says `off`)."""
    model: str | None = None
    """`--model`: the model this run evaluates, instead of the config's `model_path`."""
    n: int | None = None
    """`-n`: attempts per row, instead of the config's `n`."""
    limit: int | None = None
    """`--limit`: the first N rows, instead of the config's `limit`."""
    replay_from: str | None = None
    """`--replay-from`: another run (its directory, or its name under the output root) whose
    record of model calls answers this run's."""
    sample_seed: int | None = None
    """The random sample's seed when the run has none recorded yet: a platform replay takes
    the rows its source run took (the record is keyed by row)."""
    official_trials: bool = True
    """Fill `rollout_trials/<rollout_id>/` with links to each attempt's trajectory and
    artifacts, as the official `eval upload` reads a run directory. The platform's run
    directories are never uploaded that way (`rollout_trials/` is their scratch): it passes
    False."""


@dataclass(frozen=True)
class RunPlan:
    """Everything a local run needs, validated."""

    config_path: Path
    workspace: Path
    config: EvalConfig
    dataset: DatasetInfo
    dataset_source: str
    selection: Selection
    secrets: ResolvedSecrets
    run_dir: Path
    rollout_dir: Path
    entrypoint: Path
    source_digest: str
    options: RunOptions
    replay_record: Path | None = None
    """The record of model calls `--replay-from` named (`model_calls.jsonl`); None: none."""

    @property
    def cache_mode(self) -> CacheMode:
        """`off`, `use` or `replay`: the flag over the config (see `RunOptions.cache`)."""
        mode = _cache_mode(self.config, self.options)
        assert mode in CACHE_MODES  # plan_run checked it
        return cast(CacheMode, mode)

    @property
    def record_sources(self) -> list[Path]:
        """The records this run's calls may be answered from: its own (a resume), then the
        one `--replay-from` named."""
        own = self.run_dir / RECORD_FILE
        return [own, *([self.replay_record] if self.replay_record is not None else [])]

    @property
    def name(self) -> str:
        return self.run_dir.name

    @property
    def n(self) -> int:
        return self.config.evaluation.n

    @property
    def total_work_items(self) -> int:
        return len(self.selection) * self.n

    @property
    def budget(self) -> Budget:
        """The run's limits: the `eval run` flags over the config's `[evaluation]`."""
        evaluation, options = self.config.evaluation, self.options
        return Budget(
            max_tokens_total=options.max_tokens_total or evaluation.max_tokens_total,
            max_cost_usd=options.max_cost_usd or evaluation.max_cost_usd,
            max_model_calls=options.max_model_calls or evaluation.max_model_calls,
        )

    def inputs(self) -> dict[str, Any]:
        """The resolved inputs: any change refuses a resume (§7 of the reference)."""
        evaluation = self.config.evaluation
        return {
            "model_path": self.config.experiment.model_path,
            "dataset": {
                "sha256": self.dataset.sha256,
                "selected_source_rows": _selection_digest(self.selection),
            },
            "n": evaluation.n,
            "pass_threshold": evaluation.pass_threshold,
            "rollout": {
                "name": self.config.experiment.rollout,
                "entrypoint": self.config.experiment.entrypoint,
                "source_digest": self.source_digest,
            },
            "env": dict(sorted(self.config.env.items())),
            "secrets": sorted(self.secrets.values),
            "timeouts": {
                "agent_workflow_timeout_s": evaluation.agent_workflow_timeout_s,
                "grader_timeout_s": evaluation.grader_timeout_s,
            },
            "versions": {
                "rollout_protocol": PROTOCOL_VERSION,
                "dataset_normalization": 1,
                "state_schema": 1,
            },
        }

    def provenance(self) -> dict[str, Any]:
        return {
            "sdk_version": __version__,
            "config_path": str(self.config_path),
            "dataset_path": str(self.dataset.path),
            "dataset_source": self.dataset_source,
            "selection": {
                "method": self.selection.method,
                "seed": self.selection.seed,
                "rows": self.options.rows,
                "limit": self.config.evaluation.limit,
                "count": len(self.selection),
                "total_rows": self.selection.total_rows,
            },
            "config_branch": self.config.experiment.branch,
            "config_commit_sha": self.config.experiment.commit_sha,
            "advanced": self.config.advanced,
            "replicas": self.options.replicas,
            "executor": self.options.executor,
        }


def plan_run(config_path: Path, options: RunOptions) -> RunPlan:
    """Validate everything; raise `PlanError` (with every problem) or return the plan."""
    config_path = config_path.resolve()
    try:
        workspace = check_config_location(config_path)
        config = load_eval_config(config_path, workspace_root=workspace)
    except ConfigError as error:  # also a config outside configs/eval/ or not .toml
        raise PlanError(str(error), details=error.details()) from None
    config = _overridden(config, options)

    rollout_dir = config.rollout_dir(workspace)
    entrypoint = config.entrypoint_path(workspace)
    if not entrypoint.is_file():
        raise EntrypointMissing(
            f"entrypoint {entrypoint.relative_to(workspace)} does not exist",
            details={"rollout": config.experiment.rollout, "entrypoint": str(entrypoint)},
            hint=f"create it, or fix experiment.entrypoint in {config_path.name}",
        )

    dataset_path, source = _find_dataset(config, workspace, options)
    try:
        dataset = validate_dataset(dataset_path)
    except DatasetError as error:
        raise PlanError(str(error), details={"dataset": str(dataset_path)}) from None

    output_root = options.output or workspace / ".osmosis" / "evals"
    name = options.name or default_run_name(config_path)
    if not name or "/" in name or name.startswith("."):
        raise PlanError(f"invalid run name {name!r}: use letters, digits, '-', '_' and '.'")
    run_dir = output_root / name
    replay_record = _replay_record(config, options, output_root, run_dir)

    try:
        selection = select_rows(
            dataset.rows,
            limit=config.evaluation.limit,
            rows=options.rows,
            seed=_seed(run_dir, options),
            fraction=options.sample_fraction,
        )
    except RowSpecError as error:
        raise PlanError(f"--rows: {error}", details={"rows": options.rows}) from None

    try:
        file_values = read_dotenv(options.secrets_file) if options.secrets_file else {}
        secrets = resolve_secrets(
            config.secrets.required, file_values=file_values, environ=options.environ
        )
    except SecretsError as error:
        raise PlanError(
            str(error), details={"missing": error.missing, "problems": error.problems}
        ) from None

    return RunPlan(
        config_path=config_path,
        workspace=workspace,
        config=config,
        dataset=dataset,
        dataset_source=source,
        selection=selection,
        secrets=secrets,
        run_dir=run_dir,
        rollout_dir=rollout_dir,
        entrypoint=entrypoint,
        source_digest=source_digest(rollout_dir),
        options=options,
        replay_record=replay_record,
    )


def _overridden(config: EvalConfig, options: RunOptions) -> EvalConfig:
    """The config with the command line's `--model`, `-n` and `--limit` in place of its own
    (checked by the command: a model path that is not empty, numbers at least 1)."""
    experiment, evaluation = config.experiment, config.evaluation
    if options.model is not None:
        experiment = experiment.model_copy(update={"model_path": options.model})
    changes: dict[str, int] = {}
    if options.n is not None:
        changes["n"] = options.n
    if options.limit is not None:
        changes["limit"] = options.limit
    if changes:
        evaluation = evaluation.model_copy(update=changes)
    return config.model_copy(update={"experiment": experiment, "evaluation": evaluation})


def _cache_mode(config: EvalConfig, options: RunOptions) -> str:
    if options.cache is not None:
        return options.cache
    if options.replay_from is not None and config.evaluation.cache == "off":
        return "replay"
    return config.evaluation.cache


def _replay_record(
    config: EvalConfig, options: RunOptions, output_root: Path, run_dir: Path
) -> Path | None:
    """The record `--replay-from` names; PlanError when the cache mode has nothing to read."""
    mode = _cache_mode(config, options)
    if mode not in CACHE_MODES:
        raise PlanError(f"--cache must be off, use or replay, got {mode!r}")
    own = run_dir / RECORD_FILE
    if options.replay_from is None:
        if mode == "replay" and (options.fresh or not own.is_file()):
            raise PlanError(
                f"cache replay: run {run_dir.name} has no record of model calls to replay",
                details={"record": str(own)},
                hint="name the recorded run with --replay-from RUN_DIR_OR_NAME",
            )
        return None
    if mode == "off":
        raise PlanError(
            "--replay-from reads another run's model calls: it needs --cache use or replay",
            details={"replay_from": options.replay_from},
        )
    given = Path(options.replay_from).expanduser()
    source = given if given.is_dir() else output_root / options.replay_from
    if given.is_file() and given.name == RECORD_FILE:
        source = given.parent
    record = source / RECORD_FILE
    if not record.is_file():
        raise PlanError(
            f"--replay-from {options.replay_from}: no record of model calls ({RECORD_FILE}) "
            f"in {source}",
            details={"replay_from": options.replay_from, "record": str(record)},
            hint="name a run directory, or a run name under the output root, that ran with "
            "this version of osmosis",
        )
    if options.fresh and source.resolve() == run_dir.resolve():
        raise PlanError(
            "--fresh archives this run's directory, record included: replay it into a new "
            "--name instead",
            details={"replay_from": options.replay_from},
        )
    return record.resolve()


def _find_dataset(config: EvalConfig, workspace: Path, options: RunOptions) -> tuple[Path, str]:
    dataset_file = options.dataset_file
    if dataset_file is not None:
        if not dataset_file.is_file():
            raise PlanError(f"--dataset-file {dataset_file} does not exist")
        return dataset_file.resolve(), options.dataset_origin
    name = config.experiment.dataset
    candidates = [workspace / "data" / f"{name}{suffix}" for suffix in DATASET_SUFFIXES]
    found = [path for path in candidates if path.is_file()]
    if len(found) == 1:
        return found[0], "workspace"
    if len(found) > 1:
        listed = ", ".join(str(p.relative_to(workspace)) for p in found)
        raise PlanError(
            f"dataset '{name}' is ambiguous: {listed}", hint="pass one with --dataset-file"
        )
    raise DatasetNotFound(
        f"dataset '{name}' not found: no data/{name}.jsonl, .csv or .parquet in the workspace",
        details={"dataset": name},
        hint="pass a local file with --dataset-file, or log in to a platform that holds "
        f"dataset {name} (eval run then downloads and caches it)",
    )


def _seed(run_dir: Path, options: RunOptions) -> int | None:
    recorded = recorded_seed(run_dir) if not options.fresh else None
    return recorded if recorded is not None else options.sample_seed


def recorded_seed(run_dir: Path) -> int | None:
    """A resumed run keeps the random sample it started with."""
    try:
        manifest = json.loads((run_dir / "manifest.json").read_text())
        seed = manifest["provenance"]["selection"]["seed"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return seed if isinstance(seed, int) else None


def _selection_digest(selection: Selection) -> str:
    digest = hashlib.sha256()
    for row in selection.rows:
        digest.update(row.to_bytes(8, "little"))
    return f"{len(selection)}:{digest.hexdigest()[:32]}"
