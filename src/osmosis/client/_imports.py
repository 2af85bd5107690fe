"""`client.imports`: a finished local run uploaded as a platform run (`eval upload`).

The server answers `start` with the files it still needs, so an interrupted upload sends only
the rest when started again.

    session = client.imports.start(git="o/r", body=RunImportCreate(...))
    for item in pending: client.imports.upload_file(session.session_id, item.path, file, size=n)
    client.imports.finalize(session.session_id).eval_run_name
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import quote

from osmosis.client._base import (
    FileChanged,
    Resource,
    changed_while_uploading,
    file_chunks,
    git_header,
)
from osmosis.wire.runs import ImportFileState, RunImportCreate, RunImportSession


class RunImports(Resource):
    """Start, feed and finalize the upload of a local run."""

    def start(self, *, git: str, body: RunImportCreate) -> RunImportSession:
        """Start or resume the upload of a finished local run; send its `pending` files."""
        return self._transport.call(
            "POST",
            "/api/eval-runs/imports",
            RunImportSession,
            body=body,
            headers=git_header(git),
        )

    def upload_file(
        self, session_id: str, path: str, file: Path, *, size: int, chunk_size: int = 1 << 20
    ) -> ImportFileState:
        """Stream `file` as the declared `path` of the session (exactly `size` bytes)."""
        url_path = (
            f"/api/eval-runs/imports/{quote(session_id, safe='')}/files/{quote(path, safe='/')}"
        )
        headers = {"Content-Type": "application/octet-stream", "Content-Length": str(size)}
        try:
            return self._transport.call(
                "PUT",
                url_path,
                ImportFileState,
                headers=headers,
                content=file_chunks(file, size, chunk_size),
                timeout=self._transport.read_timeout(3600.0),
            )
        except FileChanged as error:
            raise changed_while_uploading(file, error) from None

    def finalize(self, session_id: str) -> RunImportSession:
        """Check the uploaded run on the server and store it as a finished run."""
        path = f"/api/eval-runs/imports/{quote(session_id, safe='')}/finalize"
        return self._transport.call(
            "POST", path, RunImportSession, timeout=self._transport.read_timeout(300.0)
        )
