"""The two shapes a site gives the engine: `Endpoint` (one rollout server) and `Site`.

    async with start_site(LocalSiteSpec(), context, replicas=2) as site:  # the host's part
        outcome = await Engine(site=site, ...).run(items)

A host starts and stops the site (`osmosis.eval.sites.spec.start_site`). The engine reads
`site.endpoints`, balances attempts over them, watches each one's `dead` event (and its
`breach`, when a resource limit killed it), and calls `site.replace(endpoint, reason)` when
one is gone. Nothing else.
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any, Protocol, TypeVar

from osmosis.eval.sites.api import ResourceLimitBreach, RolloutAPI


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

    @property
    def breach(self) -> ResourceLimitBreach | None:
        """The resource limit that killed it, set before `dead`; None otherwise (and always
        on a site that enforces no limits)."""
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

    async def start(self, replicas: int | None = None) -> None:
        """Start `replicas` endpoints (None: the site's own count, one per node) and return
        once each is healthy; what started is stopped again if one does not."""
        ...

    async def stop(self) -> None:
        """Stop every endpoint. Idempotent."""
        ...

    async def replace(self, endpoint: Endpoint, reason: str) -> Endpoint:
        """Stop `endpoint` (dead or not answering) and start one in its place. Raises
        `SiteExhausted` when its restart budget is spent, or why the new one did not start."""
        ...


class SiteExhausted(Exception):
    """The site will not start another endpoint (its bounded restarts are used up)."""


RESTART_WINDOW_SEC = 600.0
"""The span a site's restart limit counts over: a server that crash-loops spends its budget
in moments, one that dies once an hour in a ten-hour run is restarted every time."""


class RestartBudget:
    """At most `limit` restarts of each endpoint name within any `window_sec`.

    budget = RestartBudget(limit=2)
    number = budget.charge("scripted-1")   # 1, then 2; SiteExhausted past the limit
    """

    def __init__(
        self,
        limit: int,
        window_sec: float = RESTART_WINDOW_SEC,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.limit = limit
        self.window_sec = window_sec
        self._clock = clock
        self._restarts: dict[str, collections.deque[float]] = {}

    def charge(self, name: str) -> int:
        """Count one restart of `name` and return its number within the window; raises
        `SiteExhausted` (counting nothing) when `limit` are already in it."""
        now = self._clock()
        recent = self._restarts.setdefault(name, collections.deque())
        while recent and now - recent[0] >= self.window_sec:
            recent.popleft()
        if len(recent) >= self.limit:
            raise SiteExhausted(
                f"rollout server {name} was restarted {len(recent)} times in the last "
                f"{_span(self.window_sec)} (limit {self.limit})"
            )
        recent.append(now)
        return len(recent)

    def describe(self, number: int) -> str:
        """How a log line names restart `number`: "restart 1 of 2 within 10 minutes"."""
        return f"restart {number} of {self.limit} within {_span(self.window_sec)}"


E = TypeVar("E")


async def start_all(launches: Sequence[Coroutine[Any, Any, E]], started: list[E]) -> None:
    """Run every launch at once and wait for all of them; each endpoint that started is
    appended to `started`, also when this is cancelled (Ctrl-C), so the site's `stop()`
    reaches it. Raises the first launch's failure once all are done."""
    tasks = [asyncio.create_task(launch) for launch in launches]
    if not tasks:
        return
    try:
        await asyncio.wait(tasks)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        started.extend(
            task.result() for task in tasks if not task.cancelled() and task.exception() is None
        )
    failures = [
        error for task in tasks if not task.cancelled() and (error := task.exception()) is not None
    ]
    if failures:
        raise failures[0]


def _span(seconds: float) -> str:
    if seconds >= 60 and seconds % 60 == 0:
        minutes = int(seconds // 60)
        return f"{minutes} minute{'s' if minutes != 1 else ''}"
    return f"{seconds:g} s"


__all__ = [
    "RESTART_WINDOW_SEC",
    "Endpoint",
    "RestartBudget",
    "Site",
    "SiteExhausted",
    "start_all",
]
