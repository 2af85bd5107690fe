"""Copying what a rollout wrote out of its trial directory, treating all of it as hostile.

A rollout writes `artifacts/` (and `trajectory.json`) itself, so anything there may be a
symbolic link to the platform's key, a FIFO that blocks a reader forever, a device, a
million files or a 2 GB file, or text holding a secret the run was given. The copy:

- never follows a symbolic link, at any depth (links are skipped and reported, never their
  targets' bytes); every directory and file is opened relative to its parent with
  `O_NOFOLLOW`, so a link swapped in mid-copy is refused too;
- copies regular files only: FIFOs, sockets and devices are skipped and reported;
- stops at `ArtifactLimits` (files, bytes per file, bytes in all), reporting what it left;
- keeps no mode bits of the rollout's: copies are plain owner-only files (0600, directories
  0700), and the files it walks lose their setuid, setgid, sticky and execute bits while they
  are there (a rollout's setuid file is never kept as one);
- redacts text files with the run's redactor; a binary file that holds a secret is withheld;
- then removes what it copied from (`keep_source=False`, the default): the raw trial's
  `artifacts/` is not kept beside its copy in the run's files (twice the space).

    copied = copy_artifacts(trial / "artifacts", run / "artifacts" / "row_0_run_0",
                            redact=redactor.redact, limits=ArtifactLimits())
    copied.skipped  # [Skipped(path='key.txt', reason='a symbolic link: links are not followed')]
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import secrets
import shutil
import stat
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "DEFAULT_ARTIFACT_LIMITS",
    "ArtifactCopy",
    "ArtifactLimits",
    "Skipped",
    "copy_artifacts",
    "read_trial_json",
    "write_trial_json",
]

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
# O_NONBLOCK: opening a FIFO that a hostile rollout swapped in must not hang the worker.
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
_CHUNK = 1 << 20
# What a file the rollout wrote must not keep on the host: it could be run as the server's user.
_RISKY_FILE_BITS = stat.S_ISUID | stat.S_ISGID | stat.S_ISVTX | 0o111
_RISKY_DIR_BITS = stat.S_ISUID | stat.S_ISGID | stat.S_ISVTX


@dataclass(frozen=True)
class ArtifactLimits:
    """How much of one attempt's artifacts is copied.

    `max_files`: regular files copied (directories do not count); `max_file_bytes`: a larger
    file is skipped; `max_total_bytes`: once the files copied reach it, the rest are skipped.

        ArtifactLimits(max_files=100, max_file_bytes=1 << 20, max_total_bytes=8 << 20)
    """

    max_files: int = 1_000
    max_file_bytes: int = 64 * 1024 * 1024
    max_total_bytes: int = 256 * 1024 * 1024


DEFAULT_ARTIFACT_LIMITS = ArtifactLimits()
SKIPPED_NOTES = ".osmosis-skipped.json"
"""Left in a trial directory by a site that copied it out of a sandbox: what of `artifacts/`
it left out and why (`[[path, reason], ...]`), for the run's copy to report as its own."""


@dataclass(frozen=True)
class Skipped:
    """One entry that was not copied: its path below `artifacts/` and why."""

    path: str
    reason: str


@dataclass
class ArtifactCopy:
    """What `copy_artifacts` did: files copied, bytes written, redacted files, and skips."""

    files: int = 0
    bytes: int = 0
    redacted: list[str] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)

    def summary(self) -> str | None:
        """One log line naming what was left out and why, or None when nothing was."""
        if not self.skipped:
            return None
        shown = "; ".join(f"{item.path}: {item.reason}" for item in self.skipped[:10])
        more = len(self.skipped) - 10
        return f"{len(self.skipped)} not copied ({shown}{f'; and {more} more' if more > 0 else ''})"


def copy_artifacts(
    src_dir: Path,
    dest_dir: Path,
    *,
    redact: Callable[[str], str],
    limits: ArtifactLimits = DEFAULT_ARTIFACT_LIMITS,
    names: Collection[str] | None = None,
    keep_source: bool = False,
) -> ArtifactCopy:
    """Copy the regular files below `src_dir` into a fresh `dest_dir`, safely (see module doc),
    then remove `src_dir` unless `keep_source`.

    `dest_dir` is replaced: whatever it held goes first (an attempt is recorded once; a retry
    under the same slot starts clean). A `src_dir` that is missing, or is itself a link, copies
    nothing (a link is reported, and removed). `names`: copy only these entries of `src_dir`'s
    top level (the sandbox takes `trajectory.json`, `diagnostics.json` and `artifacts/`).
    """
    result = ArtifactCopy()
    _remove(dest_dir)
    if dest_dir.parent.is_symlink():  # the run directory is ours: nothing there may redirect
        dest_dir.parent.unlink()
    try:
        source = os.open(src_dir, _DIR_FLAGS)
    except OSError as error:
        if error.errno in (errno.ELOOP, errno.ENOTDIR):
            result.skipped.append(Skipped(".", _kind_reason(src_dir)))
            if not keep_source:
                _remove(src_dir)
        return result
    try:
        dest_dir.mkdir(parents=True, exist_ok=True)
        target = os.open(dest_dir, _DIR_FLAGS)
        try:
            _copy_tree(source, target, "", result, redact=redact, limits=limits, only=names)
        finally:
            os.close(target)
    finally:
        os.close(source)
    if not keep_source:
        _remove(src_dir, missing_ok=True)
    return result


def read_trial_json(trial_dir: Path, name: str, *, max_bytes: int = 64 * 1024 * 1024) -> Any:
    """The JSON document `trial_dir/name` as the rollout wrote it, or None.

    None when the file is missing, a symbolic link (at the file or the directory), not a
    regular file, larger than `max_bytes`, or not JSON: a trajectory that is a link to the
    server's credentials must not become a trajectory the API serves.

        document = read_trial_json(artifact_root / rollout_id, "trajectory.json")
    """
    try:
        folder = os.open(trial_dir, _DIR_FLAGS)
    except OSError:
        return None
    try:
        data = _read_regular(folder, name, max_bytes)
    finally:
        os.close(folder)
    if data is None:
        return None
    try:
        return json.loads(data)
    except (ValueError, RecursionError):
        return None


def write_trial_json(trial_dir: Path, name: str, document: Any) -> bool:
    """Replace `trial_dir/name` with `document` as JSON, never through a link; False when the
    directory is a link or gone.

    The rollout owns `trial_dir`: whatever it planted there (a link at any temporary name,
    say) must not make the worker write elsewhere. The directory is held by a descriptor
    opened without following links, the temporary file is a fresh random name created
    exclusively (`O_EXCL` never follows a link), and the rename happens in that directory.

        write_trial_json(artifact_root / rollout_id, "trajectory.json", redacted)
    """
    try:
        folder = os.open(trial_dir, _DIR_FLAGS)
    except OSError:
        return False
    try:
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
        temporary = f".{name}.{secrets.token_hex(8)}.tmp"
        descriptor = os.open(temporary, flags, 0o600, dir_fd=folder)
        try:
            with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
                json.dump(document, handle)
            os.replace(temporary, name, src_dir_fd=folder, dst_dir_fd=folder)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temporary, dir_fd=folder)
            raise
    finally:
        os.close(folder)
    return True


# -- the walk ---------------------------------------------------------------------------------
def _copy_tree(
    source: int,
    target: int,
    prefix: str,
    result: ArtifactCopy,
    *,
    redact: Callable[[str], str],
    limits: ArtifactLimits,
    only: Collection[str] | None = None,
) -> None:
    for name in _names(source):
        if only is not None and name not in only:
            continue
        relative = f"{prefix}{name}"
        try:
            info = os.stat(name, dir_fd=source, follow_symlinks=False)
        except OSError as error:
            result.skipped.append(Skipped(relative, f"unreadable ({error.strerror})"))
            continue
        if stat.S_ISDIR(info.st_mode):
            _copy_directory(source, target, name, relative, result, redact=redact, limits=limits)
            continue
        if not stat.S_ISREG(info.st_mode):
            result.skipped.append(Skipped(relative, _mode_reason(info.st_mode)))
            continue
        if info.st_mode & _RISKY_FILE_BITS:  # copied or not, it stays in the raw trial
            _defuse(source, name, _RISKY_FILE_BITS)
        if result.files >= limits.max_files:
            result.skipped.append(
                Skipped(relative, f"over the limit of {limits.max_files:,} files")
            )
        elif info.st_size > limits.max_file_bytes:
            reason = f"{info.st_size:,} bytes, over the {limits.max_file_bytes:,}-byte file limit"
            result.skipped.append(Skipped(relative, reason))
        elif result.bytes + info.st_size > limits.max_total_bytes:
            reason = f"over the {limits.max_total_bytes:,}-byte limit for one attempt's artifacts"
            result.skipped.append(Skipped(relative, reason))
        else:
            _copy_file(source, target, name, relative, result, redact=redact, limits=limits)


def _copy_directory(
    source: int,
    target: int,
    name: str,
    relative: str,
    result: ArtifactCopy,
    *,
    redact: Callable[[str], str],
    limits: ArtifactLimits,
) -> None:
    try:
        inner = os.open(name, _DIR_FLAGS, dir_fd=source)
    except OSError as error:  # swapped for a link since the stat: ELOOP
        result.skipped.append(Skipped(relative, _open_reason(error)))
        return
    with contextlib.suppress(OSError):
        mode = stat.S_IMODE(os.fstat(inner).st_mode)
        if mode & _RISKY_DIR_BITS:
            os.fchmod(inner, mode & ~_RISKY_DIR_BITS)
    try:
        os.mkdir(name, 0o700, dir_fd=target)
        made = os.open(name, _DIR_FLAGS, dir_fd=target)
    except OSError:
        os.close(inner)
        raise
    try:
        _copy_tree(inner, made, f"{relative}/", result, redact=redact, limits=limits)
    finally:
        os.close(inner)
        os.close(made)


def _copy_file(
    source: int,
    target: int,
    name: str,
    relative: str,
    result: ArtifactCopy,
    *,
    redact: Callable[[str], str],
    limits: ArtifactLimits,
) -> None:
    try:
        data = _read_regular(source, name, limits.max_file_bytes, strict=True)
    except OSError as error:
        result.skipped.append(Skipped(relative, _open_reason(error)))
        return
    assert data is not None
    cleaned = _redacted(data, redact)
    if cleaned is None:
        result.skipped.append(Skipped(relative, "a binary file holding a secret value: withheld"))
        return
    if cleaned is not data:
        result.redacted.append(relative)
    # O_EXCL: the fresh destination holds nothing yet, so nothing can be a planted link.
    handle = os.open(
        name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=target
    )
    with os.fdopen(handle, "wb") as out:
        os.fchmod(out.fileno(), 0o600)  # plain, whatever the umask: no bit of the source's
        out.write(cleaned)
    result.files += 1
    result.bytes += len(cleaned)


def _read_regular(folder: int, name: str, max_bytes: int, *, strict: bool = False) -> bytes | None:
    """The bytes of regular file `name` in directory fd `folder`, never through a link.

    None (or, with `strict`, an OSError) for anything else or anything over `max_bytes`.
    """
    try:
        handle = os.open(name, _FILE_FLAGS, dir_fd=folder)
    except OSError:
        if strict:
            raise
        return None
    with os.fdopen(handle, "rb") as file:
        info = os.fstat(file.fileno())
        if not stat.S_ISREG(info.st_mode):  # swapped since it was listed
            if strict:
                raise OSError(errno.EINVAL, _mode_reason(info.st_mode))
            return None
        # Read one byte past the limit: a file that grows while it is read is still refused.
        data = file.read(max_bytes + 1)
    if len(data) > max_bytes:
        if strict:
            raise OSError(errno.EFBIG, f"grew past the {max_bytes:,}-byte file limit while copied")
        return None
    return data


def _defuse(folder: int, name: str, bits: int) -> None:
    """Clear `bits` of regular file `name` in `folder`, through a descriptor opened without
    following links (a link swapped in meanwhile is left alone, its target untouched)."""
    try:
        handle = os.open(name, _FILE_FLAGS, dir_fd=folder)
    except OSError:  # unreadable (mode 0o4000, say): nothing can run it either
        return
    try:
        info = os.fstat(handle)
        if stat.S_ISREG(info.st_mode):
            os.fchmod(handle, stat.S_IMODE(info.st_mode) & ~bits)
    except OSError:
        pass
    finally:
        os.close(handle)


def _redacted(data: bytes, redact: Callable[[str], str]) -> bytes | None:
    """`data` with secrets replaced (text), `data` itself when it holds none, or None for a
    binary file that holds one (replacing bytes inside a binary format would corrupt it)."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        # Valid UTF-8 stretches inside binary data are still searched for secrets.
        loose = data.decode("utf-8", "surrogateescape")
        return data if redact(loose) == loose else None
    cleaned = redact(text)
    return data if cleaned == text else cleaned.encode("utf-8")


def _names(folder: int) -> Iterator[str]:
    with os.scandir(folder) as listing:
        names = sorted(entry.name for entry in listing)
    yield from names


def _remove(path: Path, *, missing_ok: bool = False) -> None:
    """Delete `path` whatever it is, never following a link out of it. `missing_ok`: what
    cannot be removed (a rollout made it unreadable, it went meanwhile) is left."""
    try:
        info = path.lstat()
    except FileNotFoundError:
        return
    if stat.S_ISDIR(info.st_mode):
        shutil.rmtree(path, ignore_errors=missing_ok)  # rmtree does not follow links inside
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def _kind_reason(path: Path) -> str:
    try:
        return _mode_reason(path.lstat().st_mode)
    except OSError as error:
        return f"unreadable ({error.strerror})"


def _mode_reason(mode: int) -> str:
    if stat.S_ISLNK(mode):
        return "a symbolic link: links are not followed"
    if stat.S_ISFIFO(mode):
        return "a FIFO: only regular files are copied"
    if stat.S_ISSOCK(mode):
        return "a socket: only regular files are copied"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device: only regular files are copied"
    if stat.S_ISDIR(mode):
        return "a directory where a file was expected"
    return "not a regular file"


def _open_reason(error: OSError) -> str:
    if error.errno == errno.ELOOP:
        return "a symbolic link: links are not followed"
    return str(error.strerror or error)
