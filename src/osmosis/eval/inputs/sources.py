"""A rollout's sources: the one list of what is not source, and one digest over the rest.

    source_digest(Path("rollouts/multiply"))   # 'e3b0c442…': SHA-256 of paths and bytes
    source_files(Path("rollouts/multiply"))    # [.../main.py, .../pyproject.toml]

Three places need to know what a rollout's sources are, and all three ask here:

- a resume (`eval.host.plan`) refuses when the rollout's `source_digest` changed since the run
  began: the attempts recorded so far ran other code;
- the venv cache (`eval.sites.environment`) keys a project with dynamic dependencies by its
  sources, minus what a build writes (`also_exclude`): a build can read any file;
- the Ray site (`eval.sites.ray.ship`) ships the checkout to its nodes without what is not
  source (its own walk, which opens nothing through a link).

What is not source: `NOT_SOURCE_DIRS` (version control, osmosis's run state, virtual
environments, caches, installed node packages), any other directory holding a `pyvenv.cfg`
(a virtual environment under another name), and compiled bytecode (`COMPILED_SUFFIXES`).

Nothing is read through a link: a link counts by where it points (`source_bytes`), because the
repository is untrusted and a committed link to `/dev/zero` or to a key must not be read.
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
import stat
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Final

__all__ = [
    "COMPILED_SUFFIXES",
    "NOT_SOURCE_DIRS",
    "VENV_MARKER",
    "copy_ignore",
    "source_bytes",
    "source_digest",
    "source_files",
]

NOT_SOURCE_DIRS: Final = frozenset(
    {
        ".git",
        ".osmosis",
        ".venv",
        "venv",
        "__pycache__",
        ".pytest_cache",
        ".mypy_cache",
        ".ruff_cache",
        "node_modules",
    }
)
"""Names of directories that are never source, wherever they are below the root."""

VENV_MARKER: Final = "pyvenv.cfg"
"""A directory (below the root) holding this file is a virtual environment: not source."""

COMPILED_SUFFIXES: Final = (".pyc", ".pyo")
"""Files that are compiled from source, not source."""


def _left_out(folder: str, name: str, *, is_dir: bool, also_exclude: Sequence[str]) -> bool:
    if any(fnmatch.fnmatch(name, pattern) for pattern in also_exclude):
        return True
    if not is_dir:
        return name.endswith(COMPILED_SUFFIXES)
    path = os.path.join(folder, name)
    # A link to a directory is never looked into: it counts as a link (`source_bytes`).
    venv = not os.path.islink(path) and os.path.lexists(os.path.join(path, VENV_MARKER))
    return name in NOT_SOURCE_DIRS or venv


def source_files(root: Path, *, also_exclude: Sequence[str] = ()) -> list[Path]:
    """The rollout's source files below `root`, sorted: regular files, and links (to files or
    directories, never followed) and other kinds as entries. `also_exclude`: glob patterns of
    further names (files or directories) a caller leaves out.

        source_files(Path("rollouts/x"))  # [PosixPath('rollouts/x/main.py'), ...]
    """
    files: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [
            d for d in dirnames if not _left_out(dirpath, d, is_dir=True, also_exclude=also_exclude)
        ]
        files += [
            Path(dirpath) / f
            for f in filenames
            if not _left_out(dirpath, f, is_dir=False, also_exclude=also_exclude)
        ]
        # A link to a directory is not walked into, but it is part of the sources.
        files += [Path(dirpath) / d for d in dirnames if os.path.islink(Path(dirpath) / d)]
    return sorted(files)


def source_digest(root: Path, *, also_exclude: Sequence[str] = ()) -> str:
    """Hex SHA-256 over the rollout's sources (`source_files`): each one's path relative to
    `root` and its `source_bytes`, in order.

        source_digest(Path("rollouts/x"))  # '5d3ef849…'
    """
    digest = hashlib.sha256()
    for path in source_files(root, also_exclude=also_exclude):
        digest.update(str(path.relative_to(root)).encode() + b"\0")
        digest.update(source_bytes(path) + b"\0")  # never through a link
    return digest.hexdigest()


def copy_ignore(*, also_exclude: Sequence[str] = ()) -> Callable[[str, list[str]], set[str]]:
    """An `ignore` for `shutil.copytree` that leaves out what `source_files` leaves out, so a
    copy holds the files a `source_digest` with the same `also_exclude` covers.

        shutil.copytree(rollout_dir, copy, symlinks=True, ignore=copy_ignore())
    """

    def ignore(folder: str, names: list[str]) -> set[str]:
        return {
            name
            for name in names
            if _left_out(
                folder,
                name,
                is_dir=os.path.isdir(os.path.join(folder, name)),
                also_exclude=also_exclude,
            )
        }

    return ignore


def source_bytes(path: Path) -> bytes:
    """What a rollout source file contributes to a digest: a regular file's bytes; a link's
    target path and any other kind's type, never read through. The repository is hostile: a
    committed link to `/dev/zero` or to the platform's key must not be read.

        source_bytes(Path("rollouts/x/main.py"))  # b'import ...'
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        info = os.lstat(path)
        if stat.S_ISLNK(info.st_mode):
            return b"link:" + os.fsencode(os.readlink(path))
        return b"special:%o" % stat.S_IFMT(info.st_mode)
    with os.fdopen(fd, "rb") as handle:
        mode = os.fstat(handle.fileno()).st_mode
        if not stat.S_ISREG(mode):  # a FIFO or device opened without blocking: not read
            return b"special:%o" % stat.S_IFMT(mode)
        return handle.read()
