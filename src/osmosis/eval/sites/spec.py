"""The site a host wants, as a typed value, and the one factory that starts it.

    spec = SandboxSiteSpec(policy=SandboxPolicy(network="bridge"))
    async with start_site(spec, context, replicas=2) as site:
        outcome = await Engine(site=site, ...).run(items)

A `SiteSpec` is one small frozen dataclass per kind of site, holding what the host chose: a
clean base environment, the sandbox's policy, the Ray cluster. A `SiteContext` holds what
every site needs of the run: its checkout, where trials go, the model bridge's address.
`start_site` imports a site's module only when a spec asks for that site, so `ray` is
imported by a Ray run alone. One more site is one more spec class and one more case in
`build_site`.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, assert_never
from urllib.parse import urlsplit

from osmosis.eval.sites.sandbox.policy import SandboxPolicy
from osmosis.eval.sites.seam import Site

if TYPE_CHECKING:
    from osmosis.eval.results.redact import Redactor
    from osmosis.eval.results.trial_outputs import ArtifactLimits
    from osmosis.eval.sites.environment import RolloutEnvironment


@dataclass(frozen=True)
class LocalSiteSpec:
    """Rollout servers as plain child processes of this one (`sites.local`).

    LocalSiteSpec()                             # from this process's environment
    LocalSiteSpec(base_env=clean_base_env(os.environ, home=home))
    """

    base_env: Mapping[str, str] | None = None
    """The environment the rollout starts from; None: this process's, minus osmosis' and
    provider variables."""


@dataclass(frozen=True)
class SandboxSiteSpec:
    """Each rollout server under bubblewrap, reaching only its run and the bridge
    (`sites.sandbox`).

    SandboxSiteSpec()                           # the default policy: bridge network only
    SandboxSiteSpec(policy=policy, hidden=(platform_home,))
    """

    policy: SandboxPolicy = field(default_factory=SandboxPolicy)
    """The sandbox's network and resource limits."""
    base_env: Mapping[str, str] | None = None
    """The environment the rollout starts from; None: PATH-like basics and the locale."""
    hidden: tuple[Path, ...] = ()
    """Paths masked inside the sandbox, besides the workspace's `.osmosis/`."""


@dataclass(frozen=True)
class RaySiteSpec:
    """Rollout servers as actors on the nodes of a Ray cluster (`sites.ray`).

    RaySiteSpec()                               # RAY_ADDRESS, else the cluster running here
    RaySiteSpec(address="10.0.0.5:6379", max_replicas=8, clean_env=True)
    """

    address: str | None = None
    """The cluster (`host:port`); None: `RAY_ADDRESS`, else the one running on this machine."""
    max_replicas: int | None = None
    """At most this many rollout servers (the platform's per-run fairness cap)."""
    clean_env: bool = False
    """Each node starts its servers from a clean environment of its own: nothing of this
    process's (the platform worker)."""


SiteSpec = LocalSiteSpec | SandboxSiteSpec | RaySiteSpec
"""Where a run's rollout servers run: one of the site specs."""


@dataclass(frozen=True)
class SiteContext:
    """What every site needs of the run it serves, whichever the spec."""

    workspace: Path
    """The checkout the run's config lives in."""
    rollout_dir: Path
    """The rollout's directory in it (`rollouts/<rollout>`)."""
    entrypoint: str
    """The rollout's entrypoint, relative to `rollout_dir` (as the config names it)."""
    env: Mapping[str, str]
    """Variables every rollout server gets: the config's `[env]` and the run's secrets."""
    trials_root: Path
    """Where each attempt's `trajectory.json` and `artifacts/` end up (`<id>/`)."""
    log: Callable[[str], None]
    """Where the rollout servers' output and the site's own notes go."""
    redactor: Redactor
    """Scrubs secret values from what the servers print."""
    artifact_limits: ArtifactLimits
    """What of an attempt's artifacts a remote site ships back."""
    bridge_url: str
    """The model bridge's root URL as rollouts reach it."""
    bridge_bound_url: str
    """The address the bridge listens on (the sandbox forwards to it)."""
    environment: RolloutEnvironment | None = None
    """The rollout's prepared environment on this machine; None on Ray, where each node
    prepares its own."""
    env_scope: str | None = None
    """Whose venvs they are (the workspace): a node never gives one scope's venv to another."""
    on_spawned: Callable[[], None] | None = None
    """Called once a server's process runs on this machine, before it answers: what the run
    holds back until then (its bridge's imports) would only slow the spawn down."""


def build_site(spec: SiteSpec, context: SiteContext) -> Site:
    """The site `spec` asks for, not started yet, importing its module only now.

    site = build_site(LocalSiteSpec(), context)
    await site.start(1)
    """
    trials_root = context.trials_root
    if isinstance(spec, RaySiteSpec):
        from osmosis.eval.sites.ray.site import RaySite

        return RaySite(
            address=spec.address,
            workspace=context.workspace,
            rollout_dir=context.rollout_dir,
            entrypoint=context.entrypoint,
            env=context.env,
            trials_root=trials_root,
            log=context.log,
            redactor=context.redactor,
            artifact_limits=context.artifact_limits,
            bridge_url=context.bridge_url,
            clean_env=spec.clean_env,
            max_replicas=spec.max_replicas,
            env_scope=context.env_scope,
        )
    environment = context.environment
    if environment is None:
        raise ValueError("a site on this machine needs the rollout's prepared environment")
    entrypoint = context.rollout_dir / context.entrypoint
    if isinstance(spec, LocalSiteSpec):
        from osmosis.eval.sites.local import LocalProcessSite

        return LocalProcessSite(
            environment,
            context.rollout_dir,
            entrypoint,
            env=context.env,
            trials_root=trials_root,
            log=context.log,
            redactor=context.redactor,
            base_env=spec.base_env,
            on_spawned=context.on_spawned,
        )
    if isinstance(spec, SandboxSiteSpec):
        from osmosis.eval.sites.sandbox.site import SandboxSite

        bound = urlsplit(context.bridge_bound_url)
        host = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(bound.hostname or "", bound.hostname)
        return SandboxSite(
            environment,
            context.rollout_dir,
            entrypoint,
            policy=spec.policy,
            workspace=context.workspace,
            bridge_url=context.bridge_url,
            bridge_address=(host or "127.0.0.1", int(bound.port or 0)),
            # A local workspace keeps other runs and environments there.
            hidden=(context.workspace / ".osmosis", *spec.hidden),
            env=context.env,
            trials_root=trials_root,
            log=context.log,
            redactor=context.redactor,
            base_env=spec.base_env,
            artifact_limits=context.artifact_limits,  # what of an attempt's files is copied out
            on_spawned=context.on_spawned,
        )
    assert_never(spec)


@contextlib.asynccontextmanager
async def start_site(
    spec: SiteSpec, context: SiteContext, *, replicas: int | None
) -> AsyncIterator[Site]:
    """Build the site `spec` asks for, start `replicas` endpoints (None: the site's own
    count, one per Ray node), and stop them all on the way out, also when starting fails or
    is cancelled.

    async with start_site(LocalSiteSpec(), context, replicas=2) as site:
        print([endpoint.base_url for endpoint in site.endpoints])
    """
    site = build_site(spec, context)
    try:
        await site.start(replicas)
        yield site
    finally:
        await site.stop()


__all__ = [
    "LocalSiteSpec",
    "RaySiteSpec",
    "SandboxSiteSpec",
    "SiteContext",
    "SiteSpec",
    "build_site",
    "start_site",
]
