"""A rollout server started before the run asked for it, held until the local site adopts it.

    early = prestart.start_early(rollout_dir, "main.py", env={}, artifact_root=trials)
    ...                                   # the command line loads, plans, opens the run
    early = prestart.claim()              # the site: the same launch? adopt it; else kill it

A fresh interpreter importing FastAPI and uvicorn takes as long as the command line's own
start (~0.4 s each on a laptop); `osmosis eval run` overlaps them by spawning the server
first (`osmosis.cli.prestart`). The standard library only: this runs before anything else is
imported. The server is spawned on the calling (main) thread, which the event loop later runs
on: the kernel's parent-death signal follows that thread. Whatever the command then does,
`discard()` at its end SIGKILLs and reaps a server nobody adopted.
"""

from __future__ import annotations

import os
import sys
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from subprocess import Popen, SubprocessError

from osmosis.eval.sites.spawn import (
    PROCESS_VARIABLES,
    Launch,
    _free_port,
    kill,
    ready_pipe,
    rollout_launch,
    spawn,
)


@dataclass(frozen=True)
class CurrentInterpreter:
    """The engine's own interpreter: a rollout directory without a `pyproject.toml`
    (what `environment.prepare_environment` answers, `kind="current"`)."""

    python: Path = Path(sys.executable)
    venv: Path | None = None


@dataclass
class Prestarted:
    """A server spawned early: what it was started with, and the ends the supervisor keeps."""

    popen: Popen[bytes]
    launch: Launch
    port: int
    instance_id: str
    ready_fd: int
    """The read end of its readiness pipe (`spawn.ready_pipe`)."""
    began: float
    """`time.monotonic()` at the spawn."""

    def difference(self, launch: Launch) -> str | None:
        """What differs between this server's launch and `launch` (None: nothing but the
        variables drawn per process); names only, never a value (they may be secrets)."""
        if launch.argv != self.launch.argv:
            return "command"
        if launch.cwd != self.launch.cwd:
            return "directory"
        ours, theirs = _comparable(self.launch.env), _comparable(launch.env)
        changed = sorted(k for k in ours.keys() | theirs.keys() if ours.get(k) != theirs.get(k))
        return f"environment ({', '.join(changed)})" if changed else None

    def kill(self) -> None:
        """SIGKILL its group and reap it (it ran no attempt)."""
        kill(self.popen)
        os.close(self.ready_fd)


_EARLY: Prestarted | None = None


def start_early(
    rollout_dir: Path,
    entrypoint: str,
    *,
    env: Mapping[str, str],
    artifact_root: Path,
    base_env: Mapping[str, str] | None = None,
) -> Prestarted | None:
    """Spawn `<this python> <entrypoint>` in `rollout_dir` as `LocalProcessSite` would, and
    hold it for `claim()`. None when it cannot be spawned (the run then starts its own and
    reports why). Nothing is created on disk: the site makes `artifact_root` when it adopts.

    start_early(ws / "rollouts/x", "main.py", env={}, artifact_root=run_dir / "rollout_trials")
    """
    global _EARLY
    discard()
    port, instance_id = _free_port(), uuid.uuid4().hex
    launch = rollout_launch(
        CurrentInterpreter(),
        rollout_dir,
        entrypoint,
        env=env,
        base_env=os.environ if base_env is None else base_env,
        artifact_root=artifact_root,
        port=port,
        instance_id=instance_id,
    )
    ready_read, ready_write = ready_pipe(launch)
    try:
        popen = spawn(launch, ready_write)
    except (OSError, SubprocessError):  # the normal start says why, properly
        os.close(ready_read)
        return None
    _EARLY = Prestarted(popen, launch, port, instance_id, ready_read, time.monotonic())
    return _EARLY


def claim() -> Prestarted | None:
    """The server started early, now the caller's to adopt or kill; None when there is none
    (or it was claimed already)."""
    global _EARLY
    early, _EARLY = _EARLY, None
    return early


def discard() -> None:
    """Kill and reap a server started early that nobody claimed (the command is ending, or
    took a path that starts no local server). Idempotent."""
    early = claim()
    if early is not None:
        early.kill()


def _comparable(env: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k not in PROCESS_VARIABLES}


__all__ = ["CurrentInterpreter", "Prestarted", "claim", "discard", "start_early"]
