"""Disk held by sandboxed rollout servers, counted while they run, and given back.

    tmpfs = open_tmpfs(mount_pid(pids))  # once per server: its /tmp and HOME, held open
    use = measure(outbox, ended, running={"r1"}, claimed={"r1", "r2"}, tmpfs=tmpfs, cap=cap)
    use.total                       # bytes: attempts, leftovers, stray files, /tmp and HOME
    use.attempts["r1"]              # Tree(bytes=..., entries=...)
    retire(outbox / "r1", ended / "r1")      # out of the sandbox's reach, held files still counted
    held(ended / "r1", pids)        # does a process of the sandbox still hold any of it?
    held_among([ended / "r1", ended / "r2"], pids)  # the same for several, in one pass

Design note (issue 25.4)
------------------------

A rollout server writes in three places: the site's outbox (`<trials_root>.sandbox`, bound
read-write; each attempt writes `<rollout_id>/` there, but any process may write anywhere in
it), and its own tmpfs `/tmp` and `HOME`. All three count against one quota per server
(`SandboxLimits.disk_bytes`), measured every second by the endpoint's watcher and once more
when an attempt ends, before it is recorded (on the event loop when it left no directory in
the outbox; attempts that left one and end together share one measure, in a thread, taken
after all of them left the outbox):

- **What counts.** Allocated bytes (`st_blocks`, so a sparse file counts what it holds) of the
  outbox entries of the server's attempts in flight, of entries no attempt of the site claims
  (stray files at the outbox's root: charged to every server, since any could have written
  them), of the server's ended attempts still held by one of its processes (below), and the
  used blocks of its `/tmp` and `HOME` (`fstatvfs` of the two, opened once through
  `/proc/<pid>/root` of a process in the sandbox's mount namespace and held until the server
  is released: no look-up of the sandbox's processes per measure). An attempt in flight
  past `artifact_bytes` or `MAX_TRIAL_ENTRIES` is a breach at once, not only when it ends.
- **A breach** is the sandbox's limit path (`SandboxEndpoint.limit_hit`): the server is
  killed, the attempt alone on it fails `resource_limit`, several go back to pending to re-run
  alone. Killing the sandbox frees its tmpfs; stopping the endpoint removes its outbox entries,
  its ended attempts and the unclaimed entries of the outbox.
- **An attempt ends**: its directory is renamed out of the outbox (`retire`) into the
  server's `ended/` directory, which the sandbox cannot name; a process that still holds a file
  or directory of it can write on, but only there, where it is still counted. What the engine
  reads is *copied* out of it (regular files only, no links, no mode bits, capped), never
  moved, so nothing a leftover process writes can grow a kept file. Then every file there is
  truncated (the space comes back at once) and the directory removed once no process of the
  sandbox holds any of it (`held`: their descriptors and working directories); until then it
  stays, empty but counted, and goes at the latest when the server stops.
- **Stale outboxes**: a killed engine leaves its outbox behind; the site removes it when it
  starts (a resume), and the platform when it notices the dead worker (`remove_stale`).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import stat
import sys
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from osmosis.eval.sites.sandbox.layout import SANDBOX_HOME
from osmosis.eval.sites.sandbox.policy import MAX_TRIAL_ENTRIES, SandboxLimits

ENDED_SUFFIX = ".sandbox-ended"
"""`<trials_root><ENDED_SUFFIX>/`: the attempts that ended, out of the sandbox's reach."""
OUTBOX_SUFFIX = ".sandbox"
"""`<trials_root><OUTBOX_SUFFIX>/`: the outbox the sandbox writes."""

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_PATH_FLAGS = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC
_TMPFS_FLAGS = os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC
_TMPFS = ("/tmp", SANDBOX_HOME)
# What a descriptor names when it is no file of the outbox: not worth a stat.
_NOT_FILES = ("socket:", "pipe:", "anon_inode:", "/dev/", "/proc/")
_LISTING_BYTES = 32 * 1024


class _StatVFS(ctypes.Structure):
    """glibc's `struct statvfs` on a 64-bit system, with room to spare."""

    _fields_ = [
        (name, ctypes.c_ulong)
        for name in (
            "f_bsize",
            "f_frsize",
            "f_blocks",
            "f_bfree",
            "f_bavail",
            "f_files",
            "f_ffree",
            "f_favail",
            "f_fsid",
            "f_flag",
            "f_namemax",
        )
    ] + [("spare", ctypes.c_int * 16)]


def _held_calls() -> tuple[ctypes._NamedFuncPointer, ...] | None:
    """libc's `fstatvfs`, `lseek64` and `getdents64`, called with the GIL held (`PyDLL`), when
    this libc has them and its `fstatvfs` answers as `os.fstatvfs` does; else None.

    Each attempt that ends has its server's disk measured on the event loop, and a system call
    through `os` lets go of the GIL: the engine's other threads (the run's journal, its mirror)
    wake for it each time, ~14 µs of the engine's CPU per call. The nine calls a measure made
    cost a sandboxed run a tenth of its attempts/s (`bench/sandbox.py`)."""
    if not sys.platform.startswith("linux") or ctypes.sizeof(ctypes.c_ulong) != 8:
        return None
    try:
        libc = ctypes.PyDLL(None, use_errno=True)
        fstatvfs, lseek, getdents = libc.fstatvfs, libc.lseek64, libc.getdents64
    except (OSError, AttributeError):
        return None
    fstatvfs.argtypes = [ctypes.c_int, ctypes.POINTER(_StatVFS)]
    fstatvfs.restype = ctypes.c_int
    lseek.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int]
    lseek.restype = ctypes.c_int64
    getdents.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t]
    getdents.restype = ctypes.c_ssize_t
    try:
        probe = os.open("/", _TMPFS_FLAGS)
    except OSError:
        return None
    try:
        answer = _StatVFS()
        if fstatvfs(probe, ctypes.byref(answer)) != 0:
            return None
        expected = os.fstatvfs(probe)
    except OSError:
        return None
    finally:
        os.close(probe)
    got = (answer.f_bsize, answer.f_frsize, answer.f_blocks, answer.f_namemax)
    if got != (expected.f_bsize, expected.f_frsize, expected.f_blocks, expected.f_namemax):
        return None
    return fstatvfs, lseek, getdents


_HELD = _held_calls()


def _oserror() -> OSError:
    code = ctypes.get_errno()
    return OSError(code, os.strerror(code))


class HeldDirectory:
    """A directory held open, listed through its descriptor with the GIL held (`_held_calls`;
    `os.listdir` without them). The descriptor's offset is shared: one thread at a time."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.fd = os.open(path, _DIR_FLAGS)
        self._buffer = ctypes.create_string_buffer(_LISTING_BYTES) if _HELD else None

    def names(self) -> list[str]:
        if _HELD is None or self._buffer is None:
            return os.listdir(self.fd)
        _, lseek, getdents = _HELD
        fd, buffer = self.fd, self._buffer
        if lseek(fd, 0, os.SEEK_SET) < 0:
            raise _oserror()
        names: list[str] = []
        while True:
            size = getdents(fd, buffer, _LISTING_BYTES)
            if size <= 0:
                if size < 0:
                    raise _oserror()
                return names
            data = ctypes.string_at(buffer, size)
            at = 0
            while at < size:  # struct linux_dirent64: ino, off, reclen (at 16), type, name
                length = int.from_bytes(data[at + 16 : at + 18], sys.byteorder)
                name = data[at + 19 : at + length].split(b"\0", 1)[0]
                if name != b"." and name != b"..":
                    names.append(os.fsdecode(name))
                at += length

    def close(self) -> None:
        os.close(self.fd)


@dataclass(frozen=True)
class Tree:
    """What one directory holds: allocated bytes and entries (a walk stops past `cap`)."""

    bytes: int = 0
    entries: int = 0


_NOTHING = Tree()


@dataclass
class DiskUse:
    """One server's disk at one moment (see the module docstring)."""

    attempts: dict[str, Tree] = field(default_factory=dict)
    """Each attempt in flight: its outbox entry."""
    stray: Tree = Tree()
    """Outbox entries no attempt of the site claims."""
    ended: int = 0
    """Bytes of its ended attempts still held by a process (normally 0)."""
    tmpfs: int = 0
    """Bytes used in its `/tmp` and `HOME`."""
    walked: int = 0
    """Entries looked at to measure it (what the next measure will likely cost)."""
    found: bool = False
    """Whether the outbox holds an entry named `find` (`measure`)."""

    @property
    def total(self) -> int:
        return (
            sum(t.bytes for t in self.attempts.values())
            + self.stray.bytes
            + self.ended
            + (self.tmpfs)
        )


def measure(
    outbox: Path,
    ended: Path | None,
    *,
    running: Collection[str],
    claimed: Collection[str],
    tmpfs: Sequence[int],
    cap: int,
    find: str | None = None,
    listing: HeldDirectory | None = None,
) -> DiskUse:
    """The disk one server holds now. `ended`: where its ended attempts are (None: it never
    had one); `running`: its attempts in flight; `claimed`: every attempt in flight on the
    site (the rest of the outbox is stray); `tmpfs`: its `/tmp` and `HOME` (`open_tmpfs`);
    `cap`: entries after which a tree's walk stops (it is over the limit by then); `find`: an
    entry to look for on the way (`DiskUse.found`); `listing`: the outbox held open, to list
    it through (no system call then lets go of the GIL while nothing is walked)."""
    held = _NOTHING if ended is None else tree(ended, cap=cap)
    use = DiskUse(ended=held.bytes, tmpfs=tmpfs_bytes(tmpfs), walked=held.entries)
    try:
        names = listing.names() if listing is not None else os.listdir(outbox)
    except OSError:
        return use
    # Called for each attempt that ends, on the event loop: plain sums, no context managers.
    stray_bytes = stray_entries = 0
    for name in names:
        use.walked += 1
        if name == find:
            use.found = True
        if name in running:
            use.attempts[name] = below = tree(outbox / name, cap=cap)
            use.walked += below.entries
        elif name not in claimed:
            below = tree(outbox / name, cap=cap)
            stray_bytes += below.bytes
            stray_entries += below.entries + 1
            use.walked += below.entries
    if stray_entries:
        use.stray = Tree(stray_bytes, stray_entries)
    return use


def tree(path: Path, *, cap: int) -> Tree:
    """Allocated bytes and entries at and below `path`, links not followed, at most `cap`
    entries walked."""
    try:
        info = os.lstat(path)
    except OSError:
        return Tree()
    if not stat.S_ISDIR(info.st_mode):
        return Tree(info.st_blocks * 512, 1)
    total = entries = 0
    stack = [str(path)]
    while stack and entries <= cap:
        try:
            scan = os.scandir(stack.pop())
        except OSError:
            continue
        with scan:
            for entry in scan:
                entries += 1
                if entries > cap:
                    break
                try:
                    found = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                total += found.st_blocks * 512
                if stat.S_ISDIR(found.st_mode):
                    stack.append(entry.path)
    return Tree(total, entries)


def attempt_usage(directory: Path, limits: SandboxLimits) -> str | None:
    """Whether an attempt's directory broke a file limit: a file at the file-size limit (the
    kernel stopped it there), more bytes or entries than allowed. Links are not followed."""
    total = entries = 0
    stack = [directory]
    while stack:
        try:
            scan = os.scandir(stack.pop())
        except OSError:
            continue
        with scan:
            for entry in scan:
                entries += 1
                if entries > MAX_TRIAL_ENTRIES:
                    return f"limit of {MAX_TRIAL_ENTRIES} files and directories"
                try:
                    info = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                if stat.S_ISDIR(info.st_mode):
                    stack.append(Path(entry.path))
                elif stat.S_ISREG(info.st_mode):
                    if info.st_size >= limits.file_bytes:
                        name = os.path.relpath(entry.path, directory)
                        return f"file size limit ({limits.file_bytes} bytes): {name}"
                    total += info.st_size
                    if total > limits.artifact_bytes:
                        return f"output limit ({limits.artifact_bytes} bytes per attempt)"
    return None


def open_tmpfs(pid: int | None) -> list[int]:
    """Descriptors (`O_PATH`) of the sandbox's `/tmp` and `HOME`, opened through a process of
    its mount namespace (`mount_pid`): they name those file systems for as long as they are
    held, whatever becomes of that process (the caller closes them). Empty when there is no
    such process (yet), or either cannot be opened: the next measure tries again."""
    if pid is None:
        return []
    handles: list[int] = []
    try:
        for place in _TMPFS:
            handles.append(os.open(f"/proc/{pid}/root{place}", _TMPFS_FLAGS))
    except OSError:
        for handle in handles:
            os.close(handle)
        return []
    return handles


def tmpfs_bytes(handles: Iterable[int]) -> int:
    """Bytes used in the sandbox's `/tmp` and `HOME` (`open_tmpfs`)."""
    used = 0
    for handle in handles:
        if _HELD is not None:
            info = _StatVFS()
            if _HELD[0](handle, ctypes.byref(info)) != 0:
                continue
            used += (info.f_blocks - info.f_bfree) * info.f_frsize
            continue
        try:
            found = os.fstatvfs(handle)
        except OSError:
            continue
        used += (found.f_blocks - found.f_bfree) * found.f_frsize
    return used


def mount_pid(pids: Iterable[int]) -> int | None:
    """A process of `pids` inside the sandbox's own mount namespace (bwrap's outer process is
    in ours: through it `/tmp` would be the host's)."""
    try:
        ours = os.stat("/proc/self/ns/mnt").st_ino
    except OSError:
        return None
    for pid in pids:
        try:
            if os.stat(f"/proc/{pid}/ns/mnt").st_ino != ours:
                return pid
        except OSError:
            continue
    return None


def retire(source: Path, dest: Path) -> bool:
    """Rename an attempt's directory out of the outbox to `dest` (same file system); anything
    else at `source` (a link, a file) is removed. False when there was no directory."""
    try:
        if not stat.S_ISDIR(os.lstat(source).st_mode):
            remove(source)
            return False
    except OSError:
        return False
    dest.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.rename(source, dest)
    except OSError:
        remove(source)
        return False
    return True


def held(path: Path, pids: Iterable[int]) -> bool:
    """Whether a process of `pids` holds a file or directory at or below `path` open, or
    works in one. True when that cannot be read (the safe answer: keep counting it)."""
    return bool(held_among([path], pids))


def held_among(paths: Iterable[Path], pids: Iterable[int]) -> set[Path]:
    """The paths of `paths` that a process of `pids` holds (as `held` says of each), with one
    pass over the processes' descriptors for all of them."""
    trees = {path: found for path in paths if (found := _inodes(path))}
    if not trees:
        return set()
    opened = _opened(pids, devices={inode[0] for found in trees.values() for inode in found})
    if opened is None:
        return set(trees)
    return {path for path, found in trees.items() if not found.isdisjoint(opened)}


def _opened(pids: Iterable[int], *, devices: set[int]) -> set[tuple[int, int]] | None:
    """(device, inode) of what `pids` hold open or work in, on `devices`; None when a
    process's descriptors cannot be read."""
    opened: set[tuple[int, int]] = set()
    for pid in pids:
        try:
            names = os.listdir(f"/proc/{pid}/fd")
        except FileNotFoundError:
            continue  # gone meanwhile
        except OSError:
            return None
        links = [f"/proc/{pid}/cwd", *(f"/proc/{pid}/fd/{name}" for name in names)]
        for link in links:
            try:
                if os.readlink(link).startswith(_NOT_FILES):
                    continue
                info = os.stat(link)
            except OSError:
                continue
            if info.st_dev in devices:
                opened.add((info.st_dev, info.st_ino))
    return opened


def empty(path: Path) -> None:
    """Truncate every regular file at and below `path` to nothing, links not followed: the
    space comes back even while a process still holds the files."""
    try:
        top = os.open(path, _DIR_FLAGS)
    except OSError:
        _truncate(os.fspath(path), None)
        return
    stack = [top]
    while stack:
        folder = stack.pop()
        try:
            with os.scandir(folder) as entries:
                names = [(e.name, e.is_dir(follow_symlinks=False)) for e in entries]
            for name, is_dir in names:
                if is_dir:
                    with contextlib.suppress(OSError):
                        stack.append(os.open(name, _DIR_FLAGS, dir_fd=folder))
                else:
                    _truncate(name, folder)
        except OSError:
            pass
        finally:
            os.close(folder)


def remove(path: Path) -> None:
    """Remove a file, link or tree without following links (what the rollout left)."""
    try:
        if stat.S_ISDIR(os.lstat(path).st_mode):
            shutil.rmtree(path, ignore_errors=True)  # fd-based on Linux: links are not followed
        else:
            path.unlink()
    except OSError:
        pass


def remove_stale(trials_root: Path) -> None:
    """Remove the outbox and the ended attempts a sandbox site of this trials root left
    (its engine was killed). Only for a run no live engine holds: it takes every file.

        remove_stale(run_dir / "rollout_trials")
    """
    for suffix in (OUTBOX_SUFFIX, ENDED_SUFFIX):
        remove(trials_root.parent / f"{trials_root.name}{suffix}")


def _truncate(name: str, folder: int | None) -> None:
    # O_PATH needs no permission on the file itself: a file the rollout made mode 000 is
    # still ours to empty (through /proc/self/fd, which names the inode, never a link).
    try:
        handle = os.open(name, _PATH_FLAGS, dir_fd=folder)
    except OSError:
        return
    try:
        path = f"/proc/self/fd/{handle}"
        if stat.S_ISREG(os.stat(path).st_mode):
            os.chmod(path, 0o600)
            os.truncate(path, 0)
    except OSError:
        pass
    finally:
        os.close(handle)


def _inodes(path: Path) -> set[tuple[int, int]]:
    """(device, inode) of `path` and everything below it, links not followed."""
    found: set[tuple[int, int]] = set()
    stack = [os.fspath(path)]
    while stack:
        current = stack.pop()
        try:
            info = os.lstat(current)
        except OSError:
            continue
        found.add((info.st_dev, info.st_ino))
        if stat.S_ISDIR(info.st_mode):
            with contextlib.suppress(OSError), os.scandir(current) as entries:
                stack.extend(entry.path for entry in entries)
    return found


__all__ = [
    "ENDED_SUFFIX",
    "OUTBOX_SUFFIX",
    "DiskUse",
    "HeldDirectory",
    "Tree",
    "attempt_usage",
    "empty",
    "held",
    "held_among",
    "measure",
    "mount_pid",
    "open_tmpfs",
    "remove",
    "remove_stale",
    "retire",
    "tmpfs_bytes",
    "tree",
]
