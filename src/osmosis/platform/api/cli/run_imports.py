"""`/api/cli/eval-runs/imports`: the official `eval upload` of a finished local run.

    POST /imports                          {local_run_id, manifest_digest, run, files, ...}
    POST /imports/{s}/uploads              {paths}  -> a capability PUT URL per pending file
    PUT  <capability URL>                  the bytes, checked against the declared size, sha256
    POST /imports/{s}/uploads/complete     {path}   (a simple upload needs nothing more)
    POST /imports/{s}/finalize             -> the run, metrics computed by the server

Over `services.run_upload`, the same sessions our own `eval upload` uses; the official layout
(`rollout_trials/...`, no manifest or metrics) is converted to ours at finalize.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

from fastapi import APIRouter, Request
from pydantic import ValidationError
from starlette.requests import ClientDisconnect

from osmosis.platform.core.errors import ValidationFailed
from osmosis.platform.core.settings import Settings
from osmosis.platform.deps import CurrentUser, Db
from osmosis.platform.services import run_upload
from osmosis.platform.services.capability_urls import TTL_S, CapabilitySigner
from osmosis.wire.official import (
    RunImportFile,
    RunImportStartIn,
    RunImportUpload,
    RunImportUploadCompleteIn,
    RunImportUploads,
    RunImportUploadsIn,
    RunImportView,
    UploadInstructions,
)
from osmosis.wire.runs import RunImportCreate, RunImportSession

from .deps import CliWorkspace
from .errors import OfficialRoute

router = APIRouter(prefix="/eval-runs/imports", route_class=OfficialRoute)

RUN_IMPORT = "run-import"
"""The capability URL purpose of one declared file of an import: `<session id>/<path>`."""


def _settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


def _view(session: RunImportSession, request: Request) -> RunImportView:
    base = str(request.base_url).rstrip("/")
    return RunImportView(
        session_id=session.session_id,
        status=session.status,
        expected_files=session.expected_files,
        uploaded_files=session.uploaded_files,
        files=[RunImportFile(**f.model_dump()) for f in session.files],
        eval_run_id=session.eval_run_id,
        eval_run_name=session.eval_run_name,
        platform_url=f"{base}/runs/{session.eval_run_id}" if session.eval_run_id else None,
    )


@router.post("")
def start_import(
    body: RunImportStartIn, request: Request, db: Db, user: CurrentUser, workspace: CliWorkspace
) -> RunImportView:
    """Start, or resume, an import; the official layout is accepted as well as ours."""
    try:
        ours = RunImportCreate.model_validate(
            {
                "schema_version": body.schema_version,
                "local_run_id": body.local_run_id,
                "manifest_digest": body.manifest_digest,
                "run": body.run,
                "files": body.files,
                "reimport": body.reimport,
            }
        )
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        raise ValidationFailed(f"{where}: {first['msg']}", details={"field": where}) from None
    session = run_upload.start_import(
        db,
        settings=_settings(request),
        workspace=workspace,
        user=user,
        body=ours,
        provenance=body.provenance,
        schema_versions=body.schema_versions,
    )
    return _view(session, request)


@router.post("/{session}/uploads")
def upload_urls(
    session: str, body: RunImportUploadsIn, request: Request, db: Db, user: CurrentUser
) -> RunImportUploads:
    """A capability `PUT` URL for each of `paths` not uploaded yet, size and sha256 echoed."""
    signer: CapabilitySigner = request.app.state.capability_signer
    pending = run_upload.pending_files(
        db, settings=_settings(request), user=user, session_id=session, paths=body.paths
    )
    now = time.time()
    return RunImportUploads(
        files=[
            RunImportUpload(
                path=file.path,
                size=file.size,
                sha256=file.sha256,
                upload=UploadInstructions(
                    presigned_url=signer.url(
                        str(request.base_url),
                        method="PUT",
                        purpose=RUN_IMPORT,
                        object_id=f"{session}/{file.path}",
                        now=now,
                    ),
                    expires_in=TTL_S,
                ),
            )
            for file in pending
        ]
    )


@router.post("/{session}/uploads/complete")
def upload_complete(
    session: str, body: RunImportUploadCompleteIn, request: Request, db: Db, user: CurrentUser
) -> dict[str, str]:
    """Nothing to assemble for a simple upload; says where the file stands."""
    state = run_upload.session_of(db, settings=_settings(request), user=user, session_id=session)
    found = next((f for f in state.files if f.path == body.path), None)
    if found is None:
        raise ValidationFailed(
            f"{body.path!r} was not declared when the upload started",
            details={"path": body.path, "session_id": session},
        )
    return {"path": found.path, "state": found.state}


@router.post("/{session}/finalize")
def finalize(session: str, request: Request, db: Db, user: CurrentUser) -> RunImportView:
    """Check the complete run, convert an official layout, compute its metrics, store it."""
    done = run_upload.finalize_import(
        db, settings=_settings(request), user=user, session_id=session
    )
    return _view(done, request)


async def receive(settings: Settings, object_id: str, request: Request) -> dict[str, object]:
    """The capability URL's target: one declared file's bytes (`<session id>/<path>`)."""
    session, _, path = object_id.partition("/")

    async def chunks() -> AsyncIterator[bytes]:
        try:
            async for chunk in request.stream():
                yield chunk
        except ClientDisconnect:
            raise ValidationFailed(f"the upload of {path} was interrupted") from None

    stored = await run_upload.receive_signed_file(
        settings, session_id=session, path=path, chunks=chunks()
    )
    return {"path": stored.path, "size": stored.size, "state": stored.state}
