"""Dataset uploads in three steps, as the official CLI makes them: announce, send, complete.

`begin` checks the name, size and format and records the announcement in a staging directory
of the blob store (no database row: nothing exists until the bytes are complete). The bytes
arrive by a capability URL (`receive`); `complete` hashes them and hands them to
`datasets.start_upload` + `receive_upload`, so validation, versions and logs are the same as
for our own single-request upload. `abort` forgets an announcement; announcements nobody
completed are swept after `ABANDONED_S`.

    staged = begin(db, settings, workspace=ws, user=ada, name="qa", extension="jsonl", size=n)
    await receive(settings, staged.id, chunks)
    version = await complete(db, settings, load(settings, staged.id, workspace=ws, user=ada))
"""

from __future__ import annotations

import hashlib
import json
import re
import secrets
import shutil
import time
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass
from pathlib import Path

from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from osmosis.platform.core.blobs import open_store
from osmosis.platform.core.db.dataset_models import DatasetVersion
from osmosis.platform.core.db.models import User, Workspace
from osmosis.platform.core.errors import Conflict, NotFound, ValidationFailed
from osmosis.platform.core.settings import Settings
from osmosis.platform.services import datasets
from osmosis.private_file import make_private_dir
from osmosis.wire.datasets import name_problem

STAGING = "staged-uploads"
ABANDONED_S = 24 * 3600.0
_ID = re.compile(r"^[0-9a-f]{32}$")
_CHUNK = 1 << 20


@dataclass(frozen=True)
class StagedUpload:
    """An announced upload: whose, for which workspace, which file and how many bytes."""

    id: str
    workspace_id: str
    user_id: str
    name: str
    extension: str
    size: int
    overwrite: bool
    created_at: float

    @property
    def file_name(self) -> str:
        return f"{self.name}.{self.extension}"


def _root(settings: Settings) -> Path:
    return settings.blob_dir / STAGING


def _dir(settings: Settings, upload_id: str) -> Path:
    if not _ID.match(upload_id):
        raise NotFound(f"no upload {upload_id!r} in progress", details={"id": upload_id[:64]})
    return _root(settings) / upload_id


def begin(
    db: Session,
    settings: Settings,
    *,
    workspace: Workspace,
    user: User,
    name: str,
    extension: str,
    size: int,
    overwrite_dataset_id: str | None = None,
) -> StagedUpload:
    """Announce an upload; a name that holds data already is a `Conflict` carrying
    `existing_dataset_id`, unless that id is given to overwrite it."""
    extension = extension.lower().lstrip(".")
    if extension not in datasets.FORMATS:
        raise ValidationFailed(
            f"unsupported dataset format {extension!r}: use {', '.join(datasets.FORMATS)}",
            details={"field": "extension"},
        )
    if (problem := name_problem(name)) is not None:
        raise ValidationFailed(problem, details={"field": "file_name"})
    if size <= 0:
        raise ValidationFailed("File is empty", details={"field": "file_size"})
    if size > settings.max_upload_bytes:
        raise datasets.PayloadTooLarge(
            f"{name}.{extension} is {size:,} bytes; this platform accepts at most "
            f"{settings.max_upload_bytes:,}",
            details={"size": size, "max_upload_bytes": settings.max_upload_bytes},
        )
    overwrite = _check_free(db, workspace=workspace, name=name, overwrite_id=overwrite_dataset_id)
    sweep(settings)
    staged = StagedUpload(
        id=secrets.token_hex(16),
        workspace_id=workspace.id,
        user_id=user.id,
        name=name,
        extension=extension,
        size=size,
        overwrite=overwrite,
        created_at=time.time(),
    )
    make_private_dir(_root(settings))
    folder = _dir(settings, staged.id)
    folder.mkdir(mode=0o700)
    (folder / "upload.json").write_text(json.dumps(asdict(staged)))
    return staged


def _check_free(db: Session, *, workspace: Workspace, name: str, overwrite_id: str | None) -> bool:
    try:
        dataset = datasets.get_dataset(db, workspace=workspace, name=name)
    except NotFound:
        return False
    if not any(v.status != "error" for v in dataset.versions):
        return False  # every upload of it failed: the name is free
    if overwrite_id is None:
        raise Conflict(
            f"dataset {name} already exists in this workspace; use --overwrite to upload a "
            "new version",
            details={"existing_dataset_id": dataset.id, "name": name},
        )
    if overwrite_id != dataset.id:
        raise Conflict(
            f"overwrite_dataset_id {overwrite_id!r} is not the dataset named {name}",
            details={"existing_dataset_id": dataset.id, "name": name},
        )
    return True


def find(settings: Settings, upload_id: str) -> StagedUpload:
    """The announcement `upload_id`, whoever made it (capability URLs carry no user)."""
    try:
        raw = (_dir(settings, upload_id) / "upload.json").read_text()
    except FileNotFoundError:
        raise NotFound(f"no upload {upload_id!r} in progress", details={"id": upload_id}) from None
    return StagedUpload(**json.loads(raw))


def load(settings: Settings, upload_id: str, *, workspace: Workspace, user: User) -> StagedUpload:
    """The announcement `upload_id` if `user` made it for `workspace`; else `NotFound`."""
    staged = find(settings, upload_id)
    if (staged.workspace_id, staged.user_id) != (workspace.id, user.id):
        raise NotFound(f"no upload {upload_id!r} in progress", details={"id": upload_id})
    return staged


async def receive(settings: Settings, staged: StagedUpload, chunks: AsyncIterator[bytes]) -> int:
    """Write the bytes of `staged`, refusing more than announced; returns how many came."""
    target = _dir(settings, staged.id) / "data"
    partial = target.with_suffix(".part")
    received = 0
    handle = await run_in_threadpool(partial.open, "wb")
    try:
        async for chunk in chunks:
            received += len(chunk)
            if received > staged.size:
                raise ValidationFailed(
                    f"the body is larger than the announced {staged.size:,} bytes",
                    details={"file_size": staged.size},
                )
            await run_in_threadpool(handle.write, chunk)
    except BaseException:
        handle.close()
        partial.unlink(missing_ok=True)
        raise
    handle.close()
    if received != staged.size:
        partial.unlink(missing_ok=True)
        raise ValidationFailed(
            f"the body is {received:,} bytes, not the announced {staged.size:,}",
            details={"file_size": staged.size, "received": received},
        )
    partial.replace(target)
    return received


def _digest(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


async def _read(path: Path) -> AsyncIterator[bytes]:
    with path.open("rb") as handle:
        while chunk := await run_in_threadpool(handle.read, _CHUNK):
            yield chunk


async def complete(
    db: Session, settings: Settings, staged: StagedUpload, *, workspace: Workspace, user: User
) -> DatasetVersion:
    """Store and validate the received bytes as a dataset version (`uploaded`, or `error`
    with its reasons in the dataset's logs and a `ValidationFailed`)."""
    data = _dir(settings, staged.id) / "data"
    if not data.is_file():
        raise Conflict(
            "no bytes were received for this upload; PUT the file to its upload URL first",
            details={"id": staged.id},
        )
    try:
        sha256 = await run_in_threadpool(_digest, data)
        version = await run_in_threadpool(
            datasets.start_upload,
            db,
            workspace=workspace,
            user=user,
            file_name=staged.file_name,
            size=staged.size,
            sha256=sha256,
            overwrite=staged.overwrite,
            max_bytes=settings.max_upload_bytes,
        )
        return await datasets.receive_upload(
            db, _read(data), store=open_store(settings), version=version
        )
    finally:
        abort(settings, staged)


def abort(settings: Settings, staged: StagedUpload) -> None:
    """Forget an announcement and any bytes it received."""
    shutil.rmtree(_dir(settings, staged.id), ignore_errors=True)


def sweep(settings: Settings, *, now: float | None = None) -> int:
    """Remove announcements older than `ABANDONED_S`; returns how many went."""
    root = _root(settings)
    if not root.is_dir():
        return 0
    cutoff = (time.time() if now is None else now) - ABANDONED_S
    gone = 0
    for folder in root.iterdir():
        try:
            stale = folder.stat().st_mtime < cutoff
        except FileNotFoundError:
            continue
        if stale:
            shutil.rmtree(folder, ignore_errors=True)
            gone += 1
    return gone


__all__ = ["StagedUpload", "abort", "begin", "complete", "find", "load", "receive", "sweep"]
