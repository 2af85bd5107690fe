"""Store functions for datasets: upload, validate, look up, page through, and recover.

An upload is one streamed request. Its version goes `uploading` (bytes arriving) →
`processing` (all bytes received, size and SHA-256 verified, blob stored) → `uploaded` (the
server-side validation passed) or `error` (see `dataset_logs`). Versions are never changed once
`uploaded`; an overwrite adds a version, so a run keeps the exact bytes it was given.
The stored preview is bounded: `PREVIEW_ROWS` rows, each cell cut at `PREVIEW_CELL_CHARS`.

    version = start_upload(db, workspace=ws, user=ada, file_name="qa.jsonl", size=n,
                           sha256=digest, overwrite=False, max_bytes=settings.max_upload_bytes)
    await receive_upload(db, chunks, store=store, version=version)
    find_ready_version(db, workspace=ws, name="qa")  # the newest uploaded version
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import and_, func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker
from starlette.concurrency import run_in_threadpool

from osmosis.platform.core.blobs import BlobMismatch, BlobStore, open_store
from osmosis.platform.core.db.dataset_models import Dataset, DatasetLog, DatasetVersion
from osmosis.platform.core.db.dialect import lock_rows
from osmosis.platform.core.db.models import User, Workspace, utcnow
from osmosis.platform.core.disk import disk_full_reason, disk_space
from osmosis.platform.core.errors import (
    Conflict,
    NotFound,
    PlatformError,
    ValidationFailed,
    disk_full,
)
from osmosis.platform.core.settings import Settings
from osmosis.vocabulary import MAX_PAGE, format_bytes
from osmosis.wire.datasets import MAX_LOG_PAGE, PREVIEW_ROWS, name_problem

NAMESPACE = "datasets"
FORMATS = ("csv", "jsonl", "parquet")
IN_PROGRESS = ("uploading", "processing")
_SHA256 = re.compile(r"^[0-9a-fA-F]{64}$")
# Disk writes go to a worker thread in batches of this size, not once per network chunk.
_WRITE_BATCH = 1 << 20
PREVIEW_CELL_CHARS = 2_000
"""A preview cell longer than this is cut to it and ends in `…`; a nested value whose JSON is
longer is shown as its cut JSON text. The stored preview stays small whatever the rows hold."""
CUT_MARK = "…"


class PayloadTooLarge(PlatformError):
    code = "PAYLOAD_TOO_LARGE"
    status_code = 413


class BlobMissing(PlatformError):
    """The database names content that is not on disk: the blob directory was tampered with."""

    code = "INTERNAL"
    status_code = 500


class UploadInterrupted(Exception):
    """The client went away before sending the whole body."""


class BlobCorrupted(PlatformError):
    """A blob's bytes no longer hash to what was recorded at upload: changed on disk."""

    code = "INTERNAL"
    status_code = 500


# -- names -----------------------------------------------------------------------------------
def check_name(name: str) -> str:
    problem = name_problem(name)
    if problem is not None:
        raise ValidationFailed(problem, details={"name": name[:300], "field": "name"})
    return name


def parse_file_name(file_name: str) -> tuple[str, str]:
    """`("qa", "jsonl")` for "qa.jsonl": the dataset name (the stem) and the format."""
    stem, dot, extension = file_name.rpartition(".")
    if not dot:
        stem, extension = file_name, ""
    # The whole file name must be a safe stem too: it is echoed into download file names.
    check_name(file_name)
    check_name(stem)
    if extension.lower() not in FORMATS:
        shown = f"'.{extension}'" if extension else "(none)"
        raise ValidationFailed(
            f"Unsupported file type {shown}. Supported: {', '.join(FORMATS)}",
            details={"file_name": file_name, "field": "file_name"},
        )
    return stem, extension.lower()


# -- logs ------------------------------------------------------------------------------------
def log(
    db: Session, *, version: DatasetVersion, step: str, message: str, level: str = "info"
) -> None:
    db.add(
        DatasetLog(
            version_id=version.id, created_at=utcnow(), level=level, step=step, message=message
        )
    )


def _fail(db: Session, *, version: DatasetVersion, step: str, message: str) -> None:
    version.status = "error"
    version.error = message
    version.updated_at = utcnow()
    log(db, version=version, step=step, message=message, level="error")
    db.commit()


# -- upload ----------------------------------------------------------------------------------
def blob_room(settings: Settings) -> int:
    """Bytes free on the disk of the blob store (for `start_upload`'s `free_bytes`)."""
    return disk_space(settings.blob_dir, min_free_bytes=0).free_bytes


def start_upload(
    db: Session,
    *,
    workspace: Workspace,
    user: User,
    file_name: str,
    size: int,
    sha256: str,
    overwrite: bool,
    max_bytes: int,
    free_bytes: int | None = None,
) -> DatasetVersion:
    """Record a new version in `uploading`, creating the dataset on its first upload.

    A name that already holds data (a version uploaded or in progress) is a `Conflict` with
    `details.existing_dataset_id`, unless `overwrite`. A name whose every upload failed is
    free: there is nothing to replace. An overwrite with the bytes (SHA-256 and format) of the
    newest uploaded version returns that version: no new version for unchanged content.
    An upload larger than `free_bytes` (the blob store's disk) is refused with 507
    `DISK_FULL` before anything is recorded: the retry, once space is freed, starts afresh.
    """
    name, kind = parse_file_name(file_name)
    if size <= 0:
        raise ValidationFailed("File is empty", details={"file_name": file_name, "size": size})
    if size > max_bytes:
        raise PayloadTooLarge(
            f"{file_name} is {size:,} bytes; this platform accepts at most {max_bytes:,}",
            details={"size": size, "max_upload_bytes": max_bytes},
        )
    if not _SHA256.match(sha256):
        raise ValidationFailed(
            "sha256 must be 64 hexadecimal characters", details={"field": "sha256"}
        )
    # Uploads to one workspace decide one after the other: two at once could each find no
    # `qa`/`QA` twin and both create theirs (READ COMMITTED on PostgreSQL; on SQLite too).
    lock_rows(db, Workspace, Workspace.id == workspace.id)
    dataset = _find(db, workspace=workspace, name=name)
    if dataset is None:
        twin = _case_twin(db, workspace=workspace, name=name)
        if twin is not None:
            # `qa` and `QA` would be one file on macOS and Windows (downloads, `data/<name>`).
            raise Conflict(
                f"dataset {name} differs only in letter case from the existing dataset "
                f"{twin}; rename the file, or upload it as {twin}.{kind} with --overwrite",
                details={"name": name, "existing_name": twin, "field": "file_name"},
            )
        dataset = Dataset(
            workspace_id=workspace.id, name=name, created_by=user.id, created_at=utcnow()
        )
        db.add(dataset)
        number = 1
    else:
        live = [v for v in dataset.versions if v.status != "error"]
        if live and not overwrite:
            raise Conflict(
                f"dataset {name} already exists in this workspace; use --overwrite to upload "
                "a new version",
                details={"existing_dataset_id": dataset.id, "name": name},
            )
        newest = max(live, key=lambda v: v.version, default=None)
        if (
            newest is not None
            and newest.status == "uploaded"
            and (newest.sha256, newest.format) == (sha256.lower(), kind)
        ):
            # The same bytes again: the newest version is the answer, and nothing is stored
            # (`receive_upload` reads and drops the body).
            return newest
        number = max(v.version for v in dataset.versions) + 1
    if free_bytes is not None and free_bytes < size:
        raise disk_full(
            f"{format_bytes(free_bytes)} free on the disk of the blob store, the upload needs "
            f"{format_bytes(size)}"
        )
    now = utcnow()
    version = DatasetVersion(
        dataset=dataset,
        version=number,
        status="uploading",
        file_name=file_name,
        format=kind,
        size_bytes=size,
        sha256=sha256.lower(),
        created_by=user.id,
        created_at=now,
        updated_at=now,
    )
    db.add(version)
    try:
        db.flush()
    except IntegrityError:  # the same name or version created by a concurrent upload
        db.rollback()
        raise Conflict(f"dataset {name} is being uploaded concurrently; try again") from None
    log(
        db,
        version=version,
        step="upload",
        message=f"upload of {file_name} started by {user.name}: {size:,} bytes, "
        f"sha256 {version.sha256}",
    )
    db.commit()
    return version


async def receive_upload(
    db: Session, chunks: AsyncIterator[bytes], *, store: BlobStore, version: DatasetVersion
) -> DatasetVersion:
    """Stream the body into the blob store, verify it, validate it, and finish the version.

    Never holds the body in memory. A short, long or corrupted body, a client that goes away
    and an invalid dataset each leave the version `error` with a log line; the first three
    raise `ValidationFailed` (or `UploadInterrupted`), an invalid dataset raises
    `ValidationFailed` naming its problems. On success the version is `uploaded`.
    """
    if version.status == "uploaded":  # an overwrite with identical bytes (`start_upload`)
        async for _chunk in chunks:
            pass
        return version
    writer = await run_in_threadpool(store.writer, NAMESPACE, extension=version.format)
    expected = version.size_bytes
    received = 0
    try:
        buffer = bytearray()
        async for chunk in chunks:
            received += len(chunk)
            if received > expected:
                message = f"the body is larger than the declared {expected:,} bytes"
                await run_in_threadpool(_fail, db, version=version, step="verify", message=message)
                raise ValidationFailed(message, details=_where(version))
            buffer += chunk
            if len(buffer) >= _WRITE_BATCH:
                await run_in_threadpool(writer.write, bytes(buffer))
                buffer.clear()
        await run_in_threadpool(writer.write, bytes(buffer))
        path = await run_in_threadpool(writer.commit, size=expected, sha256=version.sha256)
    except UploadInterrupted:
        message = f"the upload was interrupted after {received:,} of {expected:,} bytes"
        await run_in_threadpool(_fail, db, version=version, step="upload", message=message)
        raise
    except BlobMismatch as error:
        message = f"the upload does not match what the client declared: {error}"
        await run_in_threadpool(_fail, db, version=version, step="verify", message=message)
        raise ValidationFailed(message, details=_where(version)) from None
    except OSError as error:
        reason = disk_full_reason(error)
        if reason is None:
            raise
        # The disk filled during the upload. The version ends `error` if the database can
        # still say so, and the name stays free for the retry once space is freed.
        message = f"the platform's disk is full ({reason}) after {received:,} bytes"
        try:
            await run_in_threadpool(_fail, db, version=version, step="upload", message=message)
        except Exception:
            await run_in_threadpool(db.rollback)
        raise disk_full(reason) from None
    finally:
        writer.discard()  # no-op after a commit; otherwise the partial file goes
    return await run_in_threadpool(_process, db, store=store, version=version, path=path)


def _where(version: DatasetVersion) -> dict[str, Any]:
    return {
        "dataset_id": version.dataset_id,
        "name": version.dataset.name,
        "version": version.version,
        "status": version.status,
    }


@dataclass(frozen=True)
class _Inspection:
    rows: int
    columns: list[str]
    mode: str
    preview: list[dict[str, Any]]
    warnings: tuple[str, ...]


def _process(
    db: Session, *, store: BlobStore, version: DatasetVersion, path: Path
) -> DatasetVersion:
    """Validate the stored blob with the same validator as the CLI, then finish the version."""
    from osmosis.eval.inputs.dataset import DatasetError

    version.status = "processing"
    version.updated_at = utcnow()
    log(db, version=version, step="verify", message="all bytes received; size and sha256 match")
    db.commit()
    try:
        found = _inspect(path)
    except DatasetError as error:
        problems = [problem.format(version.file_name) for problem in error.problems]
        more = error.total - len(error.problems)
        summary = f"{error.total} problem{'s' if error.total != 1 else ''}: " + "; ".join(problems)
        if more:
            summary += f"; ... and {more} more"
        for line in problems:
            log(db, version=version, step="validate", message=line, level="error")
        _fail(db, version=version, step="validate", message=f"invalid dataset ({summary})")
        _drop_blob_if_unused(db, store=store, version=version)
        raise ValidationFailed(
            f"{version.file_name} is not a valid dataset ({summary})",
            details={
                **_where(version),
                "problems": [problem.as_dict() for problem in error.problems],
                "total_problems": error.total,
            },
        ) from None
    except Exception as error:
        # A bug of ours must not leave the version `processing` forever: it ends `error`, and
        # the traceback reaches the server log through the 500 handler.
        message = f"the file could not be validated: {type(error).__name__}: {error}"
        _fail(db, version=version, step="validate", message=message[:2000])
        _drop_blob_if_unused(db, store=store, version=version)
        raise
    for warning in found.warnings:
        log(db, version=version, step="validate", message=warning, level="warning")
    version.rows = found.rows
    version.columns = json.dumps(found.columns)
    version.mode = found.mode
    version.preview = json.dumps(found.preview, default=str)
    version.status = "uploaded"
    version.updated_at = utcnow()
    log(
        db,
        version=version,
        step="validate",
        message=f"valid {found.mode}-mode dataset: {found.rows:,} rows, columns "
        f"{', '.join(found.columns)}",
    )
    db.commit()
    return version


def _inspect(path: Path) -> _Inspection:
    from osmosis.eval.inputs.dataset import validate_dataset
    from osmosis.eval.inputs.dataset_formats import open_records

    info = validate_dataset(path)
    reader = open_records(path)
    preview: list[dict[str, Any]] = []
    try:
        for record in reader:
            preview.append(
                {key: preview_cell(value) for key, value in (record.fields or {}).items()}
            )
            if len(preview) >= PREVIEW_ROWS:
                break
    finally:
        reader.close()
    return _Inspection(info.rows, list(info.columns), info.mode, preview, info.warnings)


def preview_cell(value: Any) -> Any:
    """`value` as the stored preview keeps it: cut at `PREVIEW_CELL_CHARS` characters.

    preview_cell("x" * 5000)[-3:]   # 'xx…'
    preview_cell({"a": 1})          # {'a': 1}
    """
    if isinstance(value, str):
        return value if len(value) <= PREVIEW_CELL_CHARS else value[:PREVIEW_CELL_CHARS] + CUT_MARK
    if isinstance(value, (dict, list)):
        text = json.dumps(value, default=str, ensure_ascii=False)
        if len(text) > PREVIEW_CELL_CHARS:
            return text[:PREVIEW_CELL_CHARS] + CUT_MARK
    return value


def _drop_blob_if_unused(db: Session, *, store: BlobStore, version: DatasetVersion) -> None:
    """Invalid content is useless: delete it unless another version still holds the bytes."""
    others = db.scalar(
        select(func.count())
        .select_from(DatasetVersion)
        .where(
            DatasetVersion.sha256 == version.sha256,
            DatasetVersion.format == version.format,
            DatasetVersion.status != "error",
        )
    )
    if not others:
        version_path_in(store, version).unlink(missing_ok=True)


# -- reading ---------------------------------------------------------------------------------
def _find(db: Session, *, workspace: Workspace, name: str) -> Dataset | None:
    return db.scalar(
        select(Dataset).where(Dataset.workspace_id == workspace.id, Dataset.name == name)
    )


def _case_twin(db: Session, *, workspace: Workspace, name: str) -> str | None:
    """The name of another dataset of `workspace` equal to `name` ignoring case, if any."""
    # Compared in Python: SQL lower() folds only ASCII on SQLite.
    folded = name.casefold()
    names = db.scalars(select(Dataset.name).where(Dataset.workspace_id == workspace.id))
    return next((other for other in names if other != name and other.casefold() == folded), None)


def get_dataset(db: Session, *, workspace: Workspace, name: str) -> Dataset:
    """The dataset `name` of `workspace`, or `NotFound` (naming a dataset that differs only
    in case, when there is one)."""
    check_name(name)
    dataset = _find(db, workspace=workspace, name=name)
    if dataset is None:
        twin = _case_twin(db, workspace=workspace, name=name)
        if twin is not None:
            raise NotFound(
                f"no dataset {name} in this workspace; did you mean {twin}? (names are "
                "case-sensitive)",
                details={"name": name, "did_you_mean": twin},
            )
        raise NotFound(
            f"no dataset {name} in this workspace",
            details={"name": name, "hint": "osmosis dataset list shows the names"},
        )
    return dataset


def get_version(db: Session, *, dataset: Dataset, version: int | None = None) -> DatasetVersion:
    """Version number `version` of `dataset`, or its newest when None."""
    if version is None:
        return dataset.versions[-1]
    for candidate in dataset.versions:
        if candidate.version == version:
            return candidate
    raise NotFound(
        f"dataset {dataset.name} has no version {version}",
        details={"name": dataset.name, "version": version, "versions": len(dataset.versions)},
    )


def require_uploaded(version: DatasetVersion, *, action: str) -> DatasetVersion:
    """`version` if it is ready; otherwise a `Conflict` saying why `action` must wait."""
    if version.status == "uploaded":
        return version
    name = version.dataset.name
    if version.status == "error":
        message = (
            f"cannot {action} dataset {name}: version {version.version} failed "
            f"(see `osmosis dataset logs {name}`)"
        )
    else:
        message = (
            f"cannot {action} dataset {name} yet: version {version.version} is "
            f"{version.status}; try again once its status is uploaded"
        )
    raise Conflict(message, details=_where(version))


def find_ready_version(db: Session, *, workspace: Workspace, name: str) -> DatasetVersion:
    """The newest `uploaded` version of dataset `name`: what a new evaluation run reads.

    `NotFound` when the workspace has no such dataset, `Conflict` when none of its versions is
    ready (still uploading or processing, or failed).

        version = find_ready_version(db, workspace=ws, name="multiply")
        path = version_path(settings, version)
    """
    dataset = get_dataset(db, workspace=workspace, name=name)
    for version in reversed(dataset.versions):
        if version.status == "uploaded":
            return version
    return require_uploaded(dataset.versions[-1], action="use")


def version_path_in(store: BlobStore, version: DatasetVersion) -> Path:
    return store.path(NAMESPACE, sha256=version.sha256, extension=version.format)


def version_path(settings: Settings, version: DatasetVersion) -> Path:
    """The blob file holding `version`'s bytes (named `<sha256>.<format>`, so
    `validate_dataset` and `read_rows` can read it directly)."""
    return version_path_in(open_store(settings), version)


def copy_for_run(settings: Settings, version: DatasetVersion, dest: Path) -> Path:
    """A private, read-only copy of `version`'s bytes at `dest`, verified against its SHA-256.

    A run never gets the blob itself (nor a hard link, which shares its inode): whatever the
    rollout does to its file, the content-addressed blob every other run reads stays as it
    was. A copy whose bytes do not hash to the recorded SHA-256 is deleted and raises
    `BlobCorrupted` naming both hashes: the blob was changed on disk, and no run may use it.

        path = copy_for_run(settings, version, inputs / "multiply.jsonl")
    """
    blob = version_path(settings, version)
    name = f"dataset {version.dataset.name} version {version.version}"
    dest.unlink(missing_ok=True)
    digest = hashlib.sha256()
    try:
        source = blob.open("rb")
    except FileNotFoundError:
        raise BlobMissing(
            f"the stored content of {name} is missing ({blob})", details={"sha256": version.sha256}
        ) from None
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
    with source, os.fdopen(os.open(dest, flags, 0o600), "wb") as target:
        while chunk := source.read(_WRITE_BATCH):
            digest.update(chunk)
            target.write(chunk)
    found = digest.hexdigest()
    if found != version.sha256:
        dest.unlink(missing_ok=True)
        raise BlobCorrupted(
            f"the stored content of {name} has SHA-256 {found}, not the {version.sha256} "
            f"recorded when it was uploaded: {blob} was changed on disk, so no run may use "
            "it; upload the dataset again (an operator should find out what wrote to the blob)",
            details={"sha256": version.sha256, "found_sha256": found, "path": str(blob)},
        )
    dest.chmod(0o400)  # read-only: a careless write fails instead of changing the run's rows
    return dest


@dataclass(frozen=True)
class Page:
    """One page of datasets, each with its newest version and its number of versions."""

    items: list[tuple[DatasetVersion, int]]
    total_count: int
    has_more: bool
    next_offset: int | None


def list_datasets(db: Session, *, workspace: Workspace, limit: int, offset: int) -> Page:
    """Datasets by name, `limit` (1-50) per page from `offset`."""
    if not 1 <= limit <= MAX_PAGE or offset < 0:
        raise ValidationFailed(f"limit must be 1-{MAX_PAGE} and offset at least 0")
    total = db.scalar(
        select(func.count()).select_from(Dataset).where(Dataset.workspace_id == workspace.id)
    )
    newest = (
        select(
            DatasetVersion.dataset_id,
            func.max(DatasetVersion.version).label("number"),
            func.count().label("count"),
        )
        .group_by(DatasetVersion.dataset_id)
        .subquery()
    )
    query = (
        select(DatasetVersion, newest.c.count)
        .join(Dataset, Dataset.id == DatasetVersion.dataset_id)
        .join(
            newest,
            and_(
                newest.c.dataset_id == DatasetVersion.dataset_id,
                newest.c.number == DatasetVersion.version,
            ),
        )
        .where(Dataset.workspace_id == workspace.id)
        .order_by(Dataset.name, Dataset.id)
        .limit(limit)
        .offset(offset)
    )
    items = [(version, int(count)) for version, count in db.execute(query).all()]
    total = int(total or 0)
    has_more = offset + len(items) < total
    return Page(items, total, has_more, offset + len(items) if has_more else None)


@dataclass(frozen=True)
class LogPage:
    entries: list[tuple[DatasetLog, int]]  # (line, version number)
    next_cursor: str | None


def dataset_logs(db: Session, *, dataset: Dataset, limit: int, cursor: str | None) -> LogPage:
    """Processing logs of every version of `dataset`, oldest first, `limit` (1-200) a page."""
    if not 1 <= limit <= MAX_LOG_PAGE:
        raise ValidationFailed(f"limit must be 1-{MAX_LOG_PAGE}")
    after = 0
    if cursor:
        if not cursor.isdigit():
            raise ValidationFailed(
                "cursor must be a next_cursor value from an earlier page",
                details={"cursor": cursor[:64]},
            )
        after = int(cursor)
    query = (
        select(DatasetLog, DatasetVersion.version)
        .join(DatasetVersion, DatasetVersion.id == DatasetLog.version_id)
        .where(DatasetVersion.dataset_id == dataset.id, DatasetLog.id > after)
        .order_by(DatasetLog.id)
        .limit(limit + 1)
    )
    rows = [(line, int(number)) for line, number in db.execute(query).all()]
    more = len(rows) > limit
    rows = rows[:limit]
    return LogPage(rows, str(rows[-1][0].id) if more else None)


# -- start-up ----------------------------------------------------------------------------------
ABANDONED_UPLOAD_S = 3600.0
"""With other platform processes alive, how long an unfinished upload must have been untouched
before a starting server fails it."""


def _other_servers_alive(db: Session, settings: Settings) -> bool:
    """Whether another API process (role api or all) is alive on this database: one that
    stopped, or died on this machine, does not count."""
    from osmosis.platform.worker.processes import db_now, dead_here, live_processes

    dead = set(dead_here(db))
    live = live_processes(db, now=db_now(db), within_s=settings.lease_s)
    return any(p.role in ("api", "all") and p.id not in dead for p in live)


def recover_interrupted(sessions: sessionmaker[Session], settings: Settings) -> int:
    """Fail every version a previous server left `uploading` or `processing`.

    Such an upload can never finish (its request died with the server), and its partial bytes
    are swept. Returns how many versions were failed.
    """
    store = open_store(settings)  # shared: other machines' uploads in progress are spared
    store.remove_partials(NAMESPACE)
    with sessions() as db:
        query = select(DatasetVersion).where(DatasetVersion.status.in_(IN_PROGRESS))
        if _other_servers_alive(db, settings):
            # Another API process may be receiving these right now: only an upload nobody
            # touched for a while is one whose request died with its server.
            cutoff = utcnow() - timedelta(seconds=ABANDONED_UPLOAD_S)
            query = query.where(DatasetVersion.updated_at < cutoff)
        stuck = list(db.scalars(query))
        for version in stuck:
            _fail(
                db,
                version=version,
                step="recover",
                message=f"the server stopped while this version was {version.status}; "
                "upload the file again",
            )
        return len(stuck)
