"""The rollout sandbox: bubblewrap around each rollout server, reaching its run and the bridge.

Design note (issue 12)
----------------------

On the platform, workspace code is hostile (DESIGN.md, principle 8). A sandboxed rollout
server (`osmosis.eval.sites.sandbox.site.SandboxSite`) runs as

    bwrap <namespaces> <mounts> -- python -I -S /run/osmosis/shim.py … -- python main.py

(`shim.pyc` instead, compiled by the engine, when the rollout's interpreter is the engine's
own binary: a script is compiled at every start.)

- **Namespaces** (`support.namespace_flags`): new user (uid 1000 inside, no capabilities, no
  nested user namespaces where bwrap can forbid them), PID (its own `/proc`: no other process
  is visible or signalable), IPC, UTS, cgroup, mount and network namespaces; a new session;
  the sandbox dies with the engine (`--die-with-parent`, and the PID namespace with its init).
- **Files** (`layout`): read-only system directories, the interpreter, the venv at `/venv`,
  the checkout at `/workspace`; the outbox read-write at `/outbox`; fresh `/proc`, `/dev`,
  size-capped tmpfs `/tmp` and `HOME`. Nothing of the platform's home, other runs, other
  checkouts, `/run`, `/sys` or the host's `/proc`.
- **The environment build** (`build`, `package_index`): uv and the rollout's build backend
  run in the same kind of jail before the server starts: the checkout read-only, the venv
  being built the only writable place besides the workspace's own uv cache, and a proxy that
  reaches only the package index.
- **Network** (`shim`, `network`): only a loopback. The shim forwards the engine's Unix
  socket to the server's `127.0.0.1:$_OSMOSIS_ROLLOUT_PORT` and the rollout-scoped bridge URL
  on `127.0.0.1:<bridge port>` to the bridge's Unix socket (answered by the bridge's own
  server when it runs in the engine's event loop), so rollouts (ours and `osmosis-ai`'s) run
  unchanged. `network = "full"` adds slirp4netns with the host's loopback disabled.
- **Environment** (`environment`): PATH, HOME, TMPDIR, the locale, then what
  `child_environment` adds (protocol, offline settings, `[env]`, declared secrets).
- **Limits** (`limits`, `policy.SandboxLimits`): memory and processes through a cgroup (v2,
  else v1, else rlimits, said in the run's log), file size and CPU seconds through rlimits,
  output bytes per attempt and the server's whole disk (outbox, `/tmp`, `HOME`) measured
  while it runs (`disk`). A limit hit fails that attempt
  `resource_limit` (the site says so with a typed `sites.api.ResourceLimitBreach`); the server
  is restarted and the other attempts it ran go back to pending.

What it does not contain: kernel bugs reachable from an unprivileged user namespace (no
seccomp filter yet), CPU and disk bandwidth (no cpu or io controller), and, with `full`, the
host's non-loopback addresses. See docs/platform.md, "Security model".
"""

from osmosis.eval.sites.sandbox.environment import clean_base_env
from osmosis.eval.sites.sandbox.policy import (
    NETWORK_MODES,
    NetworkMode,
    SandboxLimits,
    SandboxPolicy,
)
from osmosis.eval.sites.sandbox.support import (
    SandboxSupport,
    SandboxUnavailable,
    find_bwrap,
    probe_sandbox,
)

__all__ = [
    "NETWORK_MODES",
    "NetworkMode",
    "SandboxLimits",
    "SandboxPolicy",
    "SandboxSupport",
    "SandboxUnavailable",
    "clean_base_env",
    "find_bwrap",
    "probe_sandbox",
]
