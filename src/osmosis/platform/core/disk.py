"""Free space on the disk that holds the platform's home, and whether it is too low to run.

Standard library only: `osmosis server status` reads it without importing the server.

    space = disk_space(settings.home, min_free_bytes=settings.min_free_disk_bytes)
    if space.low: ...  # the scheduler starts no worker; health and status say so
"""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass
from pathlib import Path

from osmosis.vocabulary import format_bytes


@dataclass(frozen=True)
class DiskSpace:
    """The file system of one path: bytes free (for this user), in total, and the floor."""

    free_bytes: int
    total_bytes: int
    min_free_bytes: int

    @property
    def low(self) -> bool:
        return self.free_bytes < self.min_free_bytes

    def describe(self, path: Path) -> str:
        """One line for logs and run errors: where, how much is free, and the floor."""
        return (
            f"the disk holding {path} has {format_bytes(self.free_bytes)} free, below the "
            f"{format_bytes(self.min_free_bytes)} of OSMOSIS_MIN_FREE_DISK_BYTES"
            if self.low
            else f"the disk holding {path} has {format_bytes(self.free_bytes)} free"
        )


def disk_space(path: Path, *, min_free_bytes: int) -> DiskSpace:
    """`statvfs` of `path` (or of its nearest existing parent, before the home exists)."""
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    stat = os.statvfs(probe)
    # f_bavail, not f_bfree: blocks reserved for root are not ours to count on.
    return DiskSpace(
        free_bytes=stat.f_bavail * stat.f_frsize,
        total_bytes=stat.f_blocks * stat.f_frsize,
        min_free_bytes=min_free_bytes,
    )


# SQLite's result code for "database or disk is full", and PostgreSQL's SQLSTATE `disk_full`.
_SQLITE_FULL = 13
_PG_DISK_FULL = "53100"
_NO_SPACE = frozenset({errno.ENOSPC, errno.EDQUOT})


def disk_full_reason(error: BaseException) -> str | None:
    """What said the disk is full, in the refuser's own words, or None for any other error.

    Looks through the error, the driver error SQLAlchemy wraps (`.orig`) and their causes:
    an `OSError` ENOSPC or EDQUOT (a blob or a log), SQLite's SQLITE_FULL ("database or disk
    is full"), PostgreSQL's `DiskFull` (SQLSTATE 53100). Nothing is imported to check.

        disk_full_reason(OSError(errno.ENOSPC, "No space left on device"))  # 'No space ...'
    """
    seen: set[int] = set()
    pending: list[BaseException | None] = [error]
    while pending:
        found = pending.pop()
        if found is None or id(found) in seen:
            continue
        seen.add(id(found))
        if isinstance(found, OSError) and found.errno in _NO_SPACE:
            return found.strerror or str(found)
        if getattr(found, "sqlite_errorcode", None) == _SQLITE_FULL:
            return str(found)
        if getattr(found, "sqlstate", None) == _PG_DISK_FULL:
            return str(found).splitlines()[0] if str(found) else "disk full"
        orig = getattr(found, "orig", None)
        pending.extend(
            [orig if isinstance(orig, BaseException) else None, found.__cause__, found.__context__]
        )
    return None
