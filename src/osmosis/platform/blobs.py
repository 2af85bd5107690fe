"""Content-addressed blob storage on local disk: each content stored once, by its SHA-256.

A blob is written through a `BlobWriter`: bytes go to a temporary file in the destination
directory, and `commit` checks size and hash, fsyncs, and renames it into place. The rename is
atomic, so a blob path either does not exist or holds the complete, verified content; a crash
or an abandoned upload leaves only a temporary file, which `remove_partials` sweeps.

    store = BlobStore(settings.blob_dir)
    writer = store.writer("datasets", extension="jsonl")
    writer.write(b'{"user_prompt": ...}\\n')
    path = writer.commit(size=expected_size, sha256=expected_sha)  # blobs/datasets/<sha>.jsonl
"""

from __future__ import annotations

import hashlib
import os
import re
import uuid
from pathlib import Path

_PARTIAL_PREFIX = ".partial-"
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_WORD = re.compile(r"^[a-z0-9]+$")


class BlobMismatch(ValueError):
    """The written bytes are not what was declared (size or SHA-256); nothing was stored."""


class BlobStore:
    """Blobs under `root/<namespace>/<sha256>.<extension>`."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def path(self, namespace: str, *, sha256: str, extension: str) -> Path:
        """Where the blob with this hash lives (whether or not it exists yet)."""
        # Both parts come from validated records, but a path is built from them: check anyway.
        if not _SHA256.match(sha256) or not _WORD.match(extension) or not _WORD.match(namespace):
            raise ValueError(f"not a blob key: {namespace}/{sha256}.{extension}")
        return self.root / namespace / f"{sha256}.{extension}"

    def writer(self, namespace: str, *, extension: str) -> BlobWriter:
        directory = self.root / namespace
        directory.mkdir(parents=True, exist_ok=True)
        return BlobWriter(self, namespace, extension)

    def remove_partials(self, namespace: str) -> int:
        """Delete temporary files left by writes that never committed; returns how many."""
        directory = self.root / namespace
        removed = 0
        for partial in directory.glob(f"{_PARTIAL_PREFIX}*") if directory.is_dir() else ():
            partial.unlink(missing_ok=True)
            removed += 1
        return removed


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
        self._file = self.temp_path.open("xb")

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
