"""`/api/cli/transfer/...`: what capability URLs point at. No token: the URL's signature is
the permission, for one object, one method, until it expires (`services.capability_urls`).

The official CLI fetches these as it would presigned storage URLs: `PUT` a dataset's bytes,
`GET` a dataset version's bytes, `GET` one file of a run's download layout, `PUT` one file
of an `eval upload`.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import APIRouter, Path, Query, Request
from fastapi.responses import FileResponse
from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect

from osmosis.platform.core.db.dataset_models import DatasetVersion
from osmosis.platform.core.errors import NotFound, ValidationFailed
from osmosis.platform.core.settings import Settings
from osmosis.platform.deps import Db
from osmosis.platform.services import datasets, run_files, runs, staged_uploads
from osmosis.platform.services.capability_urls import CapabilitySigner

from .datasets import DOWNLOAD, UPLOAD
from .errors import OfficialRoute
from .eval_runs import RUN_FILE
from .run_imports import RUN_IMPORT
from .run_imports import receive as receive_run_import

router = APIRouter(prefix="/transfer", route_class=OfficialRoute)

ObjectId = Annotated[str, Path(min_length=1, max_length=1100)]
Expires = Annotated[int, Query(ge=0, le=2**40)]
Signature = Annotated[str, Query(min_length=64, max_length=64)]
_MEDIA_TYPES = {
    "csv": "text/csv",
    "jsonl": "application/x-ndjson",
    "parquet": "application/vnd.apache.parquet",
}


def _check(request: Request, *, purpose: str, object_id: str, expires: int, sig: str) -> None:
    signer: CapabilitySigner = request.app.state.capability_signer
    signer.check(
        method=request.method,
        purpose=purpose,
        object_id=object_id,
        expires=expires,
        signature=sig,
        now=time.time(),
    )


@router.api_route("/{purpose}/{object_id:path}", methods=["GET", "PUT"], response_model=None)
async def transfer(
    purpose: Annotated[str, Path(max_length=32)],
    object_id: ObjectId,
    request: Request,
    db: Db,
    expires: Expires,
    signature: Signature,
) -> FileResponse | dict[str, object]:
    """One request the URL's signature allows; any other (method, object, purpose or a
    forged or expired link) is a 403 before anything is read or written."""
    _check(request, purpose=purpose, object_id=object_id, expires=expires, sig=signature)
    settings: Settings = request.app.state.settings
    if (purpose, request.method) == (UPLOAD, "PUT"):
        return await _receive_dataset(settings, object_id, request)
    if (purpose, request.method) == (RUN_IMPORT, "PUT"):
        return await receive_run_import(settings, object_id, request)
    if (purpose, request.method) == (DOWNLOAD, "GET"):
        return await run_in_threadpool(_dataset_file, settings, db, object_id)
    if (purpose, request.method) == (RUN_FILE, "GET"):
        run_id, _, path = object_id.partition("/")
        file = run_files.layout_file(runs.run_dir(settings, run_id), path)
        return FileResponse(file, media_type="application/octet-stream")
    raise NotFound(f"no transfer of kind {purpose!r}")  # never signed: unreachable in practice


async def _receive_dataset(
    settings: Settings, upload_id: str, request: Request
) -> dict[str, object]:
    """Receive an announced dataset upload's bytes (exactly as many as announced)."""
    staged = staged_uploads.find(settings, upload_id)

    async def body() -> AsyncIterator[bytes]:
        try:
            async for chunk in request.stream():
                yield chunk
        except ClientDisconnect:
            raise ValidationFailed("the upload was interrupted") from None

    received = await staged_uploads.receive(settings, staged, body())
    return {"received": received}


def _dataset_file(settings: Settings, db: Db, version_id: str) -> FileResponse:
    """A dataset version's bytes."""
    version = db.get(DatasetVersion, version_id)
    if version is None:
        raise NotFound("this dataset version no longer exists")
    path = datasets.version_path(settings, version)
    if not path.is_file():
        raise datasets.BlobMissing(
            f"the stored content of dataset {version.dataset.name} is missing",
            details={"sha256": version.sha256},
        )
    return FileResponse(path, media_type=_MEDIA_TYPES[version.format], filename=version.file_name)
