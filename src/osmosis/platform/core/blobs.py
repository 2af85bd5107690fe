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
or runs anything. A third kind, `ObjectBlobStore` (`OSMOSIS_BLOB_URL`), keeps both in an
S3-compatible store: its directories are this machine's copies, which a worker publishes as
its run goes (`object_store.RunPublisher`) and an API process fills from the store on demand
(`sync_run`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

if TYPE_CHECKING:
    from obstore.store import S3Store
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
JOURNAL = "events.jsonl"
LOGS = "logs.txt"
# Rewritten after each publishing pass that put anything: a reader that finds its ETag
# unchanged has the run's files already, and lists nothing.
PUBLISHED = ".published"
# Attempts' files (many, small, written once) travel in batches: one tar object per
# publishing pass, `runs/<id>/batches/<time ns>-<random>.tar`, applied in key order.
BATCHES = "batches/"
BATCHED = ("trajectories/", "artifacts/")
_logger = logging.getLogger("osmosis.platform.core.blobs")
# Per run, the ETag of each object as this machine last put or fetched it: an object whose
# ETag differs was written by another machine since (clocks are never compared).
_SYNC_DIR = ".sync"


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

    @property
    def location(self) -> str:
        """Where the store is, as an operator names it (a directory, or an object store URL)."""
        return str(self.root)

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

    # -- identity -------------------------------------------------------------------------------
    def read_marker(self) -> str | None:
        """The store's id from its marker, or None when it has none yet."""
        return _read_marker(self)

    def write_marker(self, store_id: str | None = None) -> str:
        """Write the marker (a new id, or `store_id`); when another process wrote one first,
        that one's id."""
        return _write_marker(self, store_id)


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
    `OSMOSIS_BLOB_DIR` (runs in its `runs/`) when set, shared with `OSMOSIS_BLOB_SHARED`;
    an object store (`osmosis.platform.core.object_store`) with `OSMOSIS_BLOB_URL`."""
    if settings.blob_url is not None:
        return open_object_store(settings.blob_url, settings.blob_dir, runs_root=settings.runs_dir)
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

    marker = store.read_marker()
    with sessions() as db:
        row = db.get(PlatformMeta, META_KEY)
        recorded = row.value if row is not None else None
        if recorded is None:
            marker = marker or store.write_marker()
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
        f"the blob store {store.location} is not the one this database was used with: it has "
        f"{found}, the database's runs and datasets are in the store with id {recorded}. "
        "Every process of one platform must use the same blob store: set OSMOSIS_BLOB_DIR "
        "(and OSMOSIS_BLOB_SHARED=1 for a network mount) or OSMOSIS_BLOB_URL as the other "
        f"processes do; moving a store means moving its {MARKER} with it (`osmosis server "
        "copy-store` does, into an object store)"
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


def _write_marker(store: BlobStore, store_id: str | None = None) -> str:
    """A new id in the marker; when another process wrote one first, that one."""
    store_id = store_id or uuid.uuid4().hex
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


# -- an object store ------------------------------------------------------------------------------
def split_url(url: str) -> tuple[str, str]:
    """`s3://bucket/some/prefix` -> ("bucket", "some/prefix")."""
    if not url.startswith("s3://"):
        raise BlobStoreError(f"not an object store URL: {url!r}; expected s3://bucket[/prefix]")
    bucket, _, prefix = url.removeprefix("s3://").partition("/")
    if not bucket:
        raise BlobStoreError(f"{url!r} names no bucket; expected s3://bucket[/prefix]")
    return bucket, prefix.strip("/")


def connect(url: str) -> S3Store:
    """An obstore client for `url`, configured from the AWS variables (AWS_ENDPOINT_URL,
    AWS_REGION / AWS_DEFAULT_REGION, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY)."""
    from obstore.store import S3Store

    bucket, prefix = split_url(url)
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"
    # A plain-HTTP endpoint (MinIO or moto on a private network) must be allowed explicitly.
    options: Any = {"allow_http": True} if endpoint and endpoint.startswith("http://") else {}
    return S3Store(bucket, prefix=prefix or None, region=region, client_options=options)


_P = ParamSpec("_P")
_R = TypeVar("_R")
_OPERATION_OBSERVERS: list[Callable[[str, float], None]] = []


def observe_store_operations(callback: Callable[[str, float], None]) -> None:
    """Have `callback(operation, seconds)` told of every object-store request this process
    makes (`sync_run`, `refresh_run`, `download`, `upload`): the API's `/metrics`."""
    _OPERATION_OBSERVERS.append(callback)


def _timed(operation: str) -> Callable[[Callable[_P, _R]], Callable[_P, _R]]:
    def wrap(method: Callable[_P, _R]) -> Callable[_P, _R]:
        def timed(*args: _P.args, **kwargs: _P.kwargs) -> _R:
            started = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                elapsed = time.perf_counter() - started
                for observer in _OPERATION_OBSERVERS:
                    observer(operation, elapsed)

        timed.__doc__, timed.__name__ = method.__doc__, method.__name__
        return timed

    return wrap


class ObjectBlobStore(BlobStore):
    """Blobs and runs in an object store; `root` and `runs_root` are this machine's copies."""

    def __init__(
        self, url: str, root: Path, *, runs_root: Path, remote: S3Store | None = None
    ) -> None:
        super().__init__(root, runs_root=runs_root)
        self.url = url
        self.remote = remote if remote is not None else connect(url)
        self._seen: dict[str, str | None] = {}  # run id -> its PUBLISHED ETag at the last sync

    @property
    def mode(self) -> str:
        return "object"

    @property
    def location(self) -> str:
        return self.url

    def prepare(self) -> None:
        """The local cache directories, and a store that answers (a list of one page)."""
        super().prepare()
        import obstore

        try:
            next(iter(obstore.list(self.remote, "datasets/", chunk_size=1)), None)
        except Exception as error:
            raise BlobStoreError(
                f"the object store {self.url} cannot be read: {error}. Check OSMOSIS_BLOB_URL "
                "(s3://bucket/prefix), AWS_ENDPOINT_URL, AWS_REGION and the credentials "
                "(AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY)"
            ) from None

    def check(self) -> StoreCheck:
        import obstore

        started = time.monotonic()
        key = f".probes/{socket.gethostname()}-{uuid.uuid4().hex}"
        try:
            obstore.put(self.remote, key, b"ok")
            if bytes(obstore.get(self.remote, key).bytes()) != b"ok":
                raise OSError(f"{self.url}/{key} read back other bytes than were written")
            obstore.delete(self.remote, key)
        except Exception as error:
            return StoreCheck(False, _ms_since(started), f"{self.url}: {error}")
        return StoreCheck(True, _ms_since(started))

    def describe(self) -> dict[str, str]:
        return {"mode": self.mode, "url": self.url, "cache": str(self.root)}

    # -- the marker -----------------------------------------------------------------------------
    def read_marker(self) -> str | None:
        import obstore

        try:
            data = json.loads(bytes(obstore.get(self.remote, MARKER).bytes()))
        except FileNotFoundError:  # obstore's NotFoundError
            return None
        except Exception as error:
            raise BlobStoreError(f"cannot read {self.url}/{MARKER}: {error}") from None
        value = data.get("id") if isinstance(data, dict) else None
        if not isinstance(value, str) or not value:
            raise BlobStoreError(f"{self.url}/{MARKER} holds no store id")
        return value

    def write_marker(self, store_id: str | None = None) -> str:
        import obstore
        from obstore.exceptions import AlreadyExistsError

        store_id = store_id or uuid.uuid4().hex
        record = {"id": store_id, "created_at": datetime.now(UTC).isoformat()}
        try:  # a conditional put: of two processes starting at once, one id wins
            obstore.put(self.remote, MARKER, json.dumps(record).encode() + b"\n", mode="create")
        except AlreadyExistsError:
            found = self.read_marker()
            assert found is not None
            return found
        return store_id

    # -- blobs ----------------------------------------------------------------------------------
    def path(self, namespace: str, *, sha256: str, extension: str) -> Path:
        """The blob's cached copy on this machine, fetched from the store when missing (a
        blob missing from both is left missing: callers report it)."""
        local = super().path(namespace, sha256=sha256, extension=extension)
        if not local.exists():
            key = f"{namespace}/{sha256}.{extension}"
            with contextlib.suppress(FileNotFoundError):
                self._download(key, local)
        return local

    def writer(self, namespace: str, *, extension: str) -> BlobWriter:
        (self.root / namespace).mkdir(mode=0o700, parents=True, exist_ok=True)
        return _ObjectBlobWriter(self, namespace, extension)

    # -- runs -----------------------------------------------------------------------------------
    @_timed("sync_run")
    def sync_run(self, run_id: str, *, replace: bool = True) -> dict[str, int]:
        """Bring the store's copy of the run into `run_dir(run_id)`; returns the size of each
        file the store was found to hold (by path in the run directory).

        A file missing here is downloaded; with `replace`, also one another machine has put
        since this one last put or fetched it (never use it while an engine writes the
        directory). Batches not seen before are unpacked. `logs.txt` is merged: the store's
        lines, then lines only this machine has (its scheduler's)."""
        import obstore

        directory = self.run_dir(run_id)
        prefix = f"runs/{run_id}/"
        listing = [meta for page in obstore.list(self.remote, prefix) for meta in page]
        listing = [meta for meta in listing if meta["path"] != prefix + PUBLISHED]
        known = self.known_etags(run_id)
        fetched: dict[str, str | None] = {}
        held: dict[str, int] = {}
        for meta in sorted(listing, key=lambda meta: str(meta["path"])):
            relative = meta["path"].removeprefix(prefix)
            if ".." in relative.split("/"):
                continue  # never a path out of the run directory, whoever wrote the key
            local = directory / relative
            if relative.startswith(BATCHES):
                if known.get(relative) != meta["e_tag"]:
                    held.update(self._unpack(meta["path"], directory, replace=replace))
                    fetched[relative] = meta["e_tag"]
                continue
            held[relative] = meta["size"]
            if not local.exists():
                self._download(meta["path"], local)
            elif not replace or known.get(relative) == meta["e_tag"]:
                continue
            elif relative == LOGS:
                self._merge_logs(meta["path"], local)
            else:
                self._download(meta["path"], local)
            fetched[relative] = meta["e_tag"]
        if fetched:
            self.remember_etags(run_id, fetched)
        return held

    def _unpack(self, key: str, directory: Path, *, replace: bool) -> dict[str, int]:
        """A batch's files into the run directory (each atomically); their sizes."""
        import io
        import tarfile

        import obstore

        data = bytes(obstore.get(self.remote, key).bytes())
        held: dict[str, int] = {}
        with tarfile.open(fileobj=io.BytesIO(data)) as batch:
            for member in batch.getmembers():
                name = member.name
                # Only files of the batched directories, never a path out of the run.
                if not member.isfile() or not name.startswith(BATCHED) or ".." in name.split("/"):
                    continue
                held[name] = member.size
                local = directory / name
                if not replace and local.exists():
                    continue
                source = batch.extractfile(member)
                assert source is not None
                local.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
                partial = local.with_name(f"{_PARTIAL_PREFIX}{uuid.uuid4().hex}")
                try:
                    partial.write_bytes(source.read())
                    os.replace(partial, local)
                finally:
                    partial.unlink(missing_ok=True)
        return held

    @_timed("refresh_run")
    def refresh_run(self, run_id: str, *, replace: bool) -> None:
        """`sync_run` for a reader, when the run was published since this process last
        looked (one HEAD request otherwise). A store that cannot be reached leaves this
        machine's copy as it is (said in the log), so what is here is still served."""
        import obstore

        try:
            try:
                stamp = obstore.head(self.remote, f"runs/{run_id}/{PUBLISHED}")["e_tag"]
            except FileNotFoundError:  # not published by a worker (yet): always look
                stamp = None
            if stamp is not None and self._seen.get(run_id) == stamp:
                return
            self.sync_run(run_id, replace=replace)
            self._seen[run_id] = stamp
        except Exception as error:
            _logger.warning("run %s: serving this machine's copy, %s: %s", run_id, self.url, error)

    def known_etags(self, run_id: str) -> dict[str, str]:
        try:
            found = json.loads((self.runs_root / _SYNC_DIR / f"{run_id}.json").read_bytes())
        except (FileNotFoundError, ValueError):
            return {}
        return found if isinstance(found, dict) else {}

    def remember_etags(self, run_id: str, etags: dict[str, str | None]) -> None:
        path = self.runs_root / _SYNC_DIR / f"{run_id}.json"
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        merged = {**self.known_etags(run_id), **etags}
        partial = path.with_name(f"{_PARTIAL_PREFIX}{uuid.uuid4().hex}")
        partial.write_text(json.dumps(merged), encoding="utf-8")
        os.replace(partial, path)

    # -- transfers --------------------------------------------------------------------------------
    @_timed("download")
    def _download(self, key: str, local: Path) -> None:
        """The object at `key` into `local`, atomically (a temporary file renamed)."""
        import obstore

        local.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        partial = local.with_name(f"{_PARTIAL_PREFIX}{uuid.uuid4().hex}")
        try:
            result = obstore.get(self.remote, key)
        except FileNotFoundError:  # obstore's NotFoundError
            raise FileNotFoundError(f"{self.url}/{key}") from None
        try:
            with partial.open("wb") as handle:
                for chunk in result:
                    handle.write(chunk)
            os.replace(partial, local)
        finally:
            partial.unlink(missing_ok=True)

    def _merge_logs(self, key: str, local: Path) -> None:
        import obstore

        stored = bytes(obstore.get(self.remote, key).bytes()).splitlines(keepends=True)
        known = set(stored)
        here = local.read_bytes().splitlines(keepends=True)
        only_here = [line for line in here if line not in known]
        if stored + only_here == here:
            return  # this machine's copy holds the store's already
        partial = local.with_name(f"{_PARTIAL_PREFIX}{uuid.uuid4().hex}")
        partial.write_bytes(b"".join(stored + only_here))
        os.replace(partial, local)

    @_timed("upload")
    def upload(self, local: Path, key: str) -> str | None:
        """Put the file's bytes at `key`; returns the new object's ETag."""
        import obstore

        return obstore.put(self.remote, key, local.read_bytes())["e_tag"]


class _ObjectBlobWriter(BlobWriter):
    """A blob written to the local cache, verified, then put in the store under its hash."""

    def commit(self, *, size: int, sha256: str) -> Path:
        target = super().commit(size=size, sha256=sha256)
        store = self.store
        assert isinstance(store, ObjectBlobStore)
        key = f"{self.namespace}/{target.name}"
        try:
            store.upload(target, key)
        except Exception as error:
            # Not in the store: no other machine could read it, so it is not stored at all.
            target.unlink(missing_ok=True)
            raise BlobStoreError(f"cannot store {store.url}/{key}: {error}") from error
        return target


_OPEN: dict[tuple[str, Path, Path], ObjectBlobStore] = {}
_OPEN_LOCK = threading.Lock()


def open_object_store(url: str, root: Path, *, runs_root: Path) -> ObjectBlobStore:
    """One store (one client, one connection pool) per URL and directories in a process."""
    with _OPEN_LOCK:
        key = (url, root, runs_root)
        if key not in _OPEN:
            _OPEN[key] = ObjectBlobStore(url, root, runs_root=runs_root)
        return _OPEN[key]
