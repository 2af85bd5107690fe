"""The engine's event loop and this machine's rollout servers, each on CPUs of their own.

    split = cpu_split.reserve()          # None: one CPU, not Linux, switched off, or taken
    with cpu_split.loop_on_its_cpu(servers=spawn.live_pids()):
        ...                              # the dispatch: this thread on split.loop_cpu, the
                                         # servers and all they started on the other CPUs
    cpu_split.release()

Why: an attempt crosses from the engine to its rollout server and back four times over
loopback, and the scheduler puts a process woken over loopback on the CPU of the one that
woke it. On a machine with few CPUs the engine's event loop and the rollout server then take
turns on one CPU while the other runs neither: the loop waited for a CPU ~0.2 ms per attempt
(/proc's schedstat) against its ~0.5 ms of work. bench/engine.py (b), 2 CPUs, 5 runs each:
dispatch 1.100x its ideal, 1.073x with the loop and the servers on CPUs of their own (the
bare client 1.066x), an attempt +10.2 ms over the model's latency against +7.5 ms. Pinning
only one side changed nothing (1.100x, 1.103x): the other follows it.

Only the dispatch is split. Started on one CPU, a sandboxed server's processes (bwrap, the
shim, the rollout) take turns there while the engine starts on the other: bench/start.py put
the sandbox's start +40-54 ms over an unsandboxed one against +29-35 ms unsplit. So servers
start anywhere and are moved when the dispatch begins; one started during it (a replacement)
starts on the rollout servers' CPUs.

One CPU of the allowed set is the engine's, claimed with a lock file (`flock`) that the kernel
drops when the process ends, so two runs on one machine never pin their loops to the same
CPU: the second runs as before, placed by the scheduler. The lowest CPU is never claimed, so
the rollout servers always keep one. `OSMOSIS_CPU_SPLIT=off` turns it off. The standard
library only, as `spawn` is.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass

from osmosis.eval.sites.process_tree import descendants

SWITCH = "OSMOSIS_CPU_SPLIT"
"""Set to `off` (or 0, false, no) to leave the engine and its servers to the scheduler."""


@dataclass(frozen=True)
class CpuSplit:
    loop_cpu: int
    rollout_cpus: frozenset[int]
    allowed: frozenset[int]  # what the process could use when it reserved

    def describe(self) -> str:
        servers = ", ".join(str(cpu) for cpu in sorted(self.rollout_cpus))
        return (
            f"the engine's event loop runs on CPU {self.loop_cpu}, the rollout servers on "
            f"CPU{'s' if len(self.rollout_cpus) > 1 else ''} {servers} ({SWITCH}=off: "
            "the scheduler places them)"
        )


_reserved: tuple[CpuSplit, int] | None = None  # the split and its lock's file descriptor
_pinned = threading.local()  # .depth: this thread's `loop_on_its_cpu` blocks open
_dispatching = 0  # `loop_on_its_cpu` blocks open in any thread: no release under them


def reserve(environ: Mapping[str, str] | None = None) -> CpuSplit | None:
    """This process's split, reserved now or earlier; None when there is none to make."""
    global _reserved
    if _reserved is not None:
        return _reserved[0]
    if switched_off(environ):
        return None
    if not hasattr(os, "sched_getaffinity"):  # not Linux
        return None
    allowed = sorted(os.sched_getaffinity(0))
    if len(allowed) < 2:
        return None
    directory = _lock_directory()
    if directory is None:
        return None
    for cpu in reversed(allowed[1:]):
        lock = _lock(os.path.join(directory, f"cpu-{cpu}.lock"))
        if lock is None:
            continue  # another osmosis process's loop runs there
        split = CpuSplit(cpu, frozenset(allowed) - {cpu}, frozenset(allowed))
        _reserved = (split, lock)
        return split
    return None


def switched_off(environ: Mapping[str, str] | None = None) -> bool:
    """Whether `OSMOSIS_CPU_SPLIT` says off (off, 0, false, no)."""
    value = (os.environ if environ is None else environ).get(SWITCH, "")
    return value.strip().lower() in {"off", "0", "false", "no"}


def release() -> None:
    """Give the loop's CPU back to other runs (idempotent; not while a dispatch of this
    process still runs on it). Servers already started stay on their CPUs."""
    global _reserved
    if _reserved is not None and _dispatching == 0:
        os.close(_reserved[1])
        _reserved = None


def rollout_hook() -> Callable[[], None] | None:
    """A `preexec_fn` putting a server spawned during a dispatch, and all it starts, on the
    rollout servers' CPUs; None when nothing is reserved or nothing dispatches."""
    if _reserved is None or _dispatching == 0:
        return None
    cpus = _reserved[0].rollout_cpus

    def hook() -> None:
        with contextlib.suppress(OSError):  # CPUs taken away since (cpuset): start anyway
            os.sched_setaffinity(0, cpus)

    return hook


@contextlib.contextmanager
def loop_on_its_cpu(servers: Iterable[int] = ()) -> Iterator[CpuSplit | None]:
    """The calling thread (the event loop's) on the reserved CPU until the block ends, and
    the processes `servers`, with all they started, on the others (`confine`). A thread it
    starts meanwhile is on the loop's CPU too until it calls `off_the_loop`. Nested blocks
    (two runs on one loop) pin once and restore once, at the outermost's end."""
    global _dispatching
    if _reserved is None:
        yield None
        return
    split = _reserved[0]
    depth = getattr(_pinned, "depth", 0)
    if depth == 0:
        _pinned.before = os.sched_getaffinity(0)
        try:
            os.sched_setaffinity(0, {split.loop_cpu})
        except OSError:  # the CPU taken away since (cpuset): the dispatch runs unpinned
            _pinned.before = None
    confine(servers)
    _pinned.depth = depth + 1
    _dispatching += 1
    try:
        yield split
    finally:
        _dispatching -= 1
        _pinned.depth -= 1
        if _pinned.depth == 0 and _pinned.before is not None:
            with contextlib.suppress(OSError):  # a CPU taken away meanwhile (cpuset)
                os.sched_setaffinity(0, _pinned.before)


def confine(pids: Iterable[int]) -> None:
    """Every thread of the processes `pids`, and of every process they started, on the
    rollout servers' CPUs (what each starts from then on inherits it)."""
    if _reserved is None:
        return
    cpus = _reserved[0].rollout_cpus
    for root in pids:
        for pid in (root, *descendants(root)):
            try:
                tasks = os.listdir(f"/proc/{pid}/task")
            except OSError:
                continue  # it ended meanwhile
            for task in tasks:
                with contextlib.suppress(OSError):
                    os.sched_setaffinity(int(task), cpus)


def off_the_loop() -> None:
    """Let the calling thread (a writer's) run on any CPU of the process again: its work
    would otherwise take turns with the loop's on the loop's CPU."""
    if _reserved is not None:
        with contextlib.suppress(OSError):
            os.sched_setaffinity(0, _reserved[0].allowed)


def _lock_directory() -> str | None:
    """`$TMPDIR/osmosis-cpus-<uid>`, made private; None when it cannot be, or is not ours
    alone."""
    path = os.path.join(tempfile.gettempdir(), f"osmosis-cpus-{os.getuid()}")
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError:
        return None
    try:
        info = os.lstat(path)
    except OSError:
        return None
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o022:
        # A file, another user's directory or one others may write to: no claim through it.
        return None
    return path


def _lock(path: str) -> int | None:
    """An open descriptor holding `path`'s exclusive lock, or None if another holds it."""
    try:
        descriptor = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError:
        return None
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(descriptor)
        return None
    return descriptor


__all__ = [
    "SWITCH",
    "CpuSplit",
    "confine",
    "loop_on_its_cpu",
    "off_the_loop",
    "release",
    "reserve",
    "rollout_hook",
    "switched_off",
]
