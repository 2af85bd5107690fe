"""Rollout sites: where a run's rollout servers live, behind one seam the engine knows.

- `seam`: `Endpoint` (one rollout server) and `Site` (start, replace, stop), the restart budget.
- `api`: the rollout protocol as the engine speaks it (`RolloutAPI`) and its fault vocabulary,
  a typed `ResourceLimitBreach` among it.
- `spec`: the site a host wants (`LocalSiteSpec`, `SandboxSiteSpec`, `RaySiteSpec`) and
  `start_site`, which imports a site's module only when a spec asks for it.
- `local`: child processes of the engine on this machine.
- `sandbox/`: the same processes under bubblewrap, with resource limits.
- `ray/`: actors on a Ray cluster's nodes (the only place `ray` is imported).
- `environment`, `rollout_process`, `rollout_client`: the rollout's uv environment, one rollout
  server process, and the HTTP client of the protocol, which the sites share.
- `cpu_split`: the engine's event loop and this machine's rollout servers on CPUs of their own.
- `process_tree`: the processes below one (/proc), for `cpu_split` and the sandbox's launcher.

Imports `errors`, `results` (redaction, trial outputs) and `model.bridge_http` (the sandbox's
socket backlog); never the engine or a host.

Design note (issue 11)
----------------------

A *site* starts N rollout-server *endpoints* for one run, replaces one that is gone (a
bounded number of times), and stops them all. A *host* (`osmosis eval run`, the platform
worker) names the site it wants as a `SiteSpec` and `start_site` starts it; the engine gets
the started site and uses exactly two things of it: `site.endpoints` and
`site.replace(endpoint, reason)`.

An endpoint (`seam.Endpoint`) is a name (stable across restarts; recorded on every attempt,
with its node), a base URL, a capacity (from its `/health`), a `dead` event plus a
`death_reason` (and a `breach` when a resource limit killed it), a rollout-protocol object
(`api.RolloutAPI`: start / wait / cancel / health), and `trial(rollout_id)`: a local directory
holding the attempt's `trajectory.json` and `artifacts/`. Whatever a site does to get there
(nothing, a copy, bytes shipped back), the engine and the run directory see one shape, and
treat its contents as untrusted.

The engine balances attempts by least-in-flight within each endpoint's capacity, backs off
an endpoint that answers 429 for its `Retry-After`, and drains an endpoint that is gone (its
`dead` event, or a failed `/health` after an attempt could not reach it): its attempts go
back to pending with fresh rollout ids and it asks the site for a replacement. It halts only
when no endpoint is left. The fault vocabulary lives in `api` so that every implementation
sorts errors the same way.

One more site is one more spec in `spec` and one more module here, with no engine change:

- `local`: child processes of the engine (`RolloutProcess` + `RolloutClient`).
- `sandbox` (issue 12) launches the same command wrapped in `bwrap`; its artifacts directory
  is bind-mounted and hostile, which `trial()` hands over as is: the engine reads
  `trajectory.json` without following links and the run directory's artifact copy refuses
  links and devices. A limit it enforces crosses the seam as a `ResourceLimitBreach`.
- `ray` (issue 15) gives endpoints whose `api` calls an actor, whose `node` is the actor's
  node, whose `dead` is set from the actor's death, and whose `trial()` writes the bytes
  shipped back into `trials_root/<rollout_id>` first.

    from osmosis.eval.sites.spec import LocalSiteSpec, start_site
    async with start_site(LocalSiteSpec(), context, replicas=2) as site:
        outcome = await Engine(site=site, bridge=bridge, sink=sink, settings=s).run(items)
"""

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from osmosis.eval.sites.api import (
        PROTOCOL_ERROR,
        AdmissionRejected,
        AtCapacity,
        Lease,
        MalformedResponse,
        ResultDeadlineExceeded,
        RolloutAPI,
        RolloutServerUnavailable,
        parse_result,
    )
    from osmosis.eval.sites.seam import Endpoint, Site, SiteExhausted

# Loaded when first asked for: `api` pulls in pydantic and the protocol's models, and the
# command line starts a run's rollout server from `sites.prestart` before it loads those.
_LAZY = {
    **dict.fromkeys(("Endpoint", "Site", "SiteExhausted"), "osmosis.eval.sites.seam"),
    **dict.fromkeys(
        ("PROTOCOL_ERROR", "AdmissionRejected", "AtCapacity", "Lease", "MalformedResponse",
         "ResultDeadlineExceeded", "RolloutAPI", "RolloutServerUnavailable", "parse_result"),
        "osmosis.eval.sites.api",
    ),
}  # fmt: skip


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "PROTOCOL_ERROR",
    "AdmissionRejected",
    "AtCapacity",
    "Endpoint",
    "Lease",
    "MalformedResponse",
    "ResultDeadlineExceeded",
    "RolloutAPI",
    "RolloutServerUnavailable",
    "Site",
    "SiteExhausted",
    "parse_result",
]
