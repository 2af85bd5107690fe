"""One server per home: an exclusive `flock` on `<home>/server.lock` for the server's whole life.

The lock is taken before anything else touches the home (migrations, recovery, the scheduler)
and the kernel drops it when the process ends, however it ends, so a crash leaves no stale
lock. A pid-file check cannot do this: two starts at the same moment both found no pid file,
both started, and their schedulers ran one run twice (issue 13.4). The file also records the
holder's pid, port and URL, so a refused start can say who is serving.

Standard library only: the CLI reads the holder without importing the server.

    lock = HomeLock.acquire(settings.lock_file, port=settings.port, url=settings.url)
    ...            # HomeInUse(home, holder) if another process holds it
    lock.release()
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Holder:
    """The server that holds a home's lock."""

    pid: int
    port: int
    url: str


class HomeInUse(RuntimeError):
    """Another server holds this home; `holder` says which (None if it could not be read)."""

    def __init__(self, home: Path, holder: Holder | None) -> None:
        self.home = home
        self.holder = holder
        who = f" (pid {holder.pid}, port {holder.port})" if holder else ""
        super().__init__(f"a server is already running for {home}{who}")


class HomeLock:
    """The held lock; `release` (or the process's end) lets another server start."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self._fd: int | None = fd

    @classmethod
    def acquire(cls, path: Path, *, port: int, url: str) -> HomeLock:
        """Lock `path` (created 0600) without waiting; `HomeInUse` if another process has it."""
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            # The holder writes its pid right after locking: give it a moment to appear. It
            # holds the lock, so the record is its own whatever its command line says.
            holder = read_holder(path, wait=2.0, locked=True)
            raise HomeInUse(path.parent, holder) from None
        record = {"pid": os.getpid(), "port": port, "url": url}
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(record) + "\n").encode(), 0)
        return cls(path, fd)

    def release(self) -> None:
        if self._fd is None:
            return
        os.ftruncate(self._fd, 0)  # no stale holder for a reader that does not lock
        os.close(self._fd)  # closing the only descriptor drops the flock
        self._fd = None


def read_holder(path: Path, *, wait: float = 0.0, locked: bool = False) -> Holder | None:
    """The live osmosis process recorded in the lock file, or None; re-read for up to `wait`
    seconds while the file is empty or names a process that is gone. `locked`: the caller
    knows the lock is held, so any live process recorded is the holder."""
    deadline = time.monotonic() + wait
    while True:
        holder = _read(path, locked=locked)
        if holder is not None or time.monotonic() >= deadline:
            return holder
        time.sleep(0.05)


def _read(path: Path, *, locked: bool) -> Holder | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        holder = Holder(pid=int(data["pid"]), port=int(data["port"]), url=str(data["url"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    # A crash leaves the record behind, and its pid may now be an unrelated program's.
    live = process_alive(holder.pid) if locked else is_osmosis_process(holder.pid)
    return holder if live else None


def process_alive(pid: int) -> bool:
    """Whether `pid` runs; a zombie (exited, not yet reaped by its parent) counts as gone."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rpartition(")")[2].split()[0] != "Z"


def is_osmosis_process(pid: int) -> bool:
    """Alive, and an osmosis command (where /proc tells; elsewhere alive is enough)."""
    if not process_alive(pid):
        return False
    try:
        return b"osmosis" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return True
