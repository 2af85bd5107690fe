"""`/api/cli/datasets`: `osmosis dataset upload|list|info|download|logs|preview` of the
official CLI, over the same datasets as `/api/datasets`.

An upload is announce (`POST`, answered with a capability URL), send (an unauthenticated
`PUT` of the bytes to that URL) and `POST /{id}/complete`, where the bytes are validated. A
dataset is named by its name (the file's stem) or its id.
"""

from __future__ import annotations

import json
import time
from typing import Annotated

from fastapi import APIRouter, Path, Query, Request

from osmosis.platform.core.db.dataset_models import Dataset, DatasetVersion
from osmosis.platform.core.db.models import Workspace
from osmosis.platform.core.errors import NotFound
from osmosis.platform.core.settings import Settings
from osmosis.platform.deps import CurrentUser, Db, Offset
from osmosis.platform.services import datasets, staged_uploads
from osmosis.platform.services.capability_urls import TTL_S, CapabilitySigner
from osmosis.wire.official import (
    MAX_CLI_LOG_PAGE,
    MAX_CLI_PAGE,
    DatasetComplete,
    DatasetCreate,
    DatasetFileList,
    DatasetFilePublic,
    DownloadInstructions,
    LogEntry,
    LogsPage,
    UploadInstructions,
)

from .deps import CliMemberWorkspace, CliWorkspace
from .errors import OfficialRoute

router = APIRouter(prefix="/datasets", route_class=OfficialRoute)

DatasetRef = Annotated[
    str, Path(min_length=1, max_length=300, description="A dataset's name or id.")
]
UPLOAD = "dataset-upload"
DOWNLOAD = "dataset"


def _settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


def _signer(request: Request) -> CapabilitySigner:
    signer: CapabilitySigner = request.app.state.capability_signer
    return signer


def public(version: DatasetVersion) -> DatasetFilePublic:
    preview = json.loads(version.preview) if version.preview else None
    return DatasetFilePublic(
        id=version.dataset.id,
        file_name=version.dataset.name,
        file_size=version.size_bytes,
        status=version.status,
        data_preview=preview if version.status == "uploaded" else None,
        file_format=version.format,
        original_file_format=version.format,
        row_count=version.rows,
        original_file_size=version.size_bytes,
        creator_name=version.creator.name if version.creator else None,
        created_at=version.created_at.isoformat(),
        updated_at=version.updated_at.isoformat(),
    )


def find_dataset(db: Db, *, workspace: Workspace, ref: str) -> Dataset:
    """The dataset named `ref`, else the one whose id is `ref`, in `workspace`."""
    try:
        return datasets.get_dataset(db, workspace=workspace, name=ref)
    except NotFound:
        by_id = db.get(Dataset, ref)
        if by_id is not None and by_id.workspace_id == workspace.id:
            return by_id
        raise


@router.get("")
def list_datasets(
    db: Db,
    workspace: CliWorkspace,
    limit: Annotated[int, Query(ge=1, le=MAX_CLI_PAGE)] = MAX_CLI_PAGE,
    offset: Offset = 0,
) -> DatasetFileList:
    """The workspace's datasets by name, each as its newest version describes it."""
    page = datasets.list_datasets(db, workspace=workspace, limit=limit, offset=offset)
    return DatasetFileList(
        datasets=[public(version) for version, _count in page.items],
        total_count=page.total_count,
        has_more=page.has_more,
        next_offset=page.next_offset,
    )


@router.post("")
def announce_upload(
    body: DatasetCreate, request: Request, db: Db, user: CurrentUser, workspace: CliWorkspace
) -> DatasetFilePublic:
    """Announce an upload: the answer carries the URL to `PUT` the bytes to, without a token.
    A name that holds data already is a 409 with `existing_dataset_id`."""
    staged = staged_uploads.begin(
        db,
        _settings(request),
        workspace=workspace,
        user=user,
        name=body.file_name,
        extension=body.extension,
        size=body.file_size,
        overwrite_dataset_id=body.overwrite_dataset_id,
    )
    url = _signer(request).url(
        str(request.base_url), method="PUT", purpose=UPLOAD, object_id=staged.id, now=time.time()
    )
    now = time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime(staged.created_at))
    return DatasetFilePublic(
        id=staged.id,
        file_name=staged.name,
        file_size=staged.size,
        status="uploading",
        data_preview=None,
        file_format=staged.extension,
        original_file_format=staged.extension,
        row_count=None,
        original_file_size=staged.size,
        creator_name=user.name,
        created_at=now,
        updated_at=now,
        upload=UploadInstructions(presigned_url=url, expires_in=TTL_S),
    )


@router.post("/{upload_id}/complete")
async def complete_upload(
    upload_id: Annotated[str, Path(max_length=64)],
    request: Request,
    db: Db,
    user: CurrentUser,
    workspace: CliWorkspace,
    body: DatasetComplete | None = None,
) -> DatasetFilePublic:
    """Store and validate the bytes sent: the dataset's new version, `uploaded`, or a 422
    naming the file's problems (also in `osmosis dataset logs`)."""
    settings = _settings(request)
    staged = staged_uploads.load(settings, upload_id, workspace=workspace, user=user)
    version = await staged_uploads.complete(db, settings, staged, workspace=workspace, user=user)
    return public(version)


@router.post("/{upload_id}/abort")
def abort_upload(
    upload_id: Annotated[str, Path(max_length=64)],
    request: Request,
    user: CurrentUser,
    workspace: CliWorkspace,
) -> dict[str, bool]:
    """Forget an announced upload and the bytes it received."""
    settings = _settings(request)
    staged = staged_uploads.load(settings, upload_id, workspace=workspace, user=user)
    staged_uploads.abort(settings, staged)
    return {"aborted": True}


@router.get("/{ref}")
def dataset_info(ref: DatasetRef, db: Db, workspace: CliMemberWorkspace) -> DatasetFilePublic:
    """One dataset as its newest version describes it, with its first rows."""
    dataset = find_dataset(db, workspace=workspace, ref=ref)
    return public(datasets.get_version(db, dataset=dataset))


@router.get("/{ref}/download")
def download_link(
    ref: DatasetRef, request: Request, db: Db, workspace: CliMemberWorkspace
) -> DownloadInstructions:
    """A URL to `GET` the newest uploaded version's bytes without a token, for `TTL_S` s."""
    dataset = find_dataset(db, workspace=workspace, ref=ref)
    version = datasets.require_uploaded(
        datasets.get_version(db, dataset=dataset), action="download"
    )
    url = _signer(request).url(
        str(request.base_url), method="GET", purpose=DOWNLOAD, object_id=version.id, now=time.time()
    )
    return DownloadInstructions(presigned_url=url, expires_in=TTL_S, file_name=version.file_name)


@router.get("/{ref}/logs")
def dataset_logs(
    ref: DatasetRef,
    db: Db,
    workspace: CliMemberWorkspace,
    limit: Annotated[int, Query(ge=1, le=MAX_CLI_LOG_PAGE)] = MAX_CLI_PAGE,
    cursor: Annotated[str | None, Query(max_length=64)] = None,
    direction: Annotated[str, Query(pattern="^(older|newer)$")] = "older",
) -> LogsPage:
    """Processing logs of every version, oldest first; `next_cursor` pages on.

    `direction` is accepted for the official client; pages always run oldest to newest."""
    dataset = find_dataset(db, workspace=workspace, ref=ref)
    page = datasets.dataset_logs(db, dataset=dataset, limit=limit, cursor=cursor)
    return LogsPage(
        logs=[
            LogEntry(
                timestamp=line.created_at.isoformat(),
                level=line.level,
                step=line.step,
                message=line.message,
                details={"version": number},
            )
            for line, number in page.entries
        ],
        next_cursor=page.next_cursor,
    )
