"""The two shapes a site gives the engine: `Endpoint` (one rollout server) and `Site`.

    async with LocalProcessSite(...) as site:      # a host picks and starts the site
        await site.start(replicas=2)
        outcome = await Engine(site=site, ...).run(items)

The engine reads `site.endpoints`, balances attempts over them, watches each one's `dead`
event, and calls `site.replace(endpoint, reason)` when one is gone. Nothing else.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from osmosis.eval.sites.api import RolloutAPI


class Endpoint(Protocol):
    """One running rollout server, wherever it runs."""

    @property
    def name(self) -> str:
        """Unique within the run, stable across its restarts: `scripted-0`, `scripted-1`."""
        ...

    @property
    def node(self) -> str:
        """The machine it runs on (recorded on every attempt it serves)."""
        ...

    @property
    def base_url(self) -> str:
        """Where it serves the rollout protocol (for logs; the engine calls `api`)."""
        ...

    @property
    def capacity(self) -> int | None:
        """How many rollouts it runs at once (its `/health`); None when it does not say."""
        ...

    @property
    def api(self) -> RolloutAPI:
        """The rollout protocol, spoken to this endpoint."""
        ...

    @property
    def dead(self) -> asyncio.Event:
        """Set by the site the moment it knows the endpoint is gone."""
        ...

    @property
    def death_reason(self) -> str:
        """Why it is gone (exit code, signal, last error line); '' while alive."""
        ...

    async def trial(self, rollout_id: str) -> Path | None:
        """A local directory holding `trajectory.json` and `artifacts/` of one finished
        attempt (a remote site fetches them there first); None when there is nothing.
        Its contents are untrusted: the rollout wrote them."""
        ...


class Site(Protocol):
    """Where a run's rollout servers live: it starts, replaces and stops them."""

    @property
    def endpoints(self) -> Sequence[Endpoint]:
        """The endpoints started so far, replacements included, in start order."""
        ...

    async def replace(self, endpoint: Endpoint, reason: str) -> Endpoint:
        """Stop `endpoint` (dead or not answering) and start one in its place. Raises
        `SiteExhausted` when its restart budget is spent, or why the new one did not start."""
        ...


class SiteExhausted(Exception):
    """The site will not start another endpoint (its bounded restarts are used up)."""


__all__ = ["Endpoint", "Site", "SiteExhausted"]
