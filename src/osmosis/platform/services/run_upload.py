"""Importing a finished local run (`osmosis eval upload`) as a run of its workspace.

    session = start_import(db, settings=s, workspace=ws, user=ada, body=body)  # what to send
    await receive_file(db, settings=s, user=ada, session_id=..., path=p, chunks=stream)
    session = finalize_import(db, settings=s, user=ada, session_id=...)        # the run

- **Verified**: every file is checked against the size and SHA-256 it was declared with as
  it arrives; at finalize the assembled directory passes `osmosis.eval.results.run_export`'s checks
  (the ones `eval upload` ran locally), metrics included, before any run exists.
- **Resumable**: a session is keyed by (workspace, `local_run_id`): starting again answers
  with the same session, and files already received (same path, size and hash) stay
  `uploaded`, so only the rest is sent.
- **Idempotent**: a run once imported is answered as `finalized` with its id when the same
  files are declared again; different files (a `--retry-failed` since) are a conflict
  unless `reimport` (`--replace`), which replaces that run's files, attempts and metrics
  under the same id and name.

- **Either layout**: ours (`manifest.json`, `events.jsonl`, `metrics.json`, ...) or the official
  osmosis-ai one (`index.jsonl`, `progress.json`, `logs.txt`, `rollout_trials/<id>/...`, no
  manifest or metrics), which finalize converts to ours with metrics computed here
  (`osmosis.eval.results.official_layout`).

Session state lives on disk under `<home>/imports/` (no table: nothing here needs a query
beyond "this session"), and the imported run is an ordinary run directory `runs/<id>/`.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import secrets
import shutil
from collections import Counter
from collections.abc import AsyncIterator, Iterator, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import delete, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from osmosis.eval.results import official_layout
from osmosis.eval.results.records import AttemptRecord
from osmosis.eval.results.run_export import REQUIRED, is_export_path, verify_run_dir
from osmosis.platform.core.db.dataset_models import Dataset, DatasetVersion
from osmosis.platform.core.db.models import User, Workspace, WorkspaceMember, new_id, utcnow
from osmosis.platform.core.db.run_models import EvalAttempt, EvalRun
from osmosis.platform.core.errors import Conflict, NotFound, ValidationFailed
from osmosis.platform.core.settings import Settings
from osmosis.platform.services.run_files import append_log
from osmosis.platform.services.runs import run_dir
from osmosis.platform.worker.run_sink import refresh_counters
from osmosis.private_file import make_private_dir
from osmosis.wire.runs import ImportFileState, RunImportCreate, RunImportSession

_SESSION = re.compile(r"^[0-9a-f]{32}$")
_STATE = "state.json"


def _root(settings: Settings) -> Path:
    return settings.home / "imports"


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """One writer per session (and one starter per workspace run) at a time."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _read_state(settings: Settings, session_id: str) -> dict[str, Any] | None:
    if not _SESSION.fullmatch(session_id):
        return None
    try:
        state: dict[str, Any] = json.loads(
            (_root(settings) / session_id / _STATE).read_text(encoding="utf-8")
        )
    except (OSError, ValueError):
        return None
    return state


def _write_state(settings: Settings, state: Mapping[str, Any]) -> None:
    folder = _root(settings) / state["session_id"]
    make_private_dir(folder)
    partial = folder / f".{_STATE}.partial"
    partial.write_text(json.dumps(state, indent=2), encoding="utf-8")
    os.replace(partial, folder / _STATE)


def _public(state: Mapping[str, Any]) -> RunImportSession:
    files = [
        ImportFileState(path=path, size=f["size"], sha256=f["sha256"], state=f["state"])
        for path, f in state["files"].items()
    ]
    return RunImportSession(
        session_id=state["session_id"],
        status=state["status"],
        expected_files=len(files),
        uploaded_files=sum(1 for f in files if f.state == "uploaded"),
        files=files,
        eval_run_id=state.get("eval_run_id"),
        eval_run_name=state.get("eval_run_name"),
    )


def _session(db: Session, settings: Settings, *, user: User, session_id: str) -> dict[str, Any]:
    """The session, if it belongs to one of `user`'s workspaces (else the same 404)."""
    state = _read_state(settings, session_id)
    member = (
        state is not None
        and db.scalar(
            select(WorkspaceMember.user_id).where(
                WorkspaceMember.workspace_id == state["workspace_id"],
                WorkspaceMember.user_id == user.id,
            )
        )
        is not None
    )
    if state is None or not member:
        raise NotFound(
            f"upload session {session_id!r} not found", details={"session_id": session_id}
        )
    return state


# -- start ----------------------------------------------------------------------------------
OFFICIAL = "osmosis-ai"
"""The `layout` of a session that sends the official local-run layout (no manifest.json)."""
_OFFICIAL_REQUIRED = ("index.jsonl", "progress.json")


def layout_of(paths: list[str]) -> str:
    """`ours` when the upload declares our manifest.json, else the official layout."""
    return "ours" if "manifest.json" in paths else OFFICIAL


def _check_declared(body: RunImportCreate, settings: Settings) -> None:
    problems = []
    paths = [f.path for f in body.files]
    official = layout_of(paths) == OFFICIAL
    bad = [p for p in paths if not (official_layout.is_official_path if official
                                    else is_export_path)(p)]  # fmt: skip
    if bad and official:
        problems.append(
            f"{len(bad)} path(s) outside the official run layout: {', '.join(bad[:5])} "
            "(allowed: index.jsonl, progress.json, logs.txt, "
            "rollout_trials/<rollout_id>/trajectory*.json, rollout_trials/<rollout_id>/"
            "artifacts/...; or our layout, with manifest.json)"
        )
    elif bad:
        problems.append(
            f"{len(bad)} path(s) outside the run layout: {', '.join(bad[:5])} (allowed: "
            "manifest.json, events.jsonl, index.jsonl, summary.jsonl, progress.json, "
            "metrics.json, logs.txt, trajectories/row_<r>_run_<k>.json, "
            "artifacts/row_<r>_run_<k>/...)"
        )
    counts = Counter(paths)
    duplicated = sorted(p for p, count in counts.items() if count > 1)
    if duplicated:
        problems.append(f"path(s) declared twice: {', '.join(duplicated[:5])}")
    if official:
        evaluation = body.run.model_dump().get("evaluation_config")
        threshold = evaluation.get("pass_threshold") if isinstance(evaluation, dict) else None
        if not isinstance(threshold, int | float) or isinstance(threshold, bool):
            problems.append(
                "run.evaluation_config.pass_threshold must be a number (the official layout "
                "carries no manifest.json to read it from)"
            )
    missing = [name for name in (_OFFICIAL_REQUIRED if official else REQUIRED)
               if name not in paths]  # fmt: skip
    if missing:
        problems.append(f"required file(s) not declared: {', '.join(missing)}")
    large = [f.path for f in body.files if f.size > settings.max_upload_bytes]
    if large:
        problems.append(
            f"file(s) larger than this platform accepts ({settings.max_upload_bytes:,} bytes): "
            f"{', '.join(large[:5])}"
        )
    if problems:
        raise ValidationFailed(
            "cannot import this run: " + "; ".join(problems), details={"problems": problems}
        )


def start_import(
    db: Session,
    *,
    settings: Settings,
    workspace: Workspace,
    user: User,
    body: RunImportCreate,
    provenance: Mapping[str, Any] | None = None,
    schema_versions: Mapping[str, Any] | None = None,
) -> RunImportSession:
    """Open the upload of a local run, or pick it up where it stopped (see the module doc).

    `provenance` and `schema_versions` are what the official client sends beside the run;
    an official-layout run keeps them in the manifest finalize writes for it."""
    _check_declared(body, settings)
    layout = layout_of([f.path for f in body.files])
    declared = {f.path: {"size": f.size, "sha256": f.sha256} for f in body.files}
    index = _root(settings) / "by-local-run" / workspace.id / body.local_run_id
    with _locked(index.with_suffix(".lock")):
        previous = None
        with contextlib.suppress(OSError):
            previous = _read_state(settings, index.read_text(encoding="utf-8").strip())
        imported = previous is not None and previous.get("eval_run_id") is not None
        if imported and previous is not None and db.get(EvalRun, previous["eval_run_id"]) is None:
            previous["eval_run_id"] = previous["eval_run_name"] = None  # deleted since
        if previous is None:
            state: dict[str, Any] = {
                "session_id": new_id(),
                "workspace_id": workspace.id,
                "local_run_id": body.local_run_id,
                "eval_run_id": None,
                "eval_run_name": None,
                "finalized_files": {},
            }
        else:
            state = previous
        finalized = state.get("finalized_files") or {}
        same_files = {p: (f["size"], f["sha256"]) for p, f in finalized.items()} == {
            p: (f["size"], f["sha256"]) for p, f in declared.items()
        }
        if state.get("eval_run_id") and state.get("status") == "finalized":
            if same_files and state.get("manifest_digest") == body.manifest_digest:
                return _public(state)  # uploaded before, unchanged: nothing to do
            if not body.reimport:
                raise Conflict(
                    f"local run {body.run.name} was uploaded before as run "
                    f"{state['eval_run_name']} with other results; replace them with "
                    "--replace (reimport)",
                    details={
                        "eval_run_id": state["eval_run_id"],
                        "eval_run_name": state["eval_run_name"],
                        "local_run_id": body.local_run_id,
                    },
                )
        staged = _root(settings) / state["session_id"] / "files"
        received = state.get("files") or {}
        files = {}
        for path, info in declared.items():
            before = received.get(path) or {}
            arrived = (
                before.get("state") == "uploaded"
                and (before.get("size"), before.get("sha256")) == (info["size"], info["sha256"])
                and (staged / path).is_file()
            )
            # A file the imported run already holds, unchanged, need not travel again (our
            # layout only: an official upload's files are converted, not kept as sent).
            kept = (
                layout == "ours"
                and finalized.get(path) == info
                and state.get("eval_run_id") is not None
            )
            files[path] = {**info, "state": "uploaded" if arrived or kept else "pending"}
        state.update(
            status="uploading",
            user_id=user.id,
            run_name=body.run.name,
            manifest_digest=body.manifest_digest,
            reimport=body.reimport,
            files=files,
            layout=layout,
            run=body.run.model_dump(mode="json"),
            provenance=dict(provenance or {}),
            schema_versions=dict(schema_versions or {}),
        )
        _write_state(settings, state)
        index.parent.mkdir(parents=True, exist_ok=True)
        index.write_text(state["session_id"], encoding="utf-8")
        return _public(state)


# -- files ----------------------------------------------------------------------------------
async def receive_file(
    db: Session,
    *,
    settings: Settings,
    user: User,
    session_id: str,
    path: str,
    chunks: AsyncIterator[bytes],
) -> ImportFileState:
    """Store one declared file from `chunks`, checking its size and SHA-256 as it arrives."""
    state = _session(db, settings, user=user, session_id=session_id)
    return await _receive(settings, state, session_id=session_id, path=path, chunks=chunks)


async def receive_signed_file(
    settings: Settings, *, session_id: str, path: str, chunks: AsyncIterator[bytes]
) -> ImportFileState:
    """`receive_file` for a capability URL: its signature, minted for a member of the
    session's workspace (`upload_instructions`), stands in for the user."""
    state = _read_state(settings, session_id)
    if state is None:
        raise NotFound(
            f"upload session {session_id!r} not found", details={"session_id": session_id}
        )
    return await _receive(settings, state, session_id=session_id, path=path, chunks=chunks)


def pending_files(
    db: Session, *, settings: Settings, user: User, session_id: str, paths: list[str]
) -> list[ImportFileState]:
    """The declared files among `paths` still to send; an undeclared path is a 422."""
    state = _session(db, settings, user=user, session_id=session_id)
    unknown = [p for p in paths if p not in state["files"]]
    if unknown:
        raise ValidationFailed(
            f"{len(unknown)} path(s) were not declared when the upload started: "
            f"{', '.join(unknown[:5])}",
            details={"paths": unknown[:50], "session_id": session_id},
        )
    return [
        ImportFileState(path=p, size=f["size"], sha256=f["sha256"], state=f["state"])
        for p in dict.fromkeys(paths)
        if (f := state["files"][p])["state"] != "uploaded"
    ]


def session_of(db: Session, *, settings: Settings, user: User, session_id: str) -> RunImportSession:
    """Where the session stands (404 unless it is of one of `user`'s workspaces)."""
    return _public(_session(db, settings, user=user, session_id=session_id))


async def _receive(
    settings: Settings,
    state: dict[str, Any],
    *,
    session_id: str,
    path: str,
    chunks: AsyncIterator[bytes],
) -> ImportFileState:
    info = state["files"].get(path)
    if state["status"] != "uploading":
        raise Conflict(
            f"upload session {session_id} is {state['status']}: start the upload again",
            details={"session_id": session_id, "status": state["status"]},
        )
    if info is None:
        raise ValidationFailed(
            f"{path!r} was not declared when the upload started",
            details={"path": path, "session_id": session_id},
        )
    target = _root(settings) / session_id / "files" / path
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{target.name}.{secrets.token_hex(4)}.partial")
    digest, size = hashlib.sha256(), 0
    try:
        with partial.open("wb") as handle:
            async for chunk in chunks:
                size += len(chunk)
                if size > info["size"]:
                    raise ValidationFailed(
                        f"{path}: more than the declared {info['size']:,} bytes",
                        details={"path": path, "declared_size": info["size"]},
                    )
                digest.update(chunk)
                handle.write(chunk)
        if size != info["size"] or digest.hexdigest() != info["sha256"]:
            raise ValidationFailed(
                f"{path}: received {size:,} bytes with sha256 {digest.hexdigest()}, declared "
                f"{info['size']:,} bytes with sha256 {info['sha256']}",
                details={"path": path, "size": size, "sha256": digest.hexdigest()},
            )
        os.replace(partial, target)
    finally:
        partial.unlink(missing_ok=True)
    with _locked(_root(settings) / session_id / ".lock"):
        state = _read_state(settings, session_id) or state
        if state["files"].get(path) == info:
            state["files"][path]["state"] = "uploaded"
            _write_state(settings, state)
    return ImportFileState(path=path, size=size, sha256=info["sha256"], state="uploaded")


# -- finalize -------------------------------------------------------------------------------
def finalize_import(
    db: Session, *, settings: Settings, user: User, session_id: str
) -> RunImportSession:
    """Check the complete run and store it as a finished run of the workspace."""
    # Looked up before the lock: the lock's path is built from the id, which must be valid.
    _session(db, settings, user=user, session_id=session_id)
    with _locked(_root(settings) / session_id / ".lock"):
        state = _session(db, settings, user=user, session_id=session_id)
        if state["status"] == "finalized":
            return _public(state)
        pending = [p for p, f in state["files"].items() if f["state"] != "uploaded"]
        if pending:
            raise Conflict(
                f"{len(pending)} declared file(s) not uploaded yet: {', '.join(pending[:5])}",
                details={"pending": pending, "session_id": session_id},
            )
        folder = _root(settings) / session_id
        candidate = folder / "run"
        shutil.rmtree(candidate, ignore_errors=True)
        existing = run_dir(settings, state["eval_run_id"]) if state.get("eval_run_id") else None
        official = state.get("layout") == OFFICIAL
        if official:
            sent = folder / "official"
            shutil.rmtree(sent, ignore_errors=True)
            _assemble(sent, folder / "files", None, state["files"])
            official_layout.convert(
                sent,
                candidate,
                run=state["run"],
                local_run_id=state["local_run_id"],
                provenance=state.get("provenance") or {},
                schema_versions=state.get("schema_versions") or {},
            )
            shutil.rmtree(sent, ignore_errors=True)
        else:
            _assemble(candidate, folder / "files", existing, state["files"])
        problems = verify_run_dir(
            candidate,
            expected_name=state["run_name"],
            # The official client's digest is of a manifest it does not send.
            manifest_digest=None if official else state["manifest_digest"],
        )
        if problems:
            shutil.rmtree(candidate, ignore_errors=True)
            raise ValidationFailed(
                f"the uploaded run does not pass the checks: {'; '.join(problems[:5])}",
                details={"problems": problems, "session_id": session_id},
            )
        workspace = db.get(Workspace, state["workspace_id"])
        assert workspace is not None  # _session found a membership of it
        run = _store_run(db, settings, state=state, workspace=workspace, user=user, path=candidate)
        _publish(settings, run.id)
        state.update(
            status="finalized",
            eval_run_id=run.id,
            eval_run_name=run.name,
            finalized_files={
                p: {"size": f["size"], "sha256": f["sha256"]} for p, f in state["files"].items()
            },
        )
        _write_state(settings, state)
        shutil.rmtree(folder / "files", ignore_errors=True)
        return _public(state)


def _publish(settings: Settings, run_id: str) -> None:
    """With an object store, the uploaded run goes there at once, as a worker's run does: the
    other API processes serve it from the store (this machine's copy is only a cache)."""
    if settings.blob_url is None:
        return
    from osmosis.platform.core.blobs import open_object_store
    from osmosis.platform.core.object_store import RunPublisher

    store = open_object_store(settings.blob_url, settings.blob_dir, runs_root=settings.runs_dir)
    RunPublisher(store, run_id).publish()


def _assemble(target: Path, staged: Path, existing: Path | None, files: Mapping[str, Any]) -> None:
    """The complete directory: new files from the session, unchanged ones from the run."""
    for path in files:
        source = staged / path
        if not source.is_file() and existing is not None:
            source = existing / path
        destination = target / path
        destination.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(source, destination)
        except OSError:
            shutil.copyfile(source, destination)


def _obj(value: object) -> dict[str, Any]:
    return dict(value) if isinstance(value, Mapping) else {}


def _number(value: object) -> float | None:
    if isinstance(value, int | float) and not isinstance(value, bool) and value == value:
        return float(value) if isinstance(value, float) else value
    return None


def _iso(value: object) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        return None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def _config_path(provenance: Mapping[str, Any]) -> str:
    """`configs/eval/x.toml` from the local absolute path the manifest recorded."""
    path = str(provenance.get("config_path") or "")
    marker = path.rfind("configs/eval/")
    return path[marker:] if marker >= 0 else path.rsplit("/", 1)[-1]


def _store_run(
    db: Session,
    settings: Settings,
    *,
    state: Mapping[str, Any],
    workspace: Workspace,
    user: User,
    path: Path,
) -> EvalRun:
    # verify_run_dir checked what decides the results; the descriptive fields are read
    # defensively, since nothing else vouches for their types.
    manifest = json.loads((path / "manifest.json").read_text(encoding="utf-8"))
    metrics = json.loads((path / "metrics.json").read_text(encoding="utf-8"))
    progress = json.loads((path / "progress.json").read_text(encoding="utf-8"))
    inputs, provenance = _obj(manifest.get("inputs")), _obj(manifest.get("provenance"))
    rollout, selection = _obj(inputs.get("rollout")), _obj(provenance.get("selection"))
    timeouts = {k: v for k, v in _obj(inputs.get("timeouts")).items() if _number(v) is not None}
    threshold = float(inputs["pass_threshold"])
    info = _obj(metrics.get("eval_run"))
    secret_names = [n for n in inputs.get("secrets") or [] if isinstance(n, str)]
    version_id = db.scalar(
        select(DatasetVersion.id)
        .join(Dataset, Dataset.id == DatasetVersion.dataset_id)
        .where(
            Dataset.workspace_id == workspace.id,
            DatasetVersion.sha256 == str(_obj(inputs.get("dataset")).get("sha256", "")),
        )
        .limit(1)
    )
    run = db.get(EvalRun, state["eval_run_id"]) if state.get("eval_run_id") else None
    fresh = run is None
    if run is None:
        run = EvalRun(id=new_id(), workspace_id=workspace.id, created_by=user.id)
    run.status = "finished"
    run.created_at = run.created_at or utcnow()
    run.started_at = _iso(info.get("started_at"))
    run.completed_at = _iso(info.get("completed_at")) or utcnow()
    run.duration_ms = _number(info.get("duration_ms"))
    run.payload = json.dumps(
        {
            "import": {
                "local_run_id": state["local_run_id"],
                "manifest_digest": state["manifest_digest"],
                "local_run_name": state["run_name"],
                "uploaded_by": user.id,
            },
            "provenance": provenance,
        },
        default=str,
    )
    run.config = json.dumps(
        {
            "evaluation": {
                "limit": _number(selection.get("limit")),
                "n": _number(inputs.get("n")),
                "pass_threshold": threshold,
                **timeouts,
            },
            "advanced": _obj(provenance.get("advanced")),
            "env": {k: str(v) for k, v in _obj(inputs.get("env")).items()},
        }
    )
    run.config_toml = ""  # a local run keeps its config file; only its resolved inputs travel
    run.config_path = _config_path(provenance)
    run.rollout = str(rollout.get("name") or info.get("rollout_name") or "")
    run.entrypoint = str(rollout.get("entrypoint") or "")
    run.model_path = str(inputs.get("model_path") or info.get("model_name") or "")
    run.dataset_name = str(info.get("dataset_name") or "")
    run.origin_url = workspace.identity
    run.commit_sha = str(provenance.get("config_commit_sha") or "")
    branch = provenance.get("config_branch")
    run.branch = branch if isinstance(branch, str) else None
    run.dataset_version_id = version_id
    run.total = int(progress["total_runs"])
    rows = progress.get("total_dataset_rows")
    run.dataset_rows = rows if isinstance(rows, int) and not isinstance(rows, bool) else None
    run.resumed_count = 0
    run.secret_scopes = json.dumps(dict.fromkeys(secret_names, "run"))
    if fresh:
        _insert_named(db, run, state["run_name"])
    destination = run_dir(settings, run.id)
    _replace_directory(path, destination)
    db.execute(delete(EvalAttempt).where(EvalAttempt.run_id == run.id))
    db.add_all(_attempts(run.id, destination / "events.jsonl"))
    db.flush()
    refresh_counters(db, run_id=run.id, pass_threshold=threshold)
    metrics["eval_run"] = {**info, "id": run.id, "name": run.name, "status": "finished"}
    (destination / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
    run.summary = json.dumps(metrics)
    db.commit()
    append_log(
        destination,
        f"imported from local run {state['run_name']} ({state['local_run_id']}) by {user.name}"
        + ("" if fresh else ", replacing the earlier import"),
    )
    return run


def _insert_named(db: Session, run: EvalRun, wanted: str) -> None:
    """Keep the local run's name when it is free; else add a short suffix."""
    for attempt in range(8):
        run.name = wanted if attempt == 0 else f"{wanted[:250]}-{secrets.token_hex(2)}"
        db.add(run)
        try:
            db.commit()
        except IntegrityError:
            db.rollback()
            continue
        return
    raise Conflict("could not find a free run name; upload again")


def _replace_directory(source: Path, destination: Path) -> None:
    old = destination.with_name(f"{destination.name}.replaced-{secrets.token_hex(4)}")
    destination.parent.mkdir(parents=True, exist_ok=True)
    if destination.exists():
        os.replace(destination, old)
    os.replace(source, destination)
    shutil.rmtree(old, ignore_errors=True)


def _attempts(run_id: str, journal: Path) -> list[EvalAttempt]:
    latest: dict[tuple[int, int], AttemptRecord] = {}
    with journal.open("rb") as handle:
        for line in handle:
            with contextlib.suppress(ValueError):
                record = AttemptRecord.model_validate_json(line)
                latest[(record.row_index, record.run_index)] = record
    return [
        EvalAttempt(
            run_id=run_id,
            row_index=r.row_index,
            run_index=r.run_index,
            source_row_index=r.source_row_index,
            rollout_id=r.rollout_id,
            status=r.status,
            reward=r.reward,
            tokens=r.tokens,
            duration_ms=r.duration_ms,
            error_type=r.error_type,
            cost_usd=r.cost_usd,
            finished_at=r.finished_at,
        )
        for r in latest.values()
    ]
