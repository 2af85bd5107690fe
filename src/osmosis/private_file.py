"""Owner-only files and directories: secrets written atomically, a private home, tightening.

Standard library only: the CLI uses this too, and must not import the server to do so.

    write_private_json(Path("~/.osmosis/credentials.json").expanduser(), {"token": "osm_..."})
    make_private_dir(settings.home)           # 0700, whatever the umask
    os.umask(PRIVATE_UMASK)                   # the server: everything it and its children write
    tightened = tighten_home(settings.home)   # a home from before: group/other bits removed
"""

from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# The server process sets this umask at start, so its files (the database and its WAL, blobs,
# run directories, logs) and those of the workers, git and rollout servers it starts are
# owner-only even when the user's umask is 022.
PRIVATE_UMASK = 0o077
# A home tightened once (or created by a version that keeps it private) is marked, so later
# starts need not walk every trajectory again; the home and its top level are checked always.
_MARKER = ".private"


def write_private_json(path: Path, data: dict[str, Any]) -> None:
    """Atomically replace `path` with `data`, readable by the owner only (mode 0600).

    The temporary file is created 0600, so the secret is never readable by others, not even
    for an instant.
    """
    write_private_text(path, json.dumps(data, indent=2) + "\n")


def write_private_text(path: Path, text: str) -> None:
    """Atomically replace `path` with `text`, mode 0600."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.chmod(tmp, 0o600)  # O_CREAT's mode only applies to new files
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def open_private_append(path: Path) -> int:
    """A descriptor appending to `path`, which is created 0600 if new (for log files)."""
    return os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)


def make_private_dir(path: Path) -> None:
    """Create `path` (and missing parents) with the last component 0700."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)


@dataclass
class Tightened:
    """What `tighten_home` changed: how many entries, and the first few (relative paths)."""

    count: int = 0
    examples: list[str] = field(default_factory=list)


def tighten_home(home: Path) -> Tightened:
    """Remove group and other permissions from the home and everything in it (symlinks and
    hard-linked files are left alone). The full walk runs once per home; later calls check
    the home and its top-level entries only."""
    changed = Tightened()
    if not home.is_dir():
        return changed
    _tighten(home, home, changed)
    marker = home / _MARKER
    if marker.exists():
        with os.scandir(home) as entries:
            for entry in entries:
                _tighten(Path(entry.path), home, changed)
        return changed
    for root, dirs, files in os.walk(home):
        for name in (*dirs, *files):
            _tighten(Path(root) / name, home, changed)
    write_private_text(marker, "the modes of this home were checked; see osmosis private_file\n")
    return changed


def _tighten(path: Path, home: Path, changed: Tightened) -> None:
    try:
        info = path.lstat()
    except OSError:
        return
    mode = info.st_mode
    # Files and directories only: a symlink's target may lie outside the home, and so may
    # another name of a hard-linked file (a local git origin's objects). This runs at start,
    # before any worker, so nothing swaps an entry between the lstat and the chmod.
    shared = stat.S_ISREG(mode) and info.st_nlink > 1
    if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)) or shared or not mode & 0o077:
        return
    try:
        os.chmod(path, stat.S_IMODE(mode) & 0o700)
    except OSError:
        return
    changed.count += 1
    if len(changed.examples) < 5:
        changed.examples.append(str(path.relative_to(home)) if path != home else ".")
