"""Files between the engine's machine and a Ray node: the run's code out, each attempt's
trial back. Nothing here imports Ray; nothing here follows a symbolic link.

    packed = pack_working_dir(checkout, scratch / "working_dir.zip")   # engine side
    files = collect_trial(node_trials / rollout_id, TrialLimits())      # node side (an actor)
    write_trial(files, trials_root / rollout_id)                        # engine side

Why our own zip rather than handing Ray the directory: Ray's packer follows links (a
pushed repository holding `secrets -> /` would ship the worker machine's files to every
node), honours `.gitignore` (a rollout could lose a file it reads), and packs `.osmosis/`
(other runs, venvs). The zip holds regular files and directories only, minus what is not
source (`.git`, venvs, caches, `.osmosis/`: `osmosis.eval.inputs.sources`), is
byte-identical for an unchanged tree (Ray then reuses the package it already has), and stays
under `MAX_WORKING_DIR_BYTES` (Ray refuses packages past its 512 MiB message size).

A trial travels as a list of (relative path, bytes): regular files only, bounded by
`TrialLimits`, and written back into a fresh directory with `O_EXCL | O_NOFOLLOW` after
every path is checked, because the rollout wrote every byte of it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from osmosis.eval.errors import HostError
from osmosis.eval.inputs.sources import COMPILED_SUFFIXES, NOT_SOURCE_DIRS, VENV_MARKER
from osmosis.eval.results.trial_outputs import ArtifactLimits, Skipped

MAX_WORKING_DIR_BYTES = 256 * 1024 * 1024
"""The largest checkout (uncompressed bytes of the files shipped) a Ray run sends."""

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
_ZIP_EPOCH = (1980, 1, 1, 0, 0, 0)  # fixed timestamps: an unchanged tree zips to equal bytes
_TRIAL_DOCUMENT_BYTES = 64 * 1024 * 1024  # trajectory.json / diagnostics.json, as the engine reads


class WorkingDirTooLarge(HostError):
    """The checkout is too big to ship to the Ray cluster."""

    default_hint = (
        "keep large data out of the workspace (the engine reads the dataset itself; rollouts "
        "download what they need), or run with the local executor"
    )


@dataclass
class Packed:
    """What `pack_working_dir` shipped: files, their bytes, and what it left out and why."""

    path: Path
    files: int = 0
    bytes: int = 0
    skipped: list[Skipped] = field(default_factory=list)

    def summary(self) -> str:
        note = f"{self.files} files, {self.bytes:,} bytes"
        if self.skipped:
            shown = "; ".join(f"{item.path}: {item.reason}" for item in self.skipped[:5])
            more = len(self.skipped) - 5
            tail = f"; {more} more" if more > 0 else ""
            note += f"; {len(self.skipped)} left out ({shown}{tail})"
        return note


@dataclass(frozen=True)
class TrialLimits:
    """How much of one attempt comes back from its node: the run's artifact limits plus
    room for its two JSON documents."""

    max_files: int = ArtifactLimits().max_files + 2
    max_file_bytes: int = max(ArtifactLimits().max_file_bytes, _TRIAL_DOCUMENT_BYTES)
    max_total_bytes: int = ArtifactLimits().max_total_bytes + 2 * _TRIAL_DOCUMENT_BYTES

    @classmethod
    def for_artifacts(cls, limits: ArtifactLimits) -> TrialLimits:
        return cls(
            max_files=limits.max_files + 2,
            max_file_bytes=max(limits.max_file_bytes, _TRIAL_DOCUMENT_BYTES),
            max_total_bytes=limits.max_total_bytes + 2 * _TRIAL_DOCUMENT_BYTES,
        )


@dataclass
class TrialFiles:
    """One attempt's trial directory as it travels: regular files, and what was left."""

    files: list[tuple[str, bytes]] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)


# -- the working directory ---------------------------------------------------------------------
def pack_working_dir(root: Path, dest: Path, *, max_bytes: int = MAX_WORKING_DIR_BYTES) -> Packed:
    """Zip the regular files below `root` (see the module doc for what is left out) into
    `dest`. Raises `WorkingDirTooLarge` naming the largest entries past `max_bytes`.

    packed = pack_working_dir(Path("."), Path("/tmp/x/working_dir.zip"))
    packed.files, packed.bytes  # (12, 40_961)
    """
    packed = Packed(path=dest)
    sizes: list[tuple[int, str]] = []
    dest.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(dest, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=1) as out:
        for folder, name, relative, info in _walk(root, packed.skipped, exclude=True):
            sizes.append((info.st_size, relative))
            if packed.bytes + info.st_size > max_bytes:
                packed.bytes += info.st_size  # past the limit: only the sizes matter now
                continue
            data = _read(folder, name)
            if data is None:
                packed.skipped.append(Skipped(relative, "changed while it was packed"))
                continue
            entry = zipfile.ZipInfo(relative, date_time=_ZIP_EPOCH)
            entry.external_attr = (0o755 if info.st_mode & 0o111 else 0o644) << 16
            entry.compress_type = zipfile.ZIP_DEFLATED
            out.writestr(entry, data)
            packed.files += 1
            packed.bytes += len(data)
    if packed.bytes > max_bytes:
        dest.unlink(missing_ok=True)
        listed = ", ".join(f"{path} ({size:,} bytes)" for size, path in sorted(sizes)[-5:][::-1])
        raise WorkingDirTooLarge(
            f"the workspace holds {packed.bytes:,} bytes to ship to the Ray cluster, over the "
            f"{max_bytes:,}-byte limit; the largest: {listed}"
        )
    return packed


# -- trials --------------------------------------------------------------------------------------
def collect_trial(trial_dir: Path, limits: TrialLimits) -> TrialFiles:
    """The regular files below `trial_dir` within `limits` (runs on the node, in the
    actor). A missing directory gives nothing."""
    collected = TrialFiles()
    total = 0
    for folder, name, relative, info in _walk(trial_dir, collected.skipped, exclude=False):
        size = info.st_size
        if len(collected.files) >= limits.max_files:
            reason = f"over the limit of {limits.max_files:,} files"
            collected.skipped.append(Skipped(relative, reason))
        elif size > limits.max_file_bytes:
            reason = f"{size:,} bytes, over the {limits.max_file_bytes:,}-byte file limit"
            collected.skipped.append(Skipped(relative, reason))
        elif total + size > limits.max_total_bytes:
            reason = f"over the {limits.max_total_bytes:,}-byte limit for one attempt"
            collected.skipped.append(Skipped(relative, reason))
        else:
            data = _read(folder, name, limit=limits.max_file_bytes)
            if data is None:
                collected.skipped.append(Skipped(relative, "not a regular file when read"))
                continue
            collected.files.append((relative, data))
            total += len(data)
    return collected


def write_trial(trial: TrialFiles, dest: Path, limits: TrialLimits) -> Path:
    """Write a shipped trial into a fresh `dest` (engine side). Entries whose path is not a
    plain relative one, or that go past `limits`, are dropped: the node's side is not
    trusted to have applied them."""
    _remove(dest)
    dest.mkdir(parents=True)
    total = written = 0
    for relative, data in trial.files:
        parts = relative.split("/")
        if not relative or relative.startswith("/") or any(p in ("", ".", "..") for p in parts):
            continue
        if "\0" in relative or written >= limits.max_files:
            continue
        if len(data) > limits.max_file_bytes or total + len(data) > limits.max_total_bytes:
            continue
        folder = dest
        for part in parts[:-1]:
            folder = folder / part
            with contextlib.suppress(FileExistsError):
                folder.mkdir(mode=0o700)
            if not stat.S_ISDIR(os.lstat(folder).st_mode):
                break
        else:
            try:
                handle = os.open(
                    folder / parts[-1], os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600
                )
            except OSError:
                continue  # a file where a directory was named, or a repeated name
            with os.fdopen(handle, "wb") as out:
                out.write(data)
            total += len(data)
            written += 1
    return dest


# -- the walk ------------------------------------------------------------------------------------
def _walk(
    root: Path, skipped: list[Skipped], *, exclude: bool
) -> Iterator[tuple[int, str, str, os.stat_result]]:
    """(directory fd, name, relative path, stat) of every regular file below `root`, depth
    first in name order, links never followed; anything else is noted in `skipped`. The fd
    is open until the next item: read the file before advancing. `exclude`: leave out what
    is not source (`osmosis.eval.inputs.sources`)."""
    try:
        top = os.open(root, _DIR_FLAGS)
    except OSError as error:
        if error.errno in (errno.ELOOP, errno.ENOTDIR):
            skipped.append(Skipped(".", "not a directory (or a link): nothing shipped"))
        return
    yield from _walk_dir(top, "", skipped, exclude)


def _walk_dir(
    folder: int, prefix: str, skipped: list[Skipped], exclude: bool
) -> Iterator[tuple[int, str, str, os.stat_result]]:
    try:
        with os.scandir(folder) as listing:
            names = sorted(entry.name for entry in listing)
        if exclude and prefix and VENV_MARKER in names:
            skipped.append(Skipped(prefix.rstrip("/"), "a virtual environment"))
            return
        for name in names:
            relative = prefix + name
            try:
                info = os.stat(name, dir_fd=folder, follow_symlinks=False)
            except OSError as error:
                skipped.append(Skipped(relative, f"unreadable ({error.strerror})"))
                continue
            if stat.S_ISDIR(info.st_mode):
                if exclude and name in NOT_SOURCE_DIRS:
                    continue
                try:
                    inner = os.open(name, _DIR_FLAGS, dir_fd=folder)
                except OSError as error:  # swapped for a link since the stat: ELOOP
                    skipped.append(Skipped(relative, f"unreadable ({error.strerror})"))
                    continue
                yield from _walk_dir(inner, relative + "/", skipped, exclude)
            elif stat.S_ISREG(info.st_mode):
                if not (exclude and name.endswith(COMPILED_SUFFIXES)):
                    yield folder, name, relative, info
            elif stat.S_ISLNK(info.st_mode):
                skipped.append(Skipped(relative, "a symbolic link: links are not followed"))
            else:
                skipped.append(Skipped(relative, "not a regular file"))
    finally:
        os.close(folder)


def _read(folder: int, name: str, limit: int | None = None) -> bytes | None:
    """The bytes of regular file `name` in directory fd `folder`, never through a link, or
    None (also when it is longer than `limit`)."""
    try:
        handle = os.open(name, _FILE_FLAGS, dir_fd=folder)
    except OSError:
        return None
    with os.fdopen(handle, "rb") as file:
        if not stat.S_ISREG(os.fstat(file.fileno()).st_mode):
            return None
        data = file.read() if limit is None else file.read(limit + 1)
    return None if limit is not None and len(data) > limit else data


def _remove(path: Path) -> None:
    try:
        info = path.lstat()
    except FileNotFoundError:
        return
    if stat.S_ISDIR(info.st_mode):
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


__all__ = [
    "MAX_WORKING_DIR_BYTES",
    "Packed",
    "TrialFiles",
    "TrialLimits",
    "WorkingDirTooLarge",
    "collect_trial",
    "pack_working_dir",
    "write_trial",
]
