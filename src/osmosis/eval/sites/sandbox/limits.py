"""Resource limits of one sandboxed rollout server: a cgroup where the platform can make one,
else per-process rlimits; and, afterwards, which limit (if any) the server ran into.

    group = create_limit_group("run-abc-scripted-0", limits)
    group.mechanism           # 'cgroup v1 (memory, pids)'
    popen(..., preexec_fn=group.join)   # the child enters the group before it execs bwrap
    group.exceeded()          # 'memory limit (512 MiB): the kernel killed a process (OOM)'
    group.kill(); group.remove()

Order of preference, and what each gives:

- **cgroup v2** (the server's own cgroup delegates `memory` and `pids` in its
  `cgroup.subtree_control`): `memory.max` with no swap, `pids.max`; `memory.events` and
  `pids.events` say which one was hit; `cgroup.kill` ends everything in it at once.
- **cgroup v1** (writable `memory` and `pids` hierarchies, e.g. running as root): the same with
  `memory.limit_in_bytes` (+ `memsw` when swap is accounted), `memory.oom_control`'s `oom_kill`
  and `pids.events`.
- **rlimits** only: `RLIMIT_AS` (address space, per process: an allocation past it raises
  `MemoryError`) and `RLIMIT_NPROC` (per user: not enforced for root). Said in the run's log.

Every mechanism also sets `RLIMIT_FSIZE` (file size) and `RLIMIT_CPU` (CPU seconds per
process) through the shim, on the rollout server and what it starts.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from osmosis.eval.sites.sandbox.policy import SandboxLimits
from osmosis.vocabulary import format_bytes

_GROUP_PREFIX = "osmosis-sandbox-"
_STALE_AFTER_SEC = 600.0  # an empty group this old was left by an engine that was killed
_KILL_ROUNDS = 50
_SPARE_NAME = "spare-"


@dataclass
class LimitGroup:
    """One server's group (or the absence of one: `mechanism == 'rlimits'`)."""

    mechanism: str
    limits: SandboxLimits
    memory_dir: Path | None = None
    pids_dir: Path | None = None
    v2: bool = False
    _baseline: dict[str, int] = field(default_factory=dict)
    _join_fds: list[int] = field(default_factory=list)

    @property
    def is_cgroup(self) -> bool:
        return self.memory_dir is not None

    def shim_rlimits(self) -> list[str]:
        """`NAME=value` for the shim: what the kernel enforces per process."""
        limits = [f"FSIZE={self.limits.file_bytes}"]
        if self.limits.cpu_seconds:
            limits.append(f"CPU={self.limits.cpu_seconds}")
        if not self.is_cgroup:
            limits += [f"AS={self.limits.memory_bytes}", f"NPROC={self.limits.processes}"]
        return limits

    def describe(self) -> str:
        """One line for the run's log: the mechanism and every limit."""
        memory = format_bytes(self.limits.memory_bytes, exact=True)
        return (
            f"limits via {self.mechanism}: memory {memory}, {self.limits.processes} processes, "
            f"files up to {format_bytes(self.limits.file_bytes, exact=True)}, "
            f"{format_bytes(self.limits.artifact_bytes, exact=True)} of outputs per attempt, "
            + (
                f"{format_bytes(self.limits.disk_bytes, exact=True)} of disk per server, "
                if self.limits.disk_bytes is not None
                else "disk per server: outputs per attempt x its concurrency, "
            )
            + (f"{self.limits.cpu_seconds} CPU s per process" if self.limits.cpu_seconds else "")
        ).rstrip(", ")

    def pids(self, root: int | None) -> list[int]:
        """Host pids of every process of the sandbox: the group's, or without a group the
        descendants of `root` (bwrap's pid), read from `/proc`."""
        directory = self.pids_dir or self.memory_dir
        if directory is not None:
            return _pids(directory)
        return [] if root is None else _descendants(root)

    # -- entering ------------------------------------------------------------------------------
    def prepare_join(self) -> Callable[[], None] | None:
        """A `preexec_fn` part that moves the new child into the group. The files are opened
        here, in the parent: between fork and exec only plain system calls are safe."""
        self._close_join_fds()
        targets = [d for d in (self.memory_dir, self.pids_dir) if d is not None]
        if not targets:
            return None
        seen: set[Path] = set()
        for directory in targets:
            if directory in seen:
                continue
            seen.add(directory)
            self._join_fds.append(os.open(directory / "cgroup.procs", os.O_WRONLY | os.O_CLOEXEC))
        fds = list(self._join_fds)

        def join() -> None:
            pid = str(os.getpid()).encode()
            for fd in fds:
                os.write(fd, pid)

        return join

    def joined(self) -> None:
        """Called in the parent once the child started: the files are no longer needed."""
        self._close_join_fds()

    def _close_join_fds(self) -> None:
        for fd in self._join_fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        self._join_fds.clear()

    # -- what happened ---------------------------------------------------------------------------
    def exceeded(self) -> str | None:
        """Which limit the group ran into since it was made, in words; None when none."""
        if self.memory_dir is not None:
            kills = self._counter("memory")
            if kills > self._baseline.get("memory", 0):
                return (
                    f"memory limit ({format_bytes(self.limits.memory_bytes, exact=True)}): the "
                    "kernel killed a process that needed more (OOM)"
                )
        if self.pids_dir is not None:
            refused = self._counter("pids")
            if refused > self._baseline.get("pids", 0):
                return (
                    f"process limit ({self.limits.processes} processes and threads): a fork "
                    "was refused"
                )
        return None

    def _counter(self, which: str) -> int:
        if which == "memory":
            assert self.memory_dir is not None
            if self.v2:
                return _keyed(self.memory_dir / "memory.events", "oom_kill")
            return _keyed(self.memory_dir / "memory.oom_control", "oom_kill")
        assert self.pids_dir is not None
        return _keyed(self.pids_dir / "pids.events", "max")

    def record_baseline(self) -> None:
        for which, directory in (("memory", self.memory_dir), ("pids", self.pids_dir)):
            if directory is not None:
                self._baseline[which] = self._counter(which)

    # -- ending ----------------------------------------------------------------------------------
    def kill(self) -> None:
        """SIGKILL every process in the group (all of the sandbox). No-op without a group."""
        directory = self.pids_dir or self.memory_dir
        if directory is None:
            return
        if self.v2 and (directory / "cgroup.kill").exists():
            with contextlib.suppress(OSError):
                (directory / "cgroup.kill").write_text("1")
            return
        for _ in range(_KILL_ROUNDS):  # a fork bomb adds processes while we kill: repeat
            pids = _pids(directory)
            if not pids:
                return
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.01)

    def remove(self) -> None:
        """Remove the group's directories (after `kill`); best effort, retried briefly."""
        self._close_join_fds()
        for directory in {d for d in (self.memory_dir, self.pids_dir) if d is not None}:
            for _ in range(100):
                try:
                    directory.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:  # EBUSY while its last processes exit
                    self.kill()
                    time.sleep(0.02)


def create_limit_group(name: str, limits: SandboxLimits) -> LimitGroup:
    """The best group this process can make for one server (see the module docstring)."""
    unique = f"{_GROUP_PREFIX}{name[:40]}-{uuid.uuid4().hex[:8]}"
    for make in (_make_v2, _make_v1):
        try:
            group = make(unique, limits)
        except OSError:
            group = None
        if group is not None:
            group.record_baseline()
            return group
    return LimitGroup(mechanism="rlimits (no writable cgroup)", limits=limits)


def _make_v2(unique: str, limits: SandboxLimits) -> LimitGroup | None:
    mount = _mount_point("cgroup2", None)
    own = _own_cgroup(None)
    if mount is None or own is None:
        return None
    parent = mount / own.lstrip("/")
    enabled = (parent / "cgroup.subtree_control").read_text().split()
    if not {"memory", "pids"} <= set(enabled):
        return None  # not delegated to us; enabling it would move the server's own processes
    _sweep(parent)
    directory = parent / unique
    directory.mkdir()
    try:
        (directory / "memory.max").write_text(str(limits.memory_bytes))
        if (directory / "memory.swap.max").exists():
            (directory / "memory.swap.max").write_text("0")
        (directory / "pids.max").write_text(str(limits.processes))
    except OSError:
        directory.rmdir()
        raise
    return LimitGroup(
        mechanism="cgroup v2 (memory, pids)",
        limits=limits,
        memory_dir=directory,
        pids_dir=directory,
        v2=True,
    )


def _make_v1(unique: str, limits: SandboxLimits) -> LimitGroup | None:
    memory_mount, pids_mount = _mount_point("cgroup", "memory"), _mount_point("cgroup", "pids")
    memory_own, pids_own = _own_cgroup("memory"), _own_cgroup("pids")
    if None in (memory_mount, pids_mount, memory_own, pids_own):
        return None
    assert memory_mount and pids_mount and memory_own is not None and pids_own is not None
    made: list[Path] = []
    try:
        memory_parent = memory_mount / memory_own.lstrip("/")
        pids_parent = pids_mount / pids_own.lstrip("/")
        _sweep(memory_parent)
        _sweep(pids_parent)
        memory = memory_parent / unique
        memory.mkdir()
        made.append(memory)
        (memory / "memory.limit_in_bytes").write_text(str(limits.memory_bytes))
        memsw = memory / "memory.memsw.limit_in_bytes"
        if memsw.exists():  # swap accounted: no escaping the limit into swap
            memsw.write_text(str(limits.memory_bytes))
        pids = pids_parent / unique
        pids.mkdir()
        made.append(pids)
        (pids / "pids.max").write_text(str(limits.processes))
    except OSError:
        for directory in reversed(made):
            with contextlib.suppress(OSError):
                directory.rmdir()
        raise
    return LimitGroup(
        mechanism="cgroup v1 (memory, pids)", limits=limits, memory_dir=memory, pids_dir=pids
    )


def _mount_point(fstype: str, controller: str | None) -> Path | None:
    """Where a cgroup hierarchy is mounted (`/proc/self/mountinfo`), if it is writable."""
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        left, _, right = line.partition(" - ")
        fields, extra = left.split(), right.split()
        if len(fields) < 5 or len(extra) < 3 or extra[0] != fstype:
            continue
        if controller is not None and controller not in extra[2].split(","):
            continue
        path = Path(fields[4])
        if os.access(path, os.W_OK):
            return path
    return None


def _own_cgroup(controller: str | None) -> str | None:
    """This process's cgroup path in a hierarchy (`/proc/self/cgroup`); None: not in one."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controller is None and controllers == "":
            return path
        if controller is not None and controller in controllers.split(","):
            return path
    return None


def spare_group_name(pid: int) -> str:
    """The name a spare server's group is made under (`create_limit_group`): its owner's pid
    in it, so a killed owner's group goes at the next sweep, however young."""
    return f"{_SPARE_NAME}{pid}"


def sweep_groups() -> None:
    """Remove the empty groups killed engines left in this process's own cgroups now (what
    `create_limit_group` does before it makes one)."""
    for controller, fstype in ((None, "cgroup2"), ("memory", "cgroup"), ("pids", "cgroup")):
        mount, own = _mount_point(fstype, controller), _own_cgroup(controller)
        if mount is not None and own is not None:
            _sweep(mount / own.lstrip("/"))


def _sweep(parent: Path) -> None:
    """Remove empty groups left behind by engines that were killed (never a live one: an
    engine's group holds its server's processes, and a fresh empty one is younger, or names
    its owner: a spare's)."""
    with contextlib.suppress(OSError):
        for entry in parent.iterdir():
            if not entry.name.startswith(_GROUP_PREFIX):
                continue
            with contextlib.suppress(OSError):
                stale = time.time() - entry.stat().st_mtime > _STALE_AFTER_SEC
                if (stale or _owner_gone(entry.name)) and not _pids(entry):
                    entry.rmdir()


def _owner_gone(name: str) -> bool:
    owner = name.removeprefix(f"{_GROUP_PREFIX}{_SPARE_NAME}").split("-", 1)[0]
    return (
        name.startswith(f"{_GROUP_PREFIX}{_SPARE_NAME}")
        and owner.isdigit()
        and (not os.path.exists(f"/proc/{owner}"))
    )


def _pids(directory: Path) -> list[int]:
    try:
        return [int(line) for line in (directory / "cgroup.procs").read_text().split()]
    except (OSError, ValueError):
        return []


def _descendants(root: int) -> list[int]:
    """`root` and every process below it (one pass over `/proc`'s parent links)."""
    children: dict[int, list[int]] = {}
    with contextlib.suppress(OSError):
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            try:
                with open(f"/proc/{entry.name}/stat", "rb") as handle:
                    fields = handle.read().rsplit(b")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if len(fields) > 1:
                children.setdefault(int(fields[1]), []).append(int(entry.name))
    found, stack = [], [root]
    while stack:
        pid = stack.pop()
        found.append(pid)
        stack.extend(children.get(pid, ()))
    return found


def _keyed(path: Path, key: str) -> int:
    try:
        for line in path.read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == key:
                return int(value)
    except (OSError, ValueError):
        pass
    return 0


__all__ = ["LimitGroup", "create_limit_group"]
