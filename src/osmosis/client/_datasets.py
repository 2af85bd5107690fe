"""`client.datasets`: a workspace's datasets, streamed up and down (`/api/datasets`).

`git` is the workspace identity; `name` a dataset name (its file's stem).

    info = validate_dataset(path)
    client.datasets.upload(git="o/r", path=path, size=info.size, sha256=info.sha256)
    client.datasets.download(git="o/r", name="qa", dest=Path("qa.jsonl"))
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx

from osmosis.client._base import (
    FileChanged,
    PlatformAPIError,
    Resource,
    api_error,
    changed_while_uploading,
    file_chunks,
    git_header,
)
from osmosis.vocabulary import MAX_PAGE
from osmosis.wire.datasets import (
    SHA256_HEADER,
    DatasetList,
    DatasetLogList,
    DatasetPreview,
    DatasetPublic,
    name_problem,
)


class Datasets(Resource):
    """Upload, list, inspect and download datasets."""

    def upload(
        self,
        *,
        git: str,
        path: Path,
        size: int,
        sha256: str,
        overwrite: bool = False,
        chunk_size: int = 1 << 20,
    ) -> DatasetPublic:
        """Stream the file at `path` as a new dataset (or, with `overwrite`, a new version).

        `size` and `sha256` are what was validated locally; the server refuses anything else,
        and exactly `size` bytes are sent, read from disk a chunk at a time.
        """
        params = {
            "file_name": path.name,
            "size": size,
            "sha256": sha256,
            "overwrite": "true" if overwrite else "false",
        }
        headers = {
            **git_header(git),
            "Content-Type": "application/octet-stream",
            "Content-Length": str(size),  # a declared length, not chunked: the server checks it
        }
        try:
            return self._transport.call(
                "POST",
                "/api/datasets",
                DatasetPublic,
                params=params,
                headers=headers,
                content=file_chunks(path, size, chunk_size),
                # The server answers after validating the whole file, which can take minutes.
                timeout=self._transport.read_timeout(3600.0),
            )
        except FileChanged as error:
            raise changed_while_uploading(path, error) from None

    def list(self, *, git: str, limit: int = MAX_PAGE, offset: int = 0) -> DatasetList:
        params = {"limit": limit, "offset": offset}
        return self._transport.call(
            "GET", "/api/datasets", DatasetList, params=params, headers=git_header(git)
        )

    def get(self, *, git: str, name: str, version: int | None = None) -> DatasetPublic:
        """The dataset's newest version, or `version`."""
        params = {"version": version} if version else None
        return self._transport.call(
            "GET", _dataset_path(name), DatasetPublic, params=params, headers=git_header(git)
        )

    def preview(
        self, *, git: str, name: str, rows: int = 5, version: int | None = None
    ) -> DatasetPreview:
        params: dict[str, Any] = {"rows": rows}
        if version:
            params["version"] = version
        path = _dataset_path(name, "preview")
        return self._transport.call(
            "GET", path, DatasetPreview, params=params, headers=git_header(git)
        )

    def logs(
        self, *, git: str, name: str, limit: int = 200, cursor: str | None = None
    ) -> DatasetLogList:
        """Processing logs, oldest first; pass `next_cursor` back to read on (None at the end)."""
        params: dict[str, Any] = {"limit": limit}
        if cursor:
            params["cursor"] = cursor
        path = _dataset_path(name, "logs")
        return self._transport.call(
            "GET", path, DatasetLogList, params=params, headers=git_header(git)
        )

    def download(self, *, git: str, name: str, dest: Path, version: int | None = None) -> int:
        """Stream a dataset's file to `dest`; returns its size.

        The bytes go to `<dest>.partial`, are checked against the size and SHA-256 the server
        declares, and only then renamed to `dest`: `dest` is never left half-written.
        """
        url_path = _dataset_path(name, "download")
        partial = dest.with_name(dest.name + ".partial")
        digest = hashlib.sha256()
        written = 0
        try:
            with self._transport.http.stream(
                "GET",
                url_path,
                params={"version": version} if version else None,
                headers=git_header(git),
            ) as response:
                if response.is_error:
                    response.read()
                    raise api_error(response)
                expected_sha = response.headers.get(SHA256_HEADER, "")
                expected_size = int(response.headers.get("content-length", "-1"))
                with partial.open("wb") as handle:
                    for chunk in response.iter_bytes():
                        handle.write(chunk)
                        digest.update(chunk)
                        written += len(chunk)
                    handle.flush()
                    os.fsync(handle.fileno())
            if written != expected_size or digest.hexdigest() != expected_sha:
                raise PlatformAPIError(
                    f"the download of dataset {name} is corrupt: got {written:,} bytes with "
                    f"sha256 {digest.hexdigest()}, expected {expected_size:,} bytes with "
                    f"sha256 {expected_sha or '(not sent)'}",
                    code="PLATFORM_ERROR",
                    details={"name": name},
                )
            os.replace(partial, dest)
        except httpx.HTTPError as error:
            raise self._transport.unreachable(error, url_path) from None
        finally:
            partial.unlink(missing_ok=True)
        return written


def _dataset_path(name: str, *parts: str) -> str:
    # Checked here too: a name such as ".." would otherwise change which URL is requested.
    problem = name_problem(name)
    if problem is not None:
        raise PlatformAPIError(problem, code="VALIDATION", details={"name": name})
    return "/".join(["/api/datasets", quote(name, safe=""), *parts])
