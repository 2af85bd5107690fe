"""What a sandboxed rollout server sees: the bwrap arguments for its file system.

    args = bwrap_mounts(layout)   # ['--ro-bind', '/usr', '/usr', ..., '--bind', outbox, '/outbox']
    layout.inside(layout.rollout_dir)  # '/workspace/rollouts/multiply'

What belongs to the run is seen at fixed paths, never at the host's: the checkout at
`/workspace`, the rollout's venv at `/venv` (it was built there, `sandbox.build`), the outbox
(`_OSMOSIS_ROLLOUT_ARTIFACT_ROOT`) at `/outbox`; so a rollout's errors and tracebacks name
`/workspace/rollouts/x/main.py`, not where the platform keeps its checkouts. (The kernel still
lists each bind's source directory in `/proc/self/mountinfo`: names, never contents.)
The interpreter a venv was made from, and the engine's own when there is no venv, are bound at
their own paths, as `pyvenv.cfg` names them. Visible, in this order:

- read-only: `/usr` (and `/bin`, `/lib`… as on the host), a short list of `/etc` files that
  programs need and that hold nothing private (the loader cache, CA certificates, time zone,
  `services`…), generated `passwd`/`group`/`hosts`/`hostname` (and `resolv.conf` for `full`),
  the interpreter (the venv, and the Python it was made from: `pyvenv.cfg`'s `home`, the
  resolved `bin/python`), the workspace checkout;
- hidden again under an empty tmpfs: `hidden` paths inside those binds (a local workspace's
  `.osmosis/`, where other runs and environments live);
- read-write: the run's outbox (each attempt's `trajectory.json` and `artifacts/`);
- fresh: `/proc` of the sandbox's own PID namespace, a minimal `/dev`, tmpfs `/tmp`
  (size-capped) and `HOME` (`/home/rollout`), `/run/osmosis/` with the shim and the bridge's
  hand-over socket directory (read-only).

Nothing else of the host exists inside: no `/sys`, `/run`, `/var`, `/root`, `/home`, no other
checkout, run, environment or the platform's home.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import marshal
import os
import stat
import sys
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from osmosis.eval.sites.sandbox.policy import NetworkMode
from osmosis.eval.sites.sandbox.support import system_binds
from osmosis.user_cache import user_cache_dir

SANDBOX_HOME = "/home/rollout"
SANDBOX_RUN = "/run/osmosis"
SHIM_PATH = f"{SANDBOX_RUN}/shim.py"
SHIM_COMPILED_PATH = f"{SANDBOX_RUN}/shim.pyc"
BRIDGE_DIR = f"{SANDBOX_RUN}/bridge"
HANDOFF_SOCKET = f"{BRIDGE_DIR}/handoff.sock"  # the shim hands the bridge connections here
SANDBOX_USER = "rollout"
SANDBOX_WORKSPACE = "/workspace"
SANDBOX_VENV = "/venv"
SANDBOX_OUTBOX = "/outbox"

# /etc entries a program may read that hold nothing private (no shadow, no ssh, no sudoers).
_ETC_PASSTHROUGH = (
    "alternatives",
    "ca-certificates",
    "ca-certificates.conf",
    "debian_version",
    "gai.conf",
    "host.conf",
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "localtime",
    "mime.types",
    "nsswitch.conf",
    "os-release",
    "pki",
    "protocols",
    "services",
    "ssl",
    "timezone",
)
_SYSTEM_PREFIXES = (Path("/usr"),)
# The sandbox's uid is the engine's outside; when that is root, files in /proc that only check
# ownership (sysctls such as kernel.core_pattern: a host escape; sysrq-trigger) would be
# writable. /proc/sys is covered read-only (its values are the sandbox's own namespaces'),
# the rest of what container runtimes hide is covered by /dev/null or an empty tmpfs.
_PROC_FILES = (
    "sysrq-trigger",
    "kcore",
    "keys",
    "timer_list",
    "sched_debug",
    "latency_stats",
    "kmsg",
)
_PROC_DIRS = ("acpi", "asound", "scsi", "fs")


def _proc_covers() -> list[str]:
    """Only what exists (the sandbox's /proc has the host kernel's entries): bwrap cannot
    create a mount point inside procfs."""
    args = ["--ro-bind", "/proc/sys", "/proc/sys"]
    for name in _PROC_FILES:
        if os.path.exists(f"/proc/{name}"):
            args += ["--ro-bind", "/dev/null", f"/proc/{name}"]
    for name in _PROC_DIRS:
        if os.path.isdir(f"/proc/{name}"):
            args += ["--tmpfs", f"/proc/{name}"]
    return args


@dataclass(frozen=True)
class SandboxLayout:
    """The host paths one sandbox is made of."""

    workspace: Path
    """The run's checkout (or local workspace): read-only."""
    rollout_dir: Path
    """Where the server starts (its cwd); inside `workspace` normally."""
    trials_root: Path
    """The run's trial directory: the one writable place."""
    python: Path
    """The interpreter that runs the entrypoint."""
    venv: Path | None
    """The rollout's venv; None: `python` is the engine's own interpreter."""
    site_dir: Path
    """The site's private directory: `bridge/` (socket) and `etc/` (generated files)."""
    shim: Path
    """The shim (`shim.py`), or its bytecode for the rollout's interpreter (`compile_shim`)."""
    network: NetworkMode = "bridge"
    tmp_bytes: int = 1024**3
    hidden: Sequence[Path] = field(default_factory=tuple)
    """Paths inside the read-only binds that must not be visible (masked by a tmpfs)."""

    @property
    def shim_inside(self) -> str:
        """Where the shim is seen in the sandbox: `SHIM_COMPILED_PATH` for bytecode."""
        return SHIM_COMPILED_PATH if self.shim.suffix == ".pyc" else SHIM_PATH

    def inside(self, path: Path) -> str:
        """Where a host path of the checkout, the venv or the outbox is seen in the sandbox;
        any other path is bound at its own."""
        return seen_inside(
            path,
            [
                *([(self.venv, SANDBOX_VENV)] if self.venv is not None else []),
                (self.trials_root, SANDBOX_OUTBOX),
                (self.workspace, SANDBOX_WORKSPACE),
            ],
        )


def seen_inside(path: Path, binds: Sequence[tuple[Path, str]]) -> str:
    """`path` as seen through the first of `binds` (host directory, inside path) holding it."""
    for outside, seen in binds:
        try:
            rest = Path(path).relative_to(outside)
        except ValueError:
            continue
        return seen if rest == Path(".") else f"{seen}/{rest.as_posix()}"
    return str(path)


def base_mounts(site_dir: Path, network: NetworkMode, *, tmp_bytes: int) -> list[str]:
    """What every sandbox has, a rollout server's or an environment build's: fresh `/proc`,
    `/dev`, size-capped tmpfs `/tmp` and `HOME`, `/run`, the system directories, the harmless
    `/etc` files and the generated ones of `site_dir/etc` (`write_etc`)."""
    # Fresh file systems first: a bind below (a checkout under /tmp) must land on top of them.
    args = ["--proc", "/proc", *_proc_covers(), "--dev", "/dev"]
    args += ["--size", str(tmp_bytes), "--tmpfs", "/tmp"]
    args += ["--size", str(tmp_bytes), "--tmpfs", SANDBOX_HOME, "--tmpfs", "/run"]
    args += system_binds()
    for name in _ETC_PASSTHROUGH:
        path = Path("/etc") / name
        args += ["--ro-bind-try", str(path), str(path)]
    etc = site_dir / "etc"
    generated = ["passwd", "group", "hosts", "hostname"]
    if network == "full":
        generated.append("resolv.conf")
    for name in generated:
        args += ["--ro-bind", str(etc / name), f"/etc/{name}"]
    return args


def bwrap_mounts(layout: SandboxLayout) -> list[str]:
    """The file-system half of the bwrap command line (see the module docstring)."""
    args = base_mounts(layout.site_dir, layout.network, tmp_bytes=layout.tmp_bytes)
    bound = interpreter_dirs(layout.python, layout.venv, with_venv=False)
    for path in bound:
        args += ["--ro-bind", str(path), str(path)]
    masked = [
        path
        for path in outermost(layout.hidden)
        if path.exists() and any(_within(path, b) and path != b for b in bound)
    ]
    for path in masked:
        args += ["--tmpfs", str(path)]
    args += ["--ro-bind", str(layout.workspace), SANDBOX_WORKSPACE]
    for path in outermost(layout.hidden):  # a local workspace's `.osmosis/`: other runs
        if path.exists() and _within(path, layout.workspace) and path != layout.workspace:
            args += ["--tmpfs", layout.inside(path)]
    if layout.venv is not None:
        args += ["--ro-bind", str(layout.venv), SANDBOX_VENV]
    args += ["--bind", str(layout.trials_root), SANDBOX_OUTBOX]
    args += ["--ro-bind", str(layout.shim), layout.shim_inside]
    args += ["--ro-bind", str(layout.site_dir / "bridge"), BRIDGE_DIR]
    args += ["--chdir", layout.inside(layout.rollout_dir)]
    return args


_compiled: dict[tuple[Path, int, int], bytes] = {}  # the shim's .pyc, by source and its stat


def compile_shim(source: Path, python: Path, target: Path) -> Path:
    """The shim to bind: `target`, its bytecode written there, when `python` is this very
    interpreter (the same binary: the same bytecode); else `source`, compiled at each start.

    A script is compiled at every run, never cached: ~500 lines cost the shim ~5 ms of CPU
    before it spawns the rollout server (`bench/sandbox.py`). Compiled here instead (and kept:
    `shim_bytecode`), named as the sandbox sees it (`SHIM_COMPILED_PATH`), not by its host
    path."""
    if not runs_our_bytecode(python):
        return source
    target.write_bytes(shim_bytecode(source))
    return target


def runs_our_bytecode(python: Path) -> bool:
    """Whether `python` is the binary this process runs (a venv's `bin/python` links to it)."""
    ours = {Path(sys.executable), Path(getattr(sys, "_base_executable", sys.executable))}
    return Path(python).resolve() in {path.resolve() for path in ours}


def shim_bytecode(source: Path) -> bytes:
    """`source` compiled for this interpreter, as the bytes of a .pyc file: once per process
    and version of the file, and kept between processes (`shim_cache_dir`)."""
    info = source.stat()
    key = (source, info.st_mtime_ns, info.st_size)
    data = _compiled.get(key)
    if data is None:
        text = source.read_bytes()
        # PEP 552's header (magic, flags 0: by time stamp, mtime, size); a .pyc run as a
        # script is checked for its magic number only.
        header = importlib.util.MAGIC_NUMBER + (0).to_bytes(4, "little")
        header += (int(info.st_mtime) & 0xFFFFFFFF).to_bytes(4, "little")
        header += (info.st_size & 0xFFFFFFFF).to_bytes(4, "little")
        kept = shim_cache_dir() / (
            f"{sys.implementation.cache_tag}-{importlib.util.MAGIC_NUMBER.hex()}-"
            f"{hashlib.sha256(text).hexdigest()[:32]}.pyc"
        )
        data = _kept_bytecode(kept)
        if data is None:
            code = compile(text, SHIM_COMPILED_PATH, "exec", dont_inherit=True)
            data = header + marshal.dumps(code)
            _keep(kept, data)
        _compiled[key] = data
    return data


def shim_cache_dir() -> Path:
    """`$XDG_CACHE_HOME/osmosis/shim`: compiling the shim is 4-11 ms of a sandboxed run's
    start, before its rollout server can be spawned; reading it back is ~0.1 ms."""
    return user_cache_dir() / "shim"


def _kept_bytecode(path: Path) -> bytes | None:
    """The cached .pyc at `path` if it is one this interpreter loads, else None (missing,
    unreadable, cut short or not bytecode at all: compiled again and replaced).

    It runs in every sandbox, beside the rollout's secrets: a file another user could have
    put or changed there (a link, not ours, writable by group or others; a shared
    `XDG_CACHE_HOME`) is not trusted either."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(fd)
        if (
            not stat.S_ISREG(info.st_mode)
            or info.st_uid != os.geteuid()
            or info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
        ):
            return None
        try:
            data = handle.read()
        except OSError:
            return None
    if not data.startswith(importlib.util.MAGIC_NUMBER):
        return None
    try:
        marshal.loads(data[16:])
    except (EOFError, ValueError, TypeError):
        return None
    return data


def _keep(path: Path, data: bytes) -> None:
    """Write `data` to `path` whole or not at all (a unique temporary file, then a rename:
    runs starting together each write their own); a cache that cannot be written is skipped."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".shim-", suffix=".tmp")
    except OSError:
        return
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(tmp)


def write_etc(site_dir: Path, network: NetworkMode) -> None:
    """The generated `/etc` files of every sandbox of a site: a user of our own (uid 1000),
    loopback names, and slirp4netns' DNS for `full`."""
    etc = site_dir / "etc"
    etc.mkdir(parents=True, exist_ok=True)
    files = {
        "passwd": f"{SANDBOX_USER}:x:1000:1000:rollout:{SANDBOX_HOME}:/bin/sh\n"
        "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
        "group": f"{SANDBOX_USER}:x:1000:\nnogroup:x:65534:\n",
        "hosts": "127.0.0.1 localhost\n::1 localhost ip6-localhost ip6-loopback\n",
        "hostname": "osmosis-sandbox\n",
    }
    if network == "full":
        files["resolv.conf"] = "nameserver 10.0.2.3\n"  # slirp4netns' DNS forwarder
    for name, text in files.items():
        (etc / name).write_text(text)
    (site_dir / "bridge").mkdir(exist_ok=True)


def interpreter_dirs(python: Path, venv: Path | None, *, with_venv: bool = True) -> list[Path]:
    """The directories an interpreter needs, outside `/usr`: the venv (unless `with_venv` is
    False: the sandbox binds it at `/venv`) and the Python it was made from; for the engine's
    own interpreter, its prefixes. And our SDK's source when it is a development install.

    Never paths a venv's own files name (`.pth` lines: a dependency could name any directory),
    nor the engine's `sys.path` (`python -m` puts the working directory there, `/root` say).
    """
    found: list[Path] = []
    if venv is not None:
        if with_venv:
            found.append(venv)
        home = _pyvenv_home(venv / "pyvenv.cfg")
        if home is not None:
            found.append(home.parent if home.name == "bin" else home)
        resolved = (venv / "bin" / "python").resolve()
        found.append(resolved.parent.parent)
    else:
        found += [Path(sys.prefix), Path(sys.base_prefix), Path(sys.exec_prefix)]
        found.append(Path(os.path.realpath(python)).parent.parent)
    # Our own SDK when it is a development install (`-e`): the venv's .pth points at it.
    import osmosis

    found.append(Path(osmosis.__file__).resolve().parent.parent)
    kept: list[Path] = []
    for path in found:
        path = Path(os.path.realpath(path)) if path.is_symlink() else path
        if not path.exists() or any(_within(path, system) for system in _SYSTEM_PREFIXES):
            continue
        kept.append(path)
    return outermost(kept)


def _pyvenv_home(config: Path) -> Path | None:
    try:
        lines = config.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        key, _, value = line.partition("=")
        if key.strip() == "home" and value.strip():
            return Path(value.strip())
    return None


def outermost(paths: Iterable[Path]) -> list[Path]:
    """Each path once, leaving out those inside another one of the list."""
    unique = sorted({Path(p) for p in paths}, key=lambda p: len(p.parts))
    kept: list[Path] = []
    for path in unique:
        if not any(_within(path, outer) for outer in kept):
            kept.append(path)
    return kept


def _within(path: Path, outer: Path) -> bool:
    return path == outer or outer in path.parents


__all__ = [
    "HANDOFF_SOCKET",
    "SANDBOX_HOME",
    "SANDBOX_OUTBOX",
    "SANDBOX_RUN",
    "SANDBOX_VENV",
    "SANDBOX_WORKSPACE",
    "SHIM_COMPILED_PATH",
    "SHIM_PATH",
    "SandboxLayout",
    "base_mounts",
    "bwrap_mounts",
    "compile_shim",
    "interpreter_dirs",
    "outermost",
    "seen_inside",
    "write_etc",
]
