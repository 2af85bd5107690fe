"""Store functions for evaluation runs: submit (with every check), find, list, stop, retry.

    run = create_run(db, settings=settings, box=box, workspace=ws, user=ada, body=body)
    run = find_run(db, user=ada, ref="smoke-brave-otter-1a2b")   # name or id
    request_stop(db, run=run)

A run is executed by a worker process that the scheduler starts
(`osmosis.platform.worker.scheduler`); nothing here runs code. The run's files live in
`run_dir(settings, run.id)`. A stop is a flag
in the database: the worker process holding the run's lease reads it
(`osmosis.platform.worker.leases`).
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from osmosis.eval.inputs.config import ConfigError, EvalConfig, parse_eval_config
from osmosis.eval.inputs.config_checks import LineIndex
from osmosis.eval.inputs.dataset_select import select_rows
from osmosis.eval.model.bridge_record import RECORD_FILE
from osmosis.platform.core import notify
from osmosis.platform.core.crypto import SecretBox
from osmosis.platform.core.db.dataset_models import DatasetVersion
from osmosis.platform.core.db.models import Secret, User, Workspace, WorkspaceMember, new_id, utcnow
from osmosis.platform.core.db.run_models import EvalAttempt, EvalRun
from osmosis.platform.core.errors import Conflict, NotFound, PlatformError, ValidationFailed
from osmosis.platform.core.settings import Settings
from osmosis.platform.services import datasets
from osmosis.platform.services.secrets import USER, SecretsNotFound, check_name
from osmosis.vocabulary import MAX_PAGE, TERMINAL_RUN_STATUSES
from osmosis.wire.runs import EvalRunCreate
from osmosis.workspace import normalise_identity, redact_url

# Word lists read better as text than as a column of quoted words.
_ADJECTIVES = (  # noqa: SIM905
    "amber azure bold brave brisk calm clever cosmic crisp daring eager fair fancy gentle "
    "golden happy humble jolly keen kind lively lucky merry mighty nimble noble proud "
    "quick quiet rapid shiny silent snowy steady sunny swift tidy vivid witty"
).split()
_NOUNS = (  # noqa: SIM905
    "badger beacon comet condor falcon fern finch fox glacier harbor heron ibis lark lynx "
    "maple meadow otter owl panda pebble pine puffin quartz raven river robin sparrow "
    "spruce summit tiger tulip walrus willow wren yak zebra"
).split()
_UNSAFE = re.compile(r"[^a-z0-9]+")


def runs_root(settings: Settings) -> Path:
    """Where run directories live: in the blob store (`osmosis.platform.core.blobs`)."""
    return settings.runs_dir


def run_dir(settings: Settings, run_id: str) -> Path:
    """`<runs>/<id>/`: an ordinary local run directory (see `osmosis.eval.host.run_dir`), in the
    blob store every API and worker process of the platform reads and writes."""
    if settings.blob_url is not None and settings.role != "worker":
        # An object store: the store's copy of the run is brought here for this process's
        # readers (a worker's engine writes its own copy, and publishes it).
        from osmosis.platform.core.blobs import open_object_store

        store = open_object_store(settings.blob_url, settings.blob_dir, runs_root=settings.runs_dir)
        store.refresh_run(run_id, replace=settings.role == "api")
    return runs_root(settings) / run_id


# -- submit ---------------------------------------------------------------------------------
def secrets_context(run_id: str) -> str:
    """The context the run's provided secrets are sealed with (see `SecretBox`)."""
    return f"eval_run/{run_id}/secrets"


def create_run(
    db: Session,
    *,
    settings: Settings,
    box: SecretBox,
    workspace: Workspace,
    user: User,
    body: EvalRunCreate,
    clone_url: str | None = None,
) -> EvalRun:
    """Check everything a run needs, then store it `pending`; every problem found is reported
    in one error (its code is the first problem's: 422 config, 404/409 dataset, 404 secrets,
    404/400/422 `replay_from` and `cache`, see `_check_replay`).
    `clone_url`: where the worker fetches the code when not the origin itself (an operator's
    mirror, `OSMOSIS_GIT_URL_REWRITE`), stored with the run from the start."""
    problems: list[PlatformError] = []
    config = _check_config(body, problems, settings=settings)
    _check_origin(body.repository.origin_url, workspace, problems)
    dataset_name = config.experiment.dataset if config else body.experiment_config.dataset
    version: DatasetVersion | None = None
    try:
        version = datasets.find_ready_version(db, workspace=workspace, name=dataset_name)
    except PlatformError as error:
        problems.append(error)
    provided = _check_provided(body.secrets.provided, problems)
    required = set(body.secrets.required) | set(provided)
    if config is not None:
        required |= set(config.secrets.required)
    scopes = _secret_scopes(db, workspace=workspace, user=user, names=required - set(provided))
    missing = sorted(required - set(provided) - set(scopes))
    if missing:
        problems.append(
            SecretsNotFound(
                f"Secret(s) not found: {', '.join(missing)}",
                details={
                    "missing": missing,
                    "hint": "osmosis secret set NAME, or provide the value at submit",
                },
            )
        )
    replay = _check_replay(
        db, settings=settings, workspace=workspace, user=user, body=body, config=config
    )
    if isinstance(replay, PlatformError):
        problems.append(replay)
    if problems:
        raise _combined(problems)
    assert config is not None and version is not None
    assert not isinstance(replay, PlatformError)
    scopes.update({name: "run" for name in provided})
    run_id = new_id()
    payload = _payload_without_values(body)
    # The worker reads them here: the source by id (a name may be taken again later).
    payload.update(cache=replay.mode, replay_from=replay.source_id)
    run = EvalRun(
        id=run_id,
        workspace_id=workspace.id,
        created_by=user.id,
        status="pending",
        created_at=utcnow(),
        payload=json.dumps(payload),
        config=json.dumps(
            {
                "evaluation": config.evaluation.model_dump(),
                "advanced": config.advanced,
                "env": config.env,
            }
        ),
        config_toml=body.config_toml,
        config_path=body.config_path,
        rollout=config.experiment.rollout,
        entrypoint=config.experiment.entrypoint,
        model_path=config.experiment.model_path,
        dataset_name=dataset_name,
        origin_url=clone_url or body.repository.origin_url,
        commit_sha=body.repository.commit_sha,
        branch=body.repository.branch or config.experiment.branch,
        dataset_version_id=version.id,
        secrets_ciphertext=(
            box.encrypt(json.dumps(provided), context=secrets_context(run_id)) if provided else None
        ),
        secret_scopes=json.dumps(dict(sorted(scopes.items()))),
        total=_expected_total(config, version),
        dataset_rows=version.rows,
    )
    stem = PurePosixPath(body.config_path).stem
    for _ in range(8):  # a name clash is rare (65,536 suffixes per word pair): draw again
        run.name = _new_name(stem)
        db.add(run)
        try:
            db.flush()
            notify.announce(db, notify.SUBMIT, run.id)  # idle workers claim it at the commit
            db.commit()
        except IntegrityError:
            db.rollback()
            continue
        return run
    raise Conflict("could not find a free run name; submit again")


class ReplaySourceNotFound(NotFound):
    """`replay_from` names no run of the submitting workspace."""


class ReplaySourceUnrecorded(PlatformError):
    """`replay_from` names a run that recorded no model calls."""

    code = "NO_MODEL_CALLS"
    status_code = 400


@dataclass(frozen=True)
class Replay:
    """How a submitted run's model calls are answered: `mode` (off, use, replay) and the run
    whose record answers them (`source_id`, None: only the run's own record)."""

    mode: str
    source_id: str | None = None


def cache_mode(config_cache: str, *, cache: str | None, replay_from: str | None) -> str:
    """The run's cache mode as `eval run` decides it: the request's `cache` over the config's,
    and `replay` when a source run is named and the config says off."""
    if cache is not None:
        return cache
    if replay_from is not None and config_cache == "off":
        return "replay"
    return config_cache


def _check_replay(
    db: Session,
    *,
    settings: Settings,
    workspace: Workspace,
    user: User,
    body: EvalRunCreate,
    config: EvalConfig | None,
) -> Replay | PlatformError:
    """`cache` and `replay_from` of a submit: the source must be a run of this workspace that
    the user can read and that recorded model calls."""
    mode = cache_mode(
        config.evaluation.cache if config is not None else "off",
        cache=body.cache,
        replay_from=body.replay_from,
    )
    ref = body.replay_from
    if ref is None:
        if mode == "replay":
            # A new run's own record is empty: every call would miss.
            return ValidationFailed(
                "cache replay needs a recorded run to answer from: name one with replay_from "
                "(osmosis eval submit --replay-from RUN)",
                details={"cache": mode, "replay_from": None},
            )
        return Replay(mode)
    if mode == "off":
        return ValidationFailed(
            f"replay_from {ref!r} reads another run's model calls: it needs cache use or "
            "replay, not off",
            details={"cache": mode, "replay_from": ref},
        )
    source = db.scalar(
        select(EvalRun)
        .join(WorkspaceMember, WorkspaceMember.workspace_id == EvalRun.workspace_id)
        .where(
            WorkspaceMember.user_id == user.id,
            EvalRun.workspace_id == workspace.id,
            (EvalRun.id == ref) | (EvalRun.name == ref),
        )
    )
    if source is None:
        # The same answer whether it is elsewhere or nowhere: no workspace's runs leak.
        return ReplaySourceNotFound(
            f"replay_from: eval run {ref!r} not found in workspace {workspace.identity} (a "
            "replay reads a run of the same workspace)",
            details={"replay_from": ref, "workspace": workspace.identity},
        )
    record = run_dir(settings, source.id) / RECORD_FILE
    try:
        recorded = record.stat().st_size > 0
    except OSError:
        recorded = False
    if not recorded:
        return ReplaySourceUnrecorded(
            f"replay_from: eval run {source.name!r} recorded no model calls ({RECORD_FILE}): "
            "there is nothing to replay (a run records its calls once it starts making them)",
            details={"replay_from": ref, "eval_run": source.name, "status": source.status},
        )
    return Replay(mode, source.id)


def _check_config(
    body: EvalRunCreate, problems: list[PlatformError], *, settings: Settings
) -> EvalConfig | None:
    issues: list[dict[str, Any]] = []
    path = PurePosixPath(body.config_path)
    if (
        path.is_absolute()
        or ".." in path.parts
        or path.parts[:2] != ("configs", "eval")
        or path.suffix != ".toml"
        or "\\" in body.config_path
    ):
        issues.append(
            {
                "line": None,
                "key": "config_path",
                "message": "must be a .toml path under configs/eval/, relative to the "
                f"repository root; got {body.config_path!r}",
            }
        )
    config: EvalConfig | None = None
    try:
        config = parse_eval_config(body.config_toml, path=body.config_path)
    except ConfigError as error:
        issues += error.details()["issues"]
    if config is not None:
        sent = body.experiment_config
        for key in ("rollout", "entrypoint", "model_path", "dataset"):
            if getattr(sent, key) != getattr(config.experiment, key):
                issues.append(
                    {
                        "line": None,
                        "key": f"experiment_config.{key}",
                        "message": f"{getattr(sent, key)!r} differs from the config file's "
                        f"experiment.{key} = {getattr(config.experiment, key)!r}",
                    }
                )
        issues += _over_caps(config, body.config_toml, settings)
    if issues:
        lines = [
            f"{body.config_path}:{i['line']}: {i['key']}: {i['message']}"
            if i.get("line")
            else f"{i['key'] or body.config_path}: {i['message']}"
            for i in issues
        ]
        problems.append(
            ValidationFailed(
                "Invalid eval config " + body.config_path + ":\n  " + "\n  ".join(lines),
                details={
                    "error": "Invalid eval config",
                    "file": body.config_path,
                    "issues": issues,
                },
            )
        )
        return None
    return config


def _over_caps(config: EvalConfig, text: str, settings: Settings) -> list[dict[str, Any]]:
    """The config's timeouts above the platform's caps: a hung rollout holds a run slot for
    as long as its timeout allows (issue 25.7)."""
    caps = (
        ("agent_workflow_timeout_s", settings.max_agent_workflow_timeout_s, "AGENT_WORKFLOW"),
        ("grader_timeout_s", settings.max_grader_timeout_s, "GRADER"),
    )
    lines = LineIndex(text)
    issues: list[dict[str, Any]] = []
    for key, cap, env in caps:
        value = float(getattr(config.evaluation, key))
        if value > cap:
            issues.append(
                {
                    "line": lines.line_of("evaluation", key),
                    "key": f"evaluation.{key}",
                    "message": f"{value:g} s is above this platform's cap of {cap:g} s "
                    f"(OSMOSIS_MAX_{env}_TIMEOUT_S); set it to {cap:g} or less",
                }
            )
    return issues


def _check_origin(origin_url: str, workspace: Workspace, problems: list[PlatformError]) -> None:
    """The code must come from the workspace's own repository: the server clones whatever
    URL it is given, so a run may not name another one."""
    try:
        identity = normalise_identity(origin_url)
    except ValueError as error:
        identity = f"<{error}>"
    if identity != workspace.identity:
        problems.append(
            ValidationFailed(
                f"repository.origin_url {redact_url(origin_url)!r} is not the origin of this "
                f"workspace ({workspace.identity})",
                details={"origin_identity": identity, "workspace": workspace.identity},
            )
        )


def _check_provided(provided: Mapping[str, str], problems: list[PlatformError]) -> dict[str, str]:
    good: dict[str, str] = {}
    bad: list[str] = []
    for name, value in provided.items():
        try:
            check_name(name)
        except ValidationFailed:
            bad.append(name[:64])
            continue
        if value:
            good[name] = value
        else:
            bad.append(name)
    if bad:
        problems.append(
            ValidationFailed(
                f"provided secret(s) {', '.join(bad)}: names are A-Z, 0-9 and _ starting with a "
                "letter, and values are not empty",
                details={"invalid_secrets": bad},
            )
        )
    return good


def _secret_scopes(
    db: Session, *, workspace: Workspace, user: User, names: set[str]
) -> dict[str, str]:
    """Where each stored name resolves for `user`: "user" (personal) over "workspace"."""
    if not names:
        return {}
    rows = db.execute(
        select(Secret.name, Secret.scope).where(
            Secret.workspace_id == workspace.id,
            Secret.name.in_(sorted(names)),
            (Secret.scope == "workspace") | (Secret.owner_id == user.id),
        )
    )
    scopes: dict[str, str] = {}
    for name, scope in rows:
        if name not in scopes or scope == USER:
            scopes[name] = scope
    return scopes


def _combined(problems: Sequence[PlatformError]) -> PlatformError:
    if len(problems) == 1:
        return problems[0]
    first = problems[0]
    details: dict[str, Any] = {}
    for problem in reversed(problems):
        details.update(problem.details)
    details["problems"] = [{"code": p.code, "message": p.message} for p in problems]
    combined = PlatformError("; ".join(p.message for p in problems), details=details)
    combined.code, combined.status_code = first.code, first.status_code  # the first one's
    return combined


def _payload_without_values(body: EvalRunCreate) -> dict[str, Any]:
    payload = body.model_dump(mode="json", exclude={"config_toml"})
    payload["secrets"]["provided"] = sorted(body.secrets.provided)  # names only
    return payload


def _expected_total(config: EvalConfig, version: DatasetVersion) -> int:
    if version.rows is None:
        return 0
    selected = select_rows(version.rows, limit=config.evaluation.limit, seed=0)
    return len(selected) * config.evaluation.n


def _new_name(stem: str) -> str:
    words = f"{secrets.choice(_ADJECTIVES)}-{secrets.choice(_NOUNS)}-{secrets.token_hex(2)}"
    clean = _UNSAFE.sub("-", stem.lower()).strip("-")[:200] or "eval"
    return f"{clean}-{words}"


# -- find and list --------------------------------------------------------------------------
def find_run(db: Session, *, user: User, ref: str) -> EvalRun:
    """The run named or numbered `ref` in one of `user`'s workspaces; else `NotFound` (the
    same answer whether it exists elsewhere or not at all)."""
    query = (
        select(EvalRun)
        .join(WorkspaceMember, WorkspaceMember.workspace_id == EvalRun.workspace_id)
        .where(WorkspaceMember.user_id == user.id, (EvalRun.id == ref) | (EvalRun.name == ref))
    )
    run = db.scalar(query)
    if run is None:
        raise NotFound(
            f"eval run {ref!r} not found among your workspaces", details={"eval_run": ref}
        )
    return run


@dataclass(frozen=True)
class RunPage:
    runs: list[EvalRun]
    total_count: int
    has_more: bool
    next_offset: int | None


def list_runs(
    db: Session, *, user: User, workspace: Workspace | None, limit: int, offset: int
) -> RunPage:
    """Runs newest first: of `workspace`, or (None) of every workspace `user` belongs to."""
    if not 1 <= limit <= MAX_PAGE or offset < 0:
        raise ValidationFailed(f"limit must be 1-{MAX_PAGE} and offset at least 0")
    where = (
        [EvalRun.workspace_id == workspace.id]
        if workspace is not None
        else [
            EvalRun.workspace_id.in_(
                select(WorkspaceMember.workspace_id).where(WorkspaceMember.user_id == user.id)
            )
        ]
    )
    total = db.scalar(select(func.count()).select_from(EvalRun).where(*where)) or 0
    runs = list(
        db.scalars(
            select(EvalRun)
            .where(*where)
            .order_by(EvalRun.created_at.desc(), EvalRun.id)
            .limit(limit)
            .offset(offset)
        )
    )
    more = offset + len(runs) < total
    return RunPage(runs, total, more, offset + len(runs) if more else None)


# -- stop and retry -------------------------------------------------------------------------
def request_stop(db: Session, *, run: EvalRun) -> bool:
    """Stop `run`: a pending one at once (True), a running one by flagging it for the worker
    holding it, whichever process that is (False; the worker ends it `stopped`). A finished,
    failed or stopped run is a Conflict."""
    db.refresh(run)
    if run.status in TERMINAL_RUN_STATUSES:
        raise Conflict(
            f'eval run "{run.name}" is already {run.status}',
            details={"eval_run": run.name, "status": run.status},
        )
    run.stop_requested = True
    stopped_now = run.status == "pending"
    if stopped_now:
        run.status = "stopped"
        run.completed_at = utcnow()
        run.error = "stopped before it started"
        run.secrets_ciphertext = None
    else:
        notify.announce(db, notify.STOP, run.id)  # its holder stops it at the commit
    db.commit()
    return stopped_now


def retryable_samples(db: Session, *, run: EvalRun) -> int:
    """What a retry runs: the failed and skipped attempts, and those a stop or a failure left
    unrun (a stopped run resumes; it does not start over)."""
    query = select(func.count()).where(
        EvalAttempt.run_id == run.id, EvalAttempt.status.in_(("failed", "skipped"))
    )
    recorded = db.scalar(select(func.count()).where(EvalAttempt.run_id == run.id)) or 0
    return (db.scalar(query) or 0) + max(0, run.total - recorded)


BUDGET_KEYS = ("max_tokens_total", "max_cost_usd", "max_model_calls")
"""The `[evaluation]` budget limits a retry may replace."""


def request_retry(
    db: Session,
    *,
    box: SecretBox,
    run: EvalRun,
    secrets: Mapping[str, str],
    budget: Mapping[str, float] | None = None,
) -> int:
    """Queue a finished, failed, stopped or halted run again, re-running its failed and
    skipped attempts with fresh rollout ids (and whatever never ran); returns how many are
    retried. `budget` (`BUDGET_KEYS`) replaces the config's limits from now on: a halted run's
    way to finish; the platform's ceilings still bound them.

    Values given for this run only were wiped when it ended: they must come again in
    `secrets`, else a 422 whose `details.run_secret_names` lists them.
    """
    db.refresh(run)
    if run.status not in TERMINAL_RUN_STATUSES:
        raise Conflict(
            f'eval run "{run.name}" is {run.status}: only a finished, failed, stopped or halted '
            "run can be retried",
            details={"eval_run": run.name, "status": run.status},
        )
    if "import" in json.loads(run.payload or "{}"):
        # Uploaded from a local run: no commit or config to run here (services.run_upload).
        raise Conflict(
            f'eval run "{run.name}" was uploaded from a local run: retry it where it ran '
            "(eval run --name NAME --retry-failed), then eval upload --replace",
            details={"eval_run": run.name, "imported": True},
        )
    retryable = retryable_samples(db, run=run)
    if run.status == "finished" and retryable == 0:
        raise Conflict(
            f'eval run "{run.name}" has no failed or skipped samples to retry',
            details={"eval_run": run.name, "retryable_samples": 0},
        )
    problems: list[PlatformError] = []
    provided = _check_provided(secrets, problems)
    if problems:
        raise problems[0]
    scopes: dict[str, str] = json.loads(run.secret_scopes)
    needed = sorted(name for name, scope in scopes.items() if scope == "run")
    missing = [name for name in needed if name not in provided]
    if missing:
        raise ValidationFailed(
            f"this run was given secret(s) {', '.join(missing)} for itself only; they are not "
            "kept after a run ends: provide them again to retry",
            details={"run_secret_names": missing, "missing": missing},
        )
    scopes.update({name: "run" for name in provided})
    run.secret_scopes = json.dumps(dict(sorted(scopes.items())))
    run.secrets_ciphertext = (
        box.encrypt(json.dumps(provided), context=secrets_context(run.id)) if provided else None
    )
    if budget:
        config = json.loads(run.config)
        config["evaluation"].update({key: budget[key] for key in BUDGET_KEYS if key in budget})
        run.config = json.dumps(config)
    run.status = "pending"
    run.retry_failed = True
    run.crash_resumes = 0  # a retry gets the platform's resumes after a crash again
    run.stop_requested = False
    run.error = None
    # `started_at` stays the first start and `duration_ms` the active time so far: the worker
    # adds each session's share (issue 17.6).
    run.completed_at = None
    run.claimed_by = run.heartbeat_at = run.lease_expires_at = None
    notify.announce(db, notify.SUBMIT, run.id)
    db.commit()
    return retryable
