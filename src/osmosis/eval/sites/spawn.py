"""Spawning a rollout server process: its command, its environment, and its leash.

    launch = rollout_launch(environment, rollout_dir, rollout_dir / "main.py", env={},
                            base_env=os.environ, artifact_root=root, port=8123,
                            instance_id=uuid.uuid4().hex)
    ready_read, ready_write = ready_pipe(launch)
    popen = spawn(launch, ready_write)    # its own group; SIGKILLed if this thread dies

The standard library only, so the command line can start its run's rollout server before it
imports anything else (`osmosis.eval.sites.prestart`); `rollout_process` watches what this
spawns. The rules for what the child sees are in `rollout_process`'s docstring.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from osmosis.eval.sites import cpu_split

PROVIDER_CREDENTIAL_VARIABLES = frozenset(
    {
        "AI21_API_KEY",
        "ANTHROPIC_API_KEY",
        "ANYSCALE_API_KEY",
        "AWS_ACCESS_KEY_ID",
        "AWS_BEARER_TOKEN_BEDROCK",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
        "AZURE_AI_API_KEY",
        "AZURE_API_KEY",
        "AZURE_OPENAI_API_KEY",
        "CEREBRAS_API_KEY",
        "CO_API_KEY",
        "COHERE_API_KEY",
        "DASHSCOPE_API_KEY",
        "DATABRICKS_TOKEN",
        "DEEPINFRA_API_KEY",
        "DEEPSEEK_API_KEY",
        "FIREWORKS_AI_API_KEY",
        "FIREWORKS_API_KEY",
        "GEMINI_API_KEY",
        "GOOGLE_API_KEY",
        "GOOGLE_APPLICATION_CREDENTIALS",
        "GROQ_API_KEY",
        "HUGGINGFACE_API_KEY",
        "MISTRAL_API_KEY",
        "MOONSHOT_API_KEY",
        "NVIDIA_NIM_API_KEY",
        "OPENAI_API_KEY",
        "OPENROUTER_API_KEY",
        "PERPLEXITYAI_API_KEY",
        "PERPLEXITY_API_KEY",
        "REPLICATE_API_KEY",
        "REPLICATE_API_TOKEN",
        "TOGETHERAI_API_KEY",
        "TOGETHER_API_KEY",
        "VOYAGE_API_KEY",
        "WATSONX_APIKEY",
        "XAI_API_KEY",
    }
)
"""Model-provider credentials removed from the child's environment unless passed explicitly."""

OFFLINE_DEFAULTS = {
    # litellm fetches its price map from GitHub at import (seconds without a network).
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    "LITELLM_OFFLINE_MODE": "true",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "DO_NOT_TRACK": "1",
}
"""Set in every rollout's environment unless inherited or given in `[env]`: a rollout makes
no outbound lookup of its own at start. Downloads it asks for (a Hugging Face model) still
work."""

READY_FD_ENV = "_OSMOSIS_ROLLOUT_READY_FD"
"""The descriptor a rollout server writes to once it is about to listen (`osmosis.rollout`)."""
PROCESS_VARIABLES = frozenset(
    {"_OSMOSIS_ROLLOUT_PORT", "_OSMOSIS_ROLLOUT_INSTANCE_ID", READY_FD_ENV}
)
"""What the supervisor draws anew for each process it spawns: two launches that differ only
in these start the same server."""
_PR_SET_PDEATHSIG = 1
_OWN_PREFIXES = ("OSMOSIS_", "_OSMOSIS_")
_FOREIGN_INTERPRETER_VARIABLES = ("PYTHONHOME", "PYTHONPATH", "VIRTUAL_ENV", "CONDA_PREFIX")


class Interpreter(Protocol):
    """What a launch needs of a rollout environment (`environment.RolloutEnvironment`)."""

    @property
    def python(self) -> Path: ...

    @property
    def venv(self) -> Path | None: ...


def child_environment(
    *,
    base_env: Mapping[str, str],
    env: Mapping[str, str],
    environment: Interpreter,
    port: int,
    artifact_root: Path,
    instance_id: str,
) -> dict[str, str]:
    """The environment a rollout server starts with (see the module docstring for the rules).

    child_environment(base_env=os.environ, env={"MY_SECRET": "…"}, environment=env,
                      port=8123, artifact_root=root, instance_id=uuid4().hex)
    """
    child = {
        name: value
        for name, value in base_env.items()
        if not name.startswith(_OWN_PREFIXES) and name not in PROVIDER_CREDENTIAL_VARIABLES
    }
    for name, value in OFFLINE_DEFAULTS.items():
        child.setdefault(name, value)
    venv = environment.venv
    if venv is not None:
        # The engine's interpreter settings would leak its packages into the isolated venv;
        # what activation would set makes `python`/`pip` inside the rollout mean the venv.
        for name in _FOREIGN_INTERPRETER_VARIABLES:
            child.pop(name, None)
        child["VIRTUAL_ENV"] = str(venv)
        child["PATH"] = os.pathsep.join([str(venv / "bin"), child.get("PATH", os.defpath)])
    child.update(env)
    child.update(
        {
            "_OSMOSIS_ROLLOUT_PORT": str(port),
            "_OSMOSIS_ROLLOUT_ARTIFACT_ROOT": str(artifact_root),
            "_OSMOSIS_ROLLOUT_INSTANCE_ID": instance_id,
            "PYTHONUNBUFFERED": "1",
        }
    )
    return child


@dataclass
class Launch:
    """How a rollout server process is started. A site may rewrite it before the spawn (the
    sandbox wraps `argv` in bwrap and serves the protocol on a Unix socket).

    Launch(argv=[python, "main.py"], env=child_env, cwd=rollout_dir)
    """

    argv: list[str]
    env: dict[str, str]
    cwd: Path
    pass_fds: tuple[int, ...] = ()
    """Descriptors the child keeps (the sandbox's listening socket)."""
    preexec: Callable[[], None] | None = None
    """Runs in the child before exec, after the parent-death hook (joining a cgroup)."""
    socket_path: Path | None = None
    """Where the server is reached when not on `127.0.0.1:port`: a Unix socket that hands a
    connection to it over (the sandbox's shim; `Http1Client`'s `handoff`)."""
    started: Callable[[int], None] | None = None
    """Called in the parent with the child's pid right after the spawn."""
    terminate: Callable[[int], None] | None = None
    """How to ask the server to stop, given the child's pid (the sandbox: SIGTERM to its shim,
    inside the namespace); None: SIGTERM to the child's process group."""


def rollout_launch(
    environment: Interpreter,
    rollout_dir: Path,
    entrypoint: str | Path,
    *,
    env: Mapping[str, str],
    base_env: Mapping[str, str],
    artifact_root: Path,
    port: int,
    instance_id: str,
) -> Launch:
    """`<python> <entrypoint>` in the resolved `rollout_dir`, with `child_environment`: what
    the supervisor spawns (nothing is checked or created here).

    launch = rollout_launch(env, Path("rollouts/x"), "main.py", env={}, base_env=os.environ,
                            artifact_root=root, port=8123, instance_id=uuid.uuid4().hex)
    """
    rollout_dir = rollout_dir.resolve()
    child_env = child_environment(
        base_env=base_env,
        env=env,
        environment=environment,
        port=port,
        artifact_root=artifact_root.resolve(),
        instance_id=instance_id,
    )
    return Launch([str(environment.python), str(rollout_dir / entrypoint)], child_env, rollout_dir)


def ready_pipe(launch: Launch) -> tuple[int, int]:
    """The readiness pipe (read end, write end), its write end named in `launch.env`: set
    before a site rewrites the launch, which may carry the environment elsewhere."""
    ready_read, ready_write = os.pipe()
    launch.env[READY_FD_ENV] = str(ready_write)
    return ready_read, ready_write


def spawn(launch: Launch, ready_write: int) -> subprocess.Popen[bytes]:
    """Start `launch` in its own process group, SIGKILLed by the kernel when the calling
    thread dies, its output on one pipe; `ready_write` is handed to the child and closed
    here. The process is registered for the exit hook until `forget(pid)`. Raises `OSError`
    or `SubprocessError` when it cannot be started, or what `launch.started` raised."""
    launch.pass_fds = (*launch.pass_fds, ready_write)
    try:
        popen = subprocess.Popen(
            launch.argv,
            cwd=launch.cwd,
            env=launch.env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,  # one stream keeps tracebacks in order with the prints
            start_new_session=True,
            pass_fds=launch.pass_fds,
            preexec_fn=_chain(die_with_parent_hook(), cpu_split.rollout_hook(), launch.preexec),
        )
    finally:
        os.close(ready_write)  # the child's now: its end-of-file is the child's exit
    _LIVE[popen.pid] = popen
    if launch.started is not None:
        try:
            launch.started(popen.pid)
        except BaseException:
            kill(popen)
            raise
    return popen


def kill(popen: subprocess.Popen[bytes]) -> None:
    """SIGKILL the process's group, reap it, close its output pipe, forget it (for a
    process nobody watches yet)."""
    _signal_group(popen.pid, signal.SIGKILL)
    popen.wait()
    if popen.stdout is not None:
        popen.stdout.close()
    forget(popen.pid)


def forget(pid: int) -> None:
    """The process is reaped (or its owner stops it): the exit hook leaves it alone."""
    _LIVE.pop(pid, None)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _signal_group(pgid: int, signum: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signum)


# --- dying with the engine --------------------------------------------------------------------

_prctl: Any = None


def die_with_parent_hook() -> Callable[[], None] | None:
    """A `preexec_fn` asking the kernel to SIGKILL the child when its parent dies (Linux).

    libc is loaded here, in the parent: between fork and exec the child may only call what is
    already resolved, or it could deadlock on a lock another thread held at fork time.
    """
    global _prctl
    if not sys.platform.startswith("linux"):
        return None
    if _prctl is None:
        try:
            _prctl = ctypes.CDLL(None, use_errno=True).prctl
        except (OSError, AttributeError):
            return None
        _prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong]
        _prctl.restype = ctypes.c_int
    prctl = _prctl
    parent = os.getpid()
    deathsig = int(signal.SIGKILL)

    def hook() -> None:
        prctl(_PR_SET_PDEATHSIG, deathsig, 0)
        if os.getppid() != parent:  # the parent died before prctl took effect
            os._exit(1)

    return hook


def _chain(*hooks: Callable[[], None] | None) -> Callable[[], None] | None:
    """One `preexec_fn` running each hook in order (None when there is none)."""
    present = [hook for hook in hooks if hook is not None]
    if not present:
        return None

    def run() -> None:
        for hook in present:
            hook()

    return run


_LIFELINE: tuple[int, int, int] | None = None  # (this process's pid, read end, write end)


def lifeline() -> int:
    """The read end of a pipe whose write end only this process holds and never writes: it
    reads end of file once this process is gone, however it died. Pass it to a child that
    must not outlive the engine when the parent-death signal may not reach it (the sandbox
    shim's `--lifeline-fd`: that signal follows the thread that forked, and bwrap sits
    between). One per process; both ends stay closed to exec'd children unless passed."""
    global _LIFELINE
    if _LIFELINE is None or _LIFELINE[0] != os.getpid():  # a forked child makes its own
        read, write = os.pipe()
        _LIFELINE = (os.getpid(), read, write)
    return _LIFELINE[1]


_LIVE: dict[int, subprocess.Popen[bytes]] = {}  # pid -> process not yet stopped


def live_pids() -> list[int]:
    """The processes `spawn` started that are not stopped yet (`cpu_split.confine`)."""
    return list(_LIVE)


@atexit.register
def _stop_leftovers() -> None:
    """Last resort at interpreter exit (including after Ctrl-C): TERM, a short grace, KILL."""
    if not _LIVE:
        return
    for pid in _LIVE:
        _signal_group(pid, signal.SIGTERM)
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline and any(p.poll() is None for p in _LIVE.values()):
        time.sleep(0.05)
    for pid in _LIVE:
        _signal_group(pid, signal.SIGKILL)
    _LIVE.clear()


__all__ = [
    "OFFLINE_DEFAULTS",
    "PROCESS_VARIABLES",
    "PROVIDER_CREDENTIAL_VARIABLES",
    "READY_FD_ENV",
    "Interpreter",
    "Launch",
    "child_environment",
    "die_with_parent_hook",
    "forget",
    "kill",
    "ready_pipe",
    "rollout_launch",
    "spawn",
]
