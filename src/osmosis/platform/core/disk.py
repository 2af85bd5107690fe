"""Free space on the disk that holds the platform's home, and whether it is too low to run.

Standard library only: `osmosis server status` reads it without importing the server.

    space = disk_space(settings.home, min_free_bytes=settings.min_free_disk_bytes)
    if space.low: ...  # the scheduler starts no worker; health and status say so
"""

from __future__ import annotations

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
