"""The platform's stored content: content-addressed blobs (datasets) and run directories.

A blob is written through a `BlobWriter`: bytes go to a temporary file in the destination
directory, and `commit` checks size and hash, fsyncs, and renames it into place. The rename is
atomic, so a blob path either does not exist or holds the complete, verified content; a crash
or an abandoned upload leaves only a temporary file, which `remove_partials` sweeps.

    store = open_store(settings)                       # local, or shared by several machines
    writer = store.writer("datasets", extension="jsonl")
    writer.write(b'{"user_prompt": ...}\\n')
    path = writer.commit(size=expected_size, sha256=expected_sha)  # datasets/<sha>.jsonl
    store.run_dir(run_id)                              # the run's journal, outputs and logs

A run's directory is an ordinary local run directory (`osmosis.eval.host.run_dir`): the worker's
engine writes its journal, trajectories, artifacts and logs into it as each attempt is
recorded, every API process serves the run from it, and a worker that takes over a run whose
worker died resumes from its journal. So everything a run has written is in the store, none of
it on the disk of the worker that wrote it.

Two kinds, one interface: `BlobStore` is a directory on this machine (default `<home>/blobs`,
runs in `<home>/runs`); `SharedBlobStore` is a directory several machines mount at the same
path (`OSMOSIS_BLOB_DIR` + `OSMOSIS_BLOB_SHARED`). The shared one is never created (a missing
mount must not become an empty store that nobody else sees), and it sweeps only partials old
enough that no other machine can still be writing them. Every store carries a marker with its
id, and the database remembers the id it was used with (`check_identity`): a process started
with another directory (a forgotten setting, an unmounted share) is refused before it serves
or runs anything. An object store would fit behind the same interface only with a step that
publishes a worker's local run directory; both kinds here are file systems, which the engine
writes directly.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import socket
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sqlalchemy.orm import Session, sessionmaker

    from osmosis.platform.core.settings import Settings

_PARTIAL_PREFIX = ".partial-"
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_WORD = re.compile(r"^[a-z0-9]+$")
_RUN_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
MARKER = ".osmosis-store.json"
META_KEY = "blob_store_id"
# A partial in a shared store may be another machine's upload in progress: only one that has
# not been written to for this long is abandoned (an upload writes every few seconds).
STALE_PARTIAL_SEC = 3600.0


class BlobMismatch(ValueError):
    """The written bytes are not what was declared (size or SHA-256); nothing was stored."""


class BlobStoreError(RuntimeError):
    """The blob store cannot be used: missing, not a directory, or not this platform's."""


@dataclass(frozen=True)
class StoreCheck:
    """Whether the store answered a write, a read and a delete just now."""

    ok: bool
    latency_ms: float
    error: str | None = None


class BlobStore:
    """Blobs under `root/<namespace>/<sha256>.<extension>`, runs under `runs_root/<id>/`."""

    shared = False

    def __init__(self, root: Path, *, runs_root: Path | None = None) -> None:
        self.root = root
        self.runs_root = runs_root if runs_root is not None else root / "runs"

    @property
    def mode(self) -> str:
        return "shared" if self.shared else "local"

    # -- set-up ---------------------------------------------------------------------------------
    def prepare(self) -> None:
        """Create the store's directories (owner-only)."""
        for directory in (self.root, self.runs_root):
            directory.mkdir(mode=0o700, parents=True, exist_ok=True)

    def check(self) -> StoreCheck:
        """Write, read back and delete a small probe file: what `/api/health` reports."""
        started = time.monotonic()
        probe = self.root / f"{_PARTIAL_PREFIX}probe-{socket.gethostname()}-{uuid.uuid4().hex}"
        try:
            fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                os.write(fd, b"ok")
            finally:
                os.close(fd)
            if probe.read_bytes() != b"ok":
                raise OSError(f"{probe} read back other bytes than were written")
            probe.unlink()
            if self.runs_root.exists() and not self.runs_root.is_dir():
                raise OSError(f"{self.runs_root} is not a directory")
        except OSError as error:
            with contextlib.suppress(OSError):
                probe.unlink()
            return StoreCheck(False, _ms_since(started), f"{self.root}: {error}")
        return StoreCheck(True, _ms_since(started))

    # -- blobs ----------------------------------------------------------------------------------
    def path(self, namespace: str, *, sha256: str, extension: str) -> Path:
        """Where the blob with this hash lives (whether or not it exists yet)."""
        # Both parts come from validated records, but a path is built from them: check anyway.
        if not _SHA256.match(sha256) or not _WORD.match(extension) or not _WORD.match(namespace):
            raise ValueError(f"not a blob key: {namespace}/{sha256}.{extension}")
        return self.root / namespace / f"{sha256}.{extension}"

    def writer(self, namespace: str, *, extension: str) -> BlobWriter:
        directory = self.root / namespace
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        return BlobWriter(self, namespace, extension)

    def remove_partials(self, namespace: str) -> int:
        """Delete temporary files left by writes that never committed; returns how many."""
        directory = self.root / namespace
        removed = 0
        for partial in directory.glob(f"{_PARTIAL_PREFIX}*") if directory.is_dir() else ():
            if self._abandoned(partial):
                partial.unlink(missing_ok=True)
                removed += 1
        return removed

    def _abandoned(self, partial: Path) -> bool:
        return True  # only this machine writes here, and the caller knows none is in progress

    # -- runs -----------------------------------------------------------------------------------
    def run_dir(self, run_id: str) -> Path:
        """The directory of run `run_id` (a plain name: never a path): journal, outputs, logs."""
        if not _RUN_ID.match(run_id):
            raise ValueError(f"not a run id: {run_id[:64]!r}")
        return self.runs_root / run_id

    def describe(self) -> dict[str, str]:
        return {"mode": self.mode, "root": str(self.root), "runs": str(self.runs_root)}


class SharedBlobStore(BlobStore):
    """A blob directory several machines mount at the same path."""

    shared = True

    def prepare(self) -> None:
        """Check the mount is there (never create it), then create what lives inside."""
        if not self.root.is_dir():
            raise BlobStoreError(
                f"the shared blob directory {self.root} does not exist or is not a directory: "
                "mount it (every machine of the platform mounts it at this path), or unset "
                "OSMOSIS_BLOB_SHARED for a store on this machine only"
            )
        self.runs_root.mkdir(mode=0o700, exist_ok=True)

    def _abandoned(self, partial: Path) -> bool:
        try:
            return time.time() - partial.stat().st_mtime > STALE_PARTIAL_SEC
        except OSError:
            return False  # gone already: committed or swept by another machine


def open_store(settings: Settings) -> BlobStore:
    """The store `settings` name: `<home>/blobs` (+ `<home>/runs`) by default,
    `OSMOSIS_BLOB_DIR` (runs in its `runs/`) when set, shared with `OSMOSIS_BLOB_SHARED`."""
    kind = SharedBlobStore if settings.blob_shared else BlobStore
    return kind(settings.blob_dir, runs_root=settings.runs_dir)


# -- identity -------------------------------------------------------------------------------------
def check_identity(store: BlobStore, sessions: sessionmaker[Session]) -> str:
    """The store's id, agreed with the database's: the first process of a platform writes
    both; every later one must find the same id in its directory and in the database.

    `BlobStoreError` naming both when they differ (this process has another directory than
    the ones before it), or when the database has an id and the directory has no marker.
    """
    from sqlalchemy.exc import IntegrityError

    from osmosis.platform.core.db.process_models import PlatformMeta

    marker = _read_marker(store)
    with sessions() as db:
        row = db.get(PlatformMeta, META_KEY)
        recorded = row.value if row is not None else None
        if recorded is None:
            marker = marker or _write_marker(store)
            db.add(PlatformMeta(key=META_KEY, value=marker))
            try:
                db.commit()
            except IntegrityError:  # another process recorded one at the same moment
                db.rollback()
                recorded = db.get(PlatformMeta, META_KEY).value  # type: ignore[union-attr]
            else:
                return marker
    if marker is not None and marker == recorded:
        return marker
    found = f"the store id {marker}" if marker else f"no {MARKER}"
    raise BlobStoreError(
        f"the blob directory {store.root} is not the one this database was used with: it has "
        f"{found}, the database's runs and datasets are in the store with id {recorded}. "
        "Every process of one platform must use the same blob directory: set OSMOSIS_BLOB_DIR "
        "(and OSMOSIS_BLOB_SHARED=1 for a network mount) as the other processes do; moving a "
        f"store means moving its {MARKER} with it"
    )


def _read_marker(store: BlobStore) -> str | None:
    try:
        data = json.loads((store.root / MARKER).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as error:
        raise BlobStoreError(f"cannot read {store.root / MARKER}: {error}") from None
    value = data.get("id") if isinstance(data, dict) else None
    if not isinstance(value, str) or not value:
        raise BlobStoreError(f"{store.root / MARKER} holds no store id")
    return value


def _write_marker(store: BlobStore) -> str:
    """A new id in the marker; when another process wrote one first, that one."""
    store_id = uuid.uuid4().hex
    record = {"id": store_id, "created_at": datetime.now(UTC).isoformat()}
    path = store.root / MARKER
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        found = _read_marker(store)
        assert found is not None
        return found
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(json.dumps(record) + "\n")
        handle.flush()
        os.fsync(handle.fileno())
    _fsync_dir(store.root)
    return store_id


# -- writing --------------------------------------------------------------------------------------
class BlobWriter:
    """One blob being written. Not thread-safe; use from one task at a time."""

    def __init__(self, store: BlobStore, namespace: str, extension: str) -> None:
        self.store = store
        self.namespace = namespace
        self.extension = extension
        self.size = 0
        self._digest = hashlib.sha256()
        # Same directory as the destination: the final rename never crosses file systems.
        self.temp_path = store.root / namespace / f"{_PARTIAL_PREFIX}{uuid.uuid4().hex}"
        # Owner-only whatever the umask: dataset rows are the workspace's, nobody else's.
        fd = os.open(self.temp_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        self._file = os.fdopen(fd, "wb")

    @property
    def sha256(self) -> str:
        return self._digest.hexdigest()

    def write(self, chunk: bytes) -> None:
        self._file.write(chunk)
        self._digest.update(chunk)
        self.size += len(chunk)

    def commit(self, *, size: int, sha256: str) -> Path:
        """Verify and move the bytes into place; `BlobMismatch` (and nothing stored) otherwise.

        Content already stored under this hash is kept as it is: the same bytes are stored once.
        """
        try:
            if self.size != size:
                raise BlobMismatch(f"received {self.size:,} bytes, expected {size:,}")
            if self.sha256 != sha256.lower():
                raise BlobMismatch(
                    f"the content's SHA-256 is {self.sha256}, expected {sha256.lower()}"
                )
            self._file.flush()
            os.fsync(self._file.fileno())
            self._file.close()
            target = self.store.path(self.namespace, sha256=self.sha256, extension=self.extension)
            os.replace(self.temp_path, target)
            _fsync_dir(target.parent)
            return target
        finally:
            self.discard()

    def discard(self) -> None:
        """Drop the temporary file (after a failure, or after `commit` moved it)."""
        if not self._file.closed:
            self._file.close()
        self.temp_path.unlink(missing_ok=True)


def _fsync_dir(directory: Path) -> None:
    """Make a rename durable: the directory entry must reach the disk too (POSIX)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # pragma: no cover - e.g. platforms that cannot open directories
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover
        pass
    finally:
        os.close(fd)


def _ms_since(started: float) -> float:
    return round((time.monotonic() - started) * 1000, 3)
