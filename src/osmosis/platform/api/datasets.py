"""`/api/datasets`: upload a workspace's datasets, and list, inspect, preview and download them.

The upload's body is the raw file, streamed; its query names the file and declares the size and
SHA-256 the server must receive. Every other route reads a dataset by name (its file stem),
from its newest version unless `version` picks an older one.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import APIRouter, Path, Query, Request
from fastapi.responses import FileResponse
from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect

from osmosis.platform.core.blobs import open_store
from osmosis.platform.core.db.dataset_models import DatasetVersion
from osmosis.platform.core.errors import ValidationFailed
from osmosis.platform.core.settings import Settings
from osmosis.platform.deps import CurrentUser, CurrentWorkspace, Db, MemberWorkspace, Offset
from osmosis.platform.services import datasets
from osmosis.vocabulary import MAX_PAGE
from osmosis.wire.datasets import (
    DEFAULT_PREVIEW_ROWS,
    MAX_LOG_PAGE,
    PREVIEW_ROWS,
    SHA256_HEADER,
    VERSION_HEADER,
    DatasetList,
    DatasetLogList,
    DatasetLogPublic,
    DatasetPreview,
    DatasetPublic,
)

router = APIRouter(prefix="/api/datasets", tags=["datasets"])

NamePath = Annotated[
    str, Path(min_length=1, max_length=300, description="A dataset name: its file's stem.")
]
VersionQuery = Annotated[
    int | None, Query(ge=1, description="A version number; default: the newest version.")
]
_MEDIA_TYPES = {
    "csv": "text/csv",
    "jsonl": "application/x-ndjson",
    "parquet": "application/vnd.apache.parquet",
}


def _settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


def public(version: DatasetVersion, *, count: int | None = None) -> DatasetPublic:
    dataset = version.dataset
    return DatasetPublic(
        id=dataset.id,
        name=dataset.name,
        version=version.version,
        version_id=version.id,
        version_count=len(dataset.versions) if count is None else count,
        status=version.status,
        file_name=version.file_name,
        format=version.format,
        size_bytes=version.size_bytes,
        sha256=version.sha256,
        rows=version.rows,
        columns=json.loads(version.columns) if version.columns else None,
        mode=version.mode,
        error=version.error,
        created_by=version.creator.name if version.creator else None,
        created_at=version.created_at,
        updated_at=version.updated_at,
    )


@router.post("", status_code=201)
async def upload_dataset(
    request: Request,
    db: Db,
    user: CurrentUser,
    workspace: CurrentWorkspace,
    file_name: Annotated[
        str, Query(min_length=1, max_length=300, description="e.g. qa.jsonl; name = stem.")
    ],
    size: Annotated[int, Query(description="The body's exact length in bytes.")],
    sha256: Annotated[str, Query(description="The body's SHA-256, in hex.")],
    overwrite: Annotated[
        bool, Query(description="Add a new version to an existing dataset.")
    ] = False,
) -> DatasetPublic:
    """Upload a dataset file as the request body (streamed; never buffered whole).

    The server checks the body against `size` and `sha256`, validates it with the same rules
    as `osmosis dataset validate`, and answers with the finished version (`uploaded`). A
    failure leaves the version `error` with its reasons in the dataset's logs.
    """
    settings = _settings(request)
    length = request.headers.get("content-length", "")
    if length.isdigit() and int(length) > settings.max_upload_bytes:
        # Refuse before a byte is stored, even when the query understates the size.
        raise datasets.PayloadTooLarge(
            f"the body is {int(length):,} bytes; this platform accepts at most "
            f"{settings.max_upload_bytes:,}",
            details={"size": int(length), "max_upload_bytes": settings.max_upload_bytes},
        )
    version = await run_in_threadpool(
        datasets.start_upload,
        db,
        workspace=workspace,
        user=user,
        file_name=file_name,
        size=size,
        sha256=sha256,
        overwrite=overwrite,
        max_bytes=settings.max_upload_bytes,
        free_bytes=datasets.blob_room(settings),
    )

    async def body() -> AsyncIterator[bytes]:
        try:
            async for chunk in request.stream():
                yield chunk
        except ClientDisconnect:
            raise datasets.UploadInterrupted() from None

    store = open_store(settings)
    try:
        finished = await datasets.receive_upload(db, body(), store=store, version=version)
    except datasets.UploadInterrupted:
        # Nobody is listening any more; the version is already `error` with a log line.
        raise ValidationFailed("the upload was interrupted") from None
    return public(finished)


@router.get("")
def list_datasets(
    db: Db,
    workspace: CurrentWorkspace,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = MAX_PAGE,
    offset: Offset = 0,
) -> DatasetList:
    """The workspace's datasets by name, each as its newest version describes it."""
    page = datasets.list_datasets(db, workspace=workspace, limit=limit, offset=offset)
    return DatasetList(
        datasets=[public(version, count=count) for version, count in page.items],
        total_count=page.total_count,
        has_more=page.has_more,
        next_offset=page.next_offset,
    )


@router.get("/{name}")
def dataset_info(
    name: NamePath, db: Db, workspace: MemberWorkspace, version: VersionQuery = None
) -> DatasetPublic:
    """One dataset: status, format, rows, columns, size, hash, who uploaded it and when."""
    dataset = datasets.get_dataset(db, workspace=workspace, name=name)
    return public(datasets.get_version(db, dataset=dataset, version=version))


@router.get("/{name}/preview")
def preview_dataset(
    name: NamePath,
    db: Db,
    workspace: MemberWorkspace,
    rows: Annotated[int, Query(ge=1, le=PREVIEW_ROWS)] = DEFAULT_PREVIEW_ROWS,
    version: VersionQuery = None,
) -> DatasetPreview:
    """The first `rows` rows (at most 20) of an uploaded version."""
    dataset = datasets.get_dataset(db, workspace=workspace, name=name)
    chosen = datasets.require_uploaded(
        datasets.get_version(db, dataset=dataset, version=version), action="preview"
    )
    stored = json.loads(chosen.preview or "[]")
    return DatasetPreview(
        name=dataset.name,
        version=chosen.version,
        columns=json.loads(chosen.columns or "[]"),
        rows=stored[:rows],
        total_rows=chosen.rows or 0,
    )


@router.get("/{name}/download", response_class=FileResponse)
def download_dataset(
    name: NamePath,
    request: Request,
    db: Db,
    workspace: MemberWorkspace,
    version: VersionQuery = None,
) -> FileResponse:
    """The file's bytes, streamed; `X-Osmosis-Sha256` says what they must hash to."""
    dataset = datasets.get_dataset(db, workspace=workspace, name=name)
    chosen = datasets.require_uploaded(
        datasets.get_version(db, dataset=dataset, version=version), action="download"
    )
    path = datasets.version_path(_settings(request), chosen)
    if not path.is_file():
        raise datasets.BlobMissing(
            f"the stored content of dataset {dataset.name} version {chosen.version} is missing",
            details={"sha256": chosen.sha256},
        )
    return FileResponse(
        path,
        media_type=_MEDIA_TYPES[chosen.format],
        filename=chosen.file_name,
        headers={SHA256_HEADER: chosen.sha256, VERSION_HEADER: str(chosen.version)},
    )


@router.get("/{name}/logs")
def dataset_logs(
    name: NamePath,
    db: Db,
    workspace: MemberWorkspace,
    limit: Annotated[int, Query(ge=1, le=MAX_LOG_PAGE)] = MAX_LOG_PAGE,
    cursor: Annotated[str | None, Query(max_length=64)] = None,
) -> DatasetLogList:
    """Processing logs of every version, oldest first; page on with `next_cursor`."""
    dataset = datasets.get_dataset(db, workspace=workspace, name=name)
    page = datasets.dataset_logs(db, dataset=dataset, limit=limit, cursor=cursor)
    return DatasetLogList(
        logs=[
            DatasetLogPublic(
                id=line.id,
                timestamp=line.created_at,
                level=line.level,
                step=line.step,
                message=line.message,
                version=number,
            )
            for line, number in page.entries
        ],
        next_cursor=page.next_cursor,
    )
