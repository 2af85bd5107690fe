"""A sandboxed rollout server started before its run, held until that run's site adopts it.

    spare = start_spare(environment, rollout_dir, "main.py", env=variables, policy=policy,
                        workspace=checkout, trials_root=spare_dir / "rollout_trials")
    hold(spare)                           # (`sandbox.launcher.start_spare`): a warm worker
    ...                                   # a run is claimed, checked out, planned
    address = take_bridge("127.0.0.1")    # the run's bridge listens where the spare looks
    site = SandboxSite(...)               # `start` claims it: the same launch? adopted;
    await site.start(1)                   # else killed, and the run starts its own

A sandboxed server takes ~0.25 s to answer (bwrap, the interpreter, uvicorn, the rollout's
imports): most of what a platform run pays between its claim and its first dispatch (issue
30). A spare is started while the machine is idle, for the launch the next run will most
likely make (the same commit submitted again with another model, say), and adopted only when
that run's site would make exactly this launch: the same interpreter, sandbox policy, masked
paths and bridge port, the checkout and outbox the very directories the spare binds (renamed
into the run's places: a bind follows the directory), and the same command, directory and
environment but for the variables drawn per process (`Prestarted.difference`). Anything
else: it is killed, and the run's log names what differed (names, never values).

A spare has served no attempt; it dies with the process that started it (the kernel's
parent-death signal, bwrap's `--die-with-parent`), and `kill()` leaves nothing of it: no
process, cgroup, socket or directory.
"""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from osmosis.eval.sites.prestart import Prestarted
from osmosis.eval.sites.sandbox import disk
from osmosis.eval.sites.sandbox.policy import SandboxPolicy
from osmosis.eval.sites.spawn import Interpreter, Launch, rollout_launch

if TYPE_CHECKING:
    from osmosis.eval.model.bridge_address import BridgeAddress
    from osmosis.eval.sites.sandbox.limits import LimitGroup
    from osmosis.eval.sites.sandbox.network import Slirp
    from osmosis.eval.sites.sandbox.support import SandboxSupport


class _Site(Protocol):
    """What `Spare.difference` reads of the site that would adopt it (`SandboxSite`)."""

    rollout_dir: Path
    entrypoint: str | Path
    env: dict[str, str]
    base_env: Mapping[str, str] | None
    policy: SandboxPolicy
    workspace: Path
    outbox: Path
    hidden: tuple[Path, ...]
    bridge_port: int

    @property
    def environment(self) -> Interpreter: ...


@dataclass
class Spare:
    """A spare server: its process (`early`), and what the site that adopts it takes over."""

    early: Prestarted
    environment: Interpreter
    policy: SandboxPolicy
    hidden: tuple[Path, ...]
    workspace: Path
    """The checkout it binds (resolved), as it was named at the start."""
    workspace_inode: tuple[int, int]
    outbox: Path
    """Its outbox (resolved); the site renames it to its own."""
    trials_root: Path
    site_dir: Path
    shim: Path
    support: SandboxSupport
    group: LimitGroup
    socket_path: Path
    slirp: Slirp | None
    bridge_port: int
    bridge: BridgeAddress | None
    """The bridge's socket, bound on `bridge_port`, until the run takes it (`take_bridge`)."""

    @property
    def age(self) -> float:
        return time.monotonic() - self.early.began

    def ready(self, timeout: float) -> bool:
        """Wait up to `timeout` s for it to be about to listen (its readiness pipe readable,
        left unread for the adopting site), or to die. Until then bwrap may still be binding
        its directories by name: they are renamed only once this said True."""
        readable, _, _ = select.select([self.early.ready_fd], [], [], timeout)
        return bool(readable) and self.early.popen.poll() is None

    def difference(self, site: _Site, probed: SandboxSupport) -> str | None:
        """What differs between this server and the one `site` would start (None: nothing),
        `probed` the sandbox probe's answer (the spare may have started before it); names
        only, never a value (the environment holds secrets)."""
        if not probed.available or (probed.bwrap, probed.disable_userns) != (
            self.support.bwrap,
            self.support.disable_userns,
        ):
            return "sandbox support"
        if (site.environment.python, site.environment.venv) != (
            self.environment.python,
            self.environment.venv,
        ):
            return "interpreter"
        if site.policy != self.policy:
            return "sandbox policy and limits"
        if site.bridge_port != self.bridge_port:
            return "bridge port"
        try:
            info = os.stat(site.workspace)
        except OSError:
            return "checkout"
        if (info.st_dev, info.st_ino) != self.workspace_inode:
            return "checkout"
        # The site's paths as the spare named the same directories.
        paths = {
            str(site.workspace): str(self.workspace),
            str(site.outbox.resolve()): str(self.outbox),
        }
        if tuple(_moved(str(path), paths) for path in site.hidden) != tuple(
            str(path) for path in self.hidden
        ):
            return "masked paths"
        expected = rollout_launch(
            site.environment,
            site.rollout_dir,
            site.entrypoint,
            env=site.env,
            base_env=os.environ if site.base_env is None else site.base_env,
            artifact_root=site.outbox,
            port=self.early.port,
            instance_id=self.early.instance_id,
        )
        return self.early.difference(_renamed(expected, paths))

    def kill(self) -> None:
        """SIGKILL it and remove everything it held. Idempotent."""
        if self.early.popen.returncode is None:
            self.early.kill()
        self.release()

    def release(self) -> None:
        """Remove what it held but its process (gone, or the adopting site's now): its cgroup,
        network, socket, site directory, outbox and bridge socket."""
        self.group.kill()
        self.group.remove()
        if self.slirp is not None:
            self.slirp.stop()
        with contextlib.suppress(OSError):
            self.socket_path.unlink()
        shutil.rmtree(self.site_dir, ignore_errors=True)
        disk.remove_stale(self.trials_root)
        if self.bridge is not None:
            self.bridge.close()
            self.bridge = None


_HELD: Spare | None = None
_BRIDGE_HOST: str | None = None


def hold(spare: Spare, *, bridge_host: str = "127.0.0.1") -> None:
    """Keep `spare` for the next sandboxed site of this process (killing one held before)."""
    global _HELD, _BRIDGE_HOST
    discard()
    _HELD, _BRIDGE_HOST = spare, bridge_host


def claim() -> Spare | None:
    """The spare held, now the caller's to adopt or kill; None when there is none."""
    global _HELD
    spare, _HELD = _HELD, None
    return spare


def peek() -> Spare | None:
    """The spare held, left held."""
    return _HELD


def take_bridge(host: str, advertise_url: str | None = None) -> BridgeAddress | None:
    """The held spare's bridge socket, for the run's bridge to listen on (the port the spare's
    sandbox forwards), when the run would bind the same host and advertise no URL of its own;
    None otherwise (the run binds its own, and its site will not adopt the spare)."""
    spare = _HELD
    if spare is None or spare.bridge is None or advertise_url or host != _BRIDGE_HOST:
        return None
    bridge, spare.bridge = spare.bridge, None
    return bridge


def discard() -> None:
    """Kill a spare nobody claimed (the process is ending, or its run starts no sandboxed
    server). Idempotent."""
    spare = claim()
    if spare is not None:
        spare.kill()


def _renamed(launch: Launch, paths: Mapping[str, str]) -> Launch:
    """`launch` with each path in `paths` (and what lies under it) named by its new path."""
    return Launch(
        [_moved(arg, paths) for arg in launch.argv],
        {name: _moved(value, paths) for name, value in launch.env.items()},
        Path(_moved(str(launch.cwd), paths)),
    )


def _moved(value: str, paths: Mapping[str, str]) -> str:
    for old, new in paths.items():
        if value == old or value.startswith(old + "/"):
            return new + value[len(old) :]
    return value


__all__ = ["Spare", "claim", "discard", "hold", "peek", "take_bridge"]
