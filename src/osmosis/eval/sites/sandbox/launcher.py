"""A sandboxed rollout server's launch: its site directory, the bwrap + shim command line, and
a server started ahead of its site (a spare).

    site_dir = prepare_site(policy, trials_root, outbox)   # a checked sandbox: its /etc
    place = SandboxPlace(support, site_dir, shim, policy, venv, workspace, outbox, (), port)
    launch = Launcher(place, group, listener, socket_path).wrap(launch)  # for RolloutProcess
    spare = start_spare(environment, rollout_dir, "main.py", env={}, policy=policy, ...)

No pydantic, no rollout protocol, no asyncio: `osmosis eval run --sandbox` starts its server
with this at the command's entry (`osmosis.cli.prestart`), before the command has imported
anything else, and `SandboxSite` launches every server it starts with the same code.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import signal
import socket
import tempfile
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from osmosis.eval.model.bridge_address import LISTEN_BACKLOG
from osmosis.eval.sites import prestart
from osmosis.eval.sites.process_tree import descendants
from osmosis.eval.sites.sandbox import disk, spare
from osmosis.eval.sites.sandbox.environment import clean_base_env
from osmosis.eval.sites.sandbox.layout import (
    HANDOFF_SOCKET,
    SANDBOX_HOME,
    SHIM_COMPILED_PATH,
    SHIM_PATH,
    SandboxLayout,
    bwrap_mounts,
    compile_shim,
    write_etc,
)
from osmosis.eval.sites.sandbox.limits import LimitGroup, create_limit_group, spare_group_name
from osmosis.eval.sites.sandbox.policy import SandboxPolicy
from osmosis.eval.sites.sandbox.support import (
    SandboxSupport,
    find_bwrap,
    known_support,
    namespace_flags,
    probe_soon,
)
from osmosis.eval.sites.spawn import (
    Interpreter,
    Launch,
    lifeline,
    ready_pipe,
    rollout_launch,
    spawn,
)
from osmosis.eval.sites.spawn import _free_port as free_port

if TYPE_CHECKING:
    from osmosis.eval.sites.sandbox.network import Slirp

SHIM_SOURCE = Path(__file__).resolve().with_name("shim.py")
SITE_PREFIX = "osmosis-sbx-"
_INFO_WAIT_SEC = 10.0


@dataclass(frozen=True)
class SandboxPlace:
    """What every server of one site shares: the sandbox, the site's directory (its `/etc`,
    the shim, the sockets), the policy and what the server sees of the run."""

    support: SandboxSupport
    site_dir: Path
    shim: Path
    """The shim the sandbox runs: its source, or bytecode in `site_dir` (`compile_shim`)."""
    policy: SandboxPolicy
    venv: Path | None
    workspace: Path
    outbox: Path
    hidden: tuple[Path, ...]
    bridge_port: int


def outbox_for(trials_root: Path) -> Path:
    """Where a site's servers write their attempts: beside the run's `trials_root`."""
    return trials_root.parent / f"{trials_root.name}{disk.OUTBOX_SUFFIX}"


def prepare_site(policy: SandboxPolicy, trials_root: Path, outbox: Path) -> Path:
    """Clear what killed engines left, and make a site's directory (0700: ours only) with its
    `/etc` files, and the outbox: the site's directory. Leaves nothing behind when it
    raises."""
    sweep_site_dirs()
    # A killed engine's outbox (the run is resumed): its files belong to no one now.
    disk.remove_stale(trials_root)
    site_dir = Path(tempfile.mkdtemp(prefix=SITE_PREFIX))
    try:
        (site_dir / "owner.pid").write_text(str(os.getpid()))
        write_etc(site_dir, policy.network)
        outbox.mkdir(parents=True, exist_ok=True)
    except BaseException:
        shutil.rmtree(site_dir, ignore_errors=True)
        raise
    return site_dir


def sweep_site_dirs() -> None:
    """Remove site directories left by engines that were killed (their owner is gone)."""
    for directory in Path(tempfile.gettempdir()).glob(f"{SITE_PREFIX}*"):
        try:
            owner = int((directory / "owner.pid").read_text())
        except (OSError, ValueError):
            continue
        if owner != os.getpid() and not Path(f"/proc/{owner}").exists():
            shutil.rmtree(directory, ignore_errors=True)


class Launcher:
    """Wraps one launch in bwrap + the shim; for `full` network, attaches slirp4netns while
    bwrap waits (`--info-fd` tells the sandbox's pid, `--block-fd` holds the command)."""

    def __init__(
        self, place: SandboxPlace, group: LimitGroup, listener: socket.socket, socket_path: Path
    ) -> None:
        self.place = place
        self.group = group
        self.listener = listener
        self.socket_path = socket_path
        self.slirp: Slirp | None = None
        self._pipes: dict[str, int] = {}

    def wrap(self, launch: Launch) -> Launch:
        place, support = self.place, self.place.support
        assert support.bwrap is not None
        policy = place.policy
        venv = place.venv
        layout = SandboxLayout(
            workspace=place.workspace,
            rollout_dir=launch.cwd,
            trials_root=place.outbox.resolve(),
            python=Path(launch.argv[0]),
            venv=venv.resolve() if venv is not None else None,
            site_dir=place.site_dir,
            shim=place.shim,
            network=policy.network,
            tmp_bytes=policy.limits.memory_bytes,
            hidden=place.hidden,
        )
        argv = [
            str(support.bwrap),
            *namespace_flags(disable_userns=support.disable_userns),
            *bwrap_mounts(layout),
        ]
        alive = lifeline()
        pass_fds = [self.listener.fileno(), alive]
        if policy.network == "full":
            info_read, info_write = os.pipe()
            block_read, block_write = os.pipe()
            self._pipes = {"info_read": info_read, "info_write": info_write}
            self._pipes |= {"block_read": block_read, "block_write": block_write}
            argv += ["--info-fd", str(info_write), "--block-fd", str(block_read)]
            pass_fds += [info_write, block_read]
        # The venv's python and the entrypoint as seen inside; the engine's own interpreter
        # (no venv) is bound at its own path.
        python = launch.argv[0] if venv is None else layout.inside(Path(launch.argv[0]))
        command = [python, *(layout.inside(Path(arg)) for arg in launch.argv[1:])]
        argv += [
            "--",
            command[0],
            "-I",  # the shim: no site, no user paths, no PYTHON* variables
            "-S",
            layout.shim_inside,
            "--listen-fd",
            str(self.listener.fileno()),
            "--rollout-port",
            launch.env["_OSMOSIS_ROLLOUT_PORT"],
            "--bridge-port",
            str(place.bridge_port),
            "--handoff-socket",
            HANDOFF_SOCKET,
            *(f"--rlimit={limit}" for limit in self.group.shim_rlimits()),
            "--lifeline-fd",
            str(alive),
            "--",
            *command,
        ]
        return Launch(
            argv=argv,
            env=env_inside(launch.env, layout),
            cwd=launch.cwd,
            pass_fds=tuple(pass_fds),
            preexec=self.group.prepare_join(),
            socket_path=self.socket_path,
            started=self.started,
            terminate=terminate_shim,
        )

    def started(self, pid: int) -> None:
        self.group.joined()
        self.listener.close()
        if not self._pipes:
            return
        from osmosis.eval.sites.sandbox.network import Slirp  # `full` network only

        os.close(self._pipes.pop("info_write"))
        os.close(self._pipes.pop("block_read"))
        sandbox_pid = _read_child_pid(self._pipes["info_read"])
        self.slirp = Slirp.attach(sandbox_pid)
        os.write(self._pipes["block_write"], b"1")  # bwrap may now exec the shim
        self.release()

    def release(self) -> None:
        for fd in self._pipes.values():
            with contextlib.suppress(OSError):
                os.close(fd)
        self._pipes.clear()


def start_spare(
    environment: Interpreter,
    rollout_dir: Path,
    entrypoint: str | Path,
    *,
    env: Mapping[str, str],
    policy: SandboxPolicy,
    workspace: Path,
    trials_root: Path,
    hidden: Sequence[Path] = (),
    base_env: Mapping[str, str] | None = None,
    bridge_host: str = "127.0.0.1",
) -> spare.Spare:
    """A spare (`sandbox.spare`): spawn the server a `SandboxSite` with these arguments would
    start first, on this thread (its parent-death signal follows it), without waiting for it
    to answer: the site that adopts it does. `trials_root` is the spare's own (its outbox is
    beside it); `workspace` is a checkout the run will take as is. Raises what the site's
    start would (`OSError`, `SandboxUnavailable`, `SubprocessError`), leaving nothing behind."""
    from osmosis.eval.model.bridge_address import BridgeAddress

    if base_env is None:  # as `SandboxSite` defaults it
        base_env = clean_base_env(os.environ, home=SANDBOX_HOME)
    workspace = workspace.resolve()
    outbox = outbox_for(trials_root)
    bridge = BridgeAddress.listen(bridge_host)
    port = bridge.sock.getsockname()[1]
    site_dir: Path | None = None
    group: LimitGroup | None = None
    socket_path: Path | None = None
    # No working answer kept: the probe (~10-50 ms) runs once the server is spawned, not
    # before, and the adopting site checks its answer (`Spare.difference`). A bwrap that
    # cannot sandbox fails the spare; the site then probes and says why.
    known = known_support(policy.bwrap)
    support = known or SandboxSupport(True, find_bwrap(policy.bwrap), None, disable_userns=True)
    try:
        support.require()
        info = os.stat(workspace)  # what the adopting site checks it binds
        site_dir = prepare_site(policy, trials_root, outbox)
        shim = compile_shim(SHIM_SOURCE, environment.python, site_dir / "shim.pyc")
        place = SandboxPlace(
            support=support,
            site_dir=site_dir,
            shim=shim,
            policy=policy,
            venv=environment.venv,
            workspace=workspace,
            outbox=outbox,
            hidden=tuple(hidden),
            bridge_port=port,
        )
        name = spare_group_name(os.getpid())
        group = create_limit_group(name, policy.limits)
        socket_path = site_dir / f"{name}-{uuid.uuid4().hex[:8]}.sock"
        launch = rollout_launch(
            environment,
            rollout_dir,
            entrypoint,
            env=env,
            base_env=base_env,
            artifact_root=outbox,
            port=free_port(),
            instance_id=uuid.uuid4().hex,
        )
        plain = Launch(list(launch.argv), dict(launch.env), launch.cwd)  # before the readiness fd
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
            listener.bind(str(socket_path))
            listener.listen(LISTEN_BACKLOG)  # as the site's own start
            launcher = Launcher(place, group, listener, socket_path)
            ready_read, ready_write = ready_pipe(launch)
            try:
                popen = spawn(launcher.wrap(launch), ready_write)
            except BaseException:
                os.close(ready_read)
                launcher.release()
                raise
    except BaseException:
        if group is not None:
            group.kill()
            group.remove()
        if site_dir is not None:
            shutil.rmtree(site_dir, ignore_errors=True)
        disk.remove_stale(trials_root)
        bridge.close()
        raise
    if known is None:
        probe_soon(policy.bwrap)  # once the server is spawned: see above
    early = prestart.Prestarted(
        popen,
        plain,
        int(launch.env["_OSMOSIS_ROLLOUT_PORT"]),
        launch.env["_OSMOSIS_ROLLOUT_INSTANCE_ID"],
        ready_read,
        time.monotonic(),
    )
    return spare.Spare(
        early=early,
        environment=environment,
        policy=policy,
        hidden=place.hidden,
        workspace=workspace,
        workspace_inode=(info.st_dev, info.st_ino),
        outbox=outbox.resolve(),
        trials_root=trials_root,
        site_dir=site_dir,
        shim=shim,
        support=support,
        group=group,
        socket_path=socket_path,
        slirp=launcher.slirp,
        bridge_port=port,
        bridge=bridge,
    )


def terminate_shim(pid: int) -> None:
    """Ask the sandboxed server to stop: SIGTERM to the shim, which passes it on to the rollout
    and exits with it, and bwrap (and its namespace) with them. SIGTERM to bwrap's process
    group would end the outer bwrap alone, and its `--die-with-parent` would then kill the
    rest before a lifespan's shutdown could run. No shim found (not started yet, or gone):
    the group's SIGTERM."""
    shim = descendant_running(pid, (SHIM_PATH, SHIM_COMPILED_PATH))
    try:
        if shim is not None:
            os.kill(shim, signal.SIGTERM)
        else:
            os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        pass


def descendant_running(pid: int, scripts: tuple[str, ...]) -> int | None:
    """The first process below `pid` that runs one of `scripts`: its first argument that is
    not an option (`python -I -S script …`; bwrap's own command line names it too, as a
    mount)."""
    wanted = {script.encode() for script in scripts}
    for child in descendants(pid):
        try:
            argv = Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if next((a for a in argv[1:] if not a.startswith(b"-")), None) in wanted:
            return child
    return None


def env_inside(env: Mapping[str, str], layout: SandboxLayout) -> dict[str, str]:
    """The server's environment with the paths it names as the sandbox shows them (the venv
    at `/venv`, the outbox at `/outbox`)."""
    inside = dict(env)
    for name in ("VIRTUAL_ENV", "_OSMOSIS_ROLLOUT_ARTIFACT_ROOT"):
        if name in inside:
            inside[name] = layout.inside(Path(inside[name]))
    if "PATH" in inside:
        inside["PATH"] = os.pathsep.join(
            layout.inside(Path(part)) if part else part for part in inside["PATH"].split(os.pathsep)
        )
    return inside


def _read_child_pid(fd: int) -> int:
    from osmosis.eval.sites.rollout_process import RolloutStartError

    data = b""
    while True:
        ready, _, _ = select.select([fd], [], [], _INFO_WAIT_SEC)
        chunk = os.read(fd, 4096) if ready else b""
        if not chunk:
            raise RolloutStartError(
                "bwrap did not say the sandbox's pid (--info-fd)", returncode=None, output=[]
            )
        data += chunk
        with contextlib.suppress(ValueError):
            return int(json.loads(data)["child-pid"])


__all__ = [
    "SHIM_SOURCE",
    "SITE_PREFIX",
    "Launcher",
    "SandboxPlace",
    "descendant_running",
    "env_inside",
    "outbox_for",
    "prepare_site",
    "start_spare",
    "sweep_site_dirs",
    "terminate_shim",
]
