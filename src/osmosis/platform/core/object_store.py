"""Runs and migrations on an object store (`OSMOSIS_BLOB_URL=s3://bucket/prefix`): the
store itself is `blobs.ObjectBlobStore`; here are its `RunPublisher` and the copy of a
directory store into it (`osmosis server copy-store`).

What lives where:

    s3://bucket/prefix/.osmosis-store.json        the store's id (`blobs.check_identity`)
    s3://bucket/prefix/datasets/<sha256>.<ext>    dataset blobs, content-addressed
    s3://bucket/prefix/runs/<run id>/...          every run's files (journal, trajectories, ...)
    <blob dir>/datasets/...                       this machine's cache of the blobs it read
    <home>/runs/<run id>/...                      this machine's working copy / cache of runs

The engine still writes a running run to the worker's local disk (the journal is fsynced
there). A `RunPublisher` uploads what changed (size or mtime) as the run goes (attempts'
files in batches: one tar object per pass), and everything at the end; in each pass the
journal is read first and uploaded last, so every attempt the store's journal holds has its
trajectory and artifacts in the store already. A worker taking a run over first downloads
the store's copy (`ObjectBlobStore.sync_run`), and the engine resumes from its journal, so
every attempt is recorded once. API processes materialise a run's files into their runs
directory on demand (`sync_run` again), so every reader keeps reading paths.

The client is `obstore` (object_store, the Rust crate behind DataFusion and Delta, through
thin bindings): one small wheel with no Python dependencies, sync and async calls that
release the GIL, conditional puts (`mode="create"`, the marker) and presigned URLs.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from osmosis.platform.core.blobs import (
    _PARTIAL_PREFIX,
    BATCHED,
    BATCHES,
    JOURNAL,
    PUBLISHED,
    BlobStore,
    BlobStoreError,
    ObjectBlobStore,
)

# Scratch of attempts in flight, written by the rollout server: never part of the run's record.
_SCRATCH_DIRS = ("rollout_trials",)
DATASETS = "datasets"  # the namespace of dataset blobs (`services.datasets.NAMESPACE`)
_UPLOADS_AT_ONCE = 8
# Attempts' files up to this size travel in batches (`blobs.BATCHES`) of at most _BATCH_BYTES:
# one request per pass instead of one per file. Larger artifacts are objects of their own.
_BATCH_FILE = 1024 * 1024
_BATCH_BYTES = 32 * 1024 * 1024


@dataclass(frozen=True)
class CopyReport:
    """What `copy_directory_store` did."""

    copied: int
    skipped: int
    bytes: int


class RunPublisher:
    """Uploads a run directory's changed files to the store: `publish()` as often as wanted."""

    def __init__(self, store: ObjectBlobStore, run_id: str) -> None:
        self.store = store
        self.run_id = run_id
        self.directory = store.run_dir(run_id)
        self.prefix = f"runs/{run_id}/"
        self._published: dict[str, tuple[int, int]] = {}
        self._journal_size = -1
        self._lock = threading.Lock()

    def adopt(self, held: dict[str, int]) -> None:
        """Files the store holds already as they are here (`sync_run`'s): not uploaded."""
        for relative, size in held.items():
            try:
                stat = (self.directory / relative).stat()
            except FileNotFoundError:
                continue
            if stat.st_size == size:
                if relative == JOURNAL:
                    self._journal_size = stat.st_size
                else:
                    self._published[relative] = (stat.st_size, stat.st_mtime_ns)

    def publish(self) -> int:
        """One pass: the journal is read first (complete lines) and uploaded last, so every
        attempt it holds has its files in the store; returns how many objects were put."""
        import obstore

        with self._lock:  # the periodic pass and the final one never interleave
            journal = self._journal_snapshot()
            changed = list(self._changed())
            batched = [c for c in changed if c[0].startswith(BATCHED) and c[2][0] <= _BATCH_FILE]
            single = [c for c in changed if c not in batched]
            etags: dict[str, str | None] = {}
            for batch in _chunks(batched):
                key, batch_etag = self._put_batch(batch)
                etags[key] = batch_etag
            if single:
                with ThreadPoolExecutor(_UPLOADS_AT_ONCE) as pool:
                    for relative, etag in pool.map(self._put, single):
                        if etag is not None:
                            etags[relative] = etag
            if journal is not None and len(journal) != self._journal_size:
                result = obstore.put(self.store.remote, self.prefix + JOURNAL, journal)
                self._journal_size = len(journal)
                etags[JOURNAL] = result["e_tag"]
            if etags:
                self.store.remember_etags(self.run_id, etags)
                _stamp(self.store, self.run_id)
            return len(etags)

    def _journal_snapshot(self) -> bytes | None:
        try:
            data = (self.directory / JOURNAL).read_bytes()
        except FileNotFoundError:
            return None
        return data[: data.rfind(b"\n") + 1]  # a line being written waits for the next pass

    def _changed(self) -> Iterator[tuple[str, Path, tuple[int, int]]]:
        for path in _files(self.directory):
            relative = path.relative_to(self.directory).as_posix()
            if relative == JOURNAL:
                continue
            try:
                stat = path.stat()
            except FileNotFoundError:
                continue
            version = (stat.st_size, stat.st_mtime_ns)
            if self._published.get(relative) != version:
                yield relative, path, version

    def _put_batch(self, items: list[tuple[str, Path, tuple[int, int]]]) -> tuple[str, str]:
        """Files as one tar object under `batches/`; returns its key and ETag."""
        import io
        import tarfile

        import obstore

        buffer, sent = io.BytesIO(), []
        with tarfile.open(fileobj=buffer, mode="w") as tar:
            for relative, path, version in items:
                try:
                    data = path.read_bytes()
                except FileNotFoundError:
                    continue  # replaced meanwhile: the next pass takes the new one
                info = tarfile.TarInfo(relative)
                info.size, info.mtime = len(data), version[1] // 1_000_000_000
                tar.addfile(info, io.BytesIO(data))
                sent.append((relative, version))
        key = f"{BATCHES}{time.time_ns():020d}-{uuid.uuid4().hex[:8]}.tar"
        etag = obstore.put(self.store.remote, self.prefix + key, buffer.getvalue())["e_tag"]
        for relative, version in sent:
            self._published[relative] = version
        return key, str(etag)

    def _put(self, item: tuple[str, Path, tuple[int, int]]) -> tuple[str, str | None]:
        relative, path, version = item
        try:
            etag = self.store.upload(path, self.prefix + relative)
        except FileNotFoundError:
            return relative, None  # replaced meanwhile: the next pass takes the new one
        self._published[relative] = version
        return relative, etag


def _chunks(
    items: list[tuple[str, Path, tuple[int, int]]],
) -> Iterator[list[tuple[str, Path, tuple[int, int]]]]:
    """Batches of at most _BATCH_BYTES (by the files' sizes)."""
    batch: list[tuple[str, Path, tuple[int, int]]] = []
    size = 0
    for item in items:
        if batch and size + item[2][0] > _BATCH_BYTES:
            yield batch
            batch, size = [], 0
        batch.append(item)
        size += item[2][0]
    if batch:
        yield batch


def _stamp(store: ObjectBlobStore, run_id: str) -> None:
    """Say the run changed in the store (`blobs.PUBLISHED`): a new ETag every time."""
    import obstore

    stamp = json.dumps({"at": time.time(), "id": uuid.uuid4().hex}).encode()
    obstore.put(store.remote, f"runs/{run_id}/{PUBLISHED}", stamp)


def _files(directory: Path) -> Iterator[Path]:
    """Every regular file of a run directory but scratch and temporary files."""
    for root, dirs, names in os.walk(directory):
        if Path(root) == directory:
            dirs[:] = [d for d in dirs if d not in _SCRATCH_DIRS]
        for name in names:
            if name.startswith(_PARTIAL_PREFIX) or name.endswith((".partial", ".tmp")):
                continue
            yield Path(root) / name


# -- migration ------------------------------------------------------------------------------------
def copy_directory_store(
    source: BlobStore,
    target: ObjectBlobStore,
    *,
    progress: Callable[[str, int, int], None] = lambda key, done, total: None,
) -> CopyReport:
    """Copy a directory store (dataset blobs, run directories, its marker) into an object
    store. Idempotent: an object already there with the same size and MD5 (its ETag) is
    skipped. Each put is verified the same way. The marker goes last, so a copy cut short
    is never mistaken for a finished one by `check_identity`."""
    import obstore

    store_id = source.read_marker()
    existing = target.read_marker()
    if store_id is not None and existing is not None and existing != store_id:
        raise BlobStoreError(
            f"{target.url} holds another store (id {existing}) than {source.root} "
            f"(id {store_id}): copy into an empty prefix"
        )
    files = list(_store_files(source))
    copied = skipped = sent = 0
    for done, (key, path) in enumerate(files, start=1):
        data = path.read_bytes()
        md5 = hashlib.md5(data, usedforsecurity=False).hexdigest()
        try:
            meta = obstore.head(target.remote, key)
        except FileNotFoundError:  # obstore's NotFoundError
            meta = None
        if meta is not None and meta["size"] == len(data) and _etag(meta) == md5:
            skipped += 1
        else:
            obstore.put(target.remote, key, data, use_multipart=False)
            meta = obstore.head(target.remote, key)
            if meta["size"] != len(data) or _etag(meta) not in (md5, None):
                raise BlobStoreError(
                    f"{target.url}/{key} holds {meta['size']} bytes (ETag {meta['e_tag']}) "
                    f"after the copy, not the {len(data)} bytes (MD5 {md5}) of {path}"
                )
            copied += 1
            sent += len(data)
        progress(key, done, len(files))
    for run_id in sorted({key.split("/")[1] for key, _ in files if key.startswith("runs/")}):
        _stamp(target, run_id)  # readers that cached the run before look again
    if store_id is not None and existing is None:
        target.write_marker(store_id)
    return CopyReport(copied=copied, skipped=skipped, bytes=sent)


def _store_files(source: BlobStore) -> Iterator[tuple[str, Path]]:
    """(key, path) of every file a directory store holds for the platform."""
    blobs = source.root / DATASETS
    if blobs.is_dir():
        for path in sorted(blobs.iterdir()):
            if path.is_file() and not path.name.startswith(_PARTIAL_PREFIX):
                yield f"{DATASETS}/{path.name}", path
    if source.runs_root.is_dir():
        for run in sorted(source.runs_root.iterdir()):
            if not run.is_dir() or run.name.startswith(".") or "." in run.name:
                continue  # `.locks`, `<id>.archive-<stamp>`
            for path in sorted(_files(run)):
                yield f"runs/{run.name}/{path.relative_to(run).as_posix()}", path


def _etag(meta: Any) -> str | None:
    """The ETag as an MD5, or None for a multipart upload's (which is no MD5)."""
    tag = str(meta.get("e_tag") or "").strip('"')
    return None if not tag or "-" in tag else tag
