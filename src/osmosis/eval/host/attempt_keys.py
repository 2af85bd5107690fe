"""Telling the bridge's call record which attempt each rollout id is (issue 28, part 2).

The engine opens a fresh rollout id at the bridge for every attempt it dispatches, and sends
the attempt's row and run index to the rollout server with it (`extra_fields`). The record of
model calls keys each call by that attempt, so the host hands the engine its site through
`KeyedSite`: every rollout admitted on one of its endpoints is assigned its (row, run index)
first, before any of its model calls can arrive. Nothing else of the site changes.

    engine = Engine(site=KeyedSite(site, bridge.recorder.assign), bridge=bridge, ...)
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from pathlib import Path

from osmosis.eval.sites.api import Lease, ResourceLimitBreach, RolloutAPI
from osmosis.eval.sites.seam import Endpoint, Site
from osmosis.rollout.protocol import RolloutInitRequest, RolloutResultResponse

__all__ = ["Assign", "KeyedSite"]

Assign = Callable[..., None]
"""`assign(rollout_id, row=..., run=...)`: `CallRecorder.assign`."""


class _KeyedAPI:
    """The endpoint's rollout protocol; `start` assigns the rollout its attempt first."""

    def __init__(self, api: RolloutAPI, assign: Assign) -> None:
        self._api = api
        self._assign = assign

    async def health(self) -> dict[str, object]:
        return await self._api.health()

    async def start(self, request: RolloutInitRequest) -> Lease:
        extra = request.extra_fields or {}
        row, run = extra.get("row_index"), extra.get("run_index")
        if isinstance(row, int) and isinstance(run, int):
            self._assign(request.rollout_id, row=row, run=run)
        return await self._api.start(request)

    async def wait(
        self, lease: Lease, *, deadline_sec: float | None = None
    ) -> RolloutResultResponse:
        return await self._api.wait(lease, deadline_sec=deadline_sec)

    async def cancel(self, rollout_ids: list[str]) -> dict[str, str]:
        return await self._api.cancel(rollout_ids)

    async def aclose(self) -> None:
        await self._api.aclose()


class _KeyedEndpoint:
    """One endpoint, unchanged but for its `api`."""

    def __init__(self, inner: Endpoint, assign: Assign) -> None:
        self.inner = inner
        self._assign = assign

    @property
    def name(self) -> str:
        return self.inner.name

    @property
    def node(self) -> str:
        return self.inner.node

    @property
    def base_url(self) -> str:
        return self.inner.base_url

    @property
    def capacity(self) -> int | None:
        return self.inner.capacity

    @property
    def api(self) -> RolloutAPI:
        return _KeyedAPI(self.inner.api, self._assign)

    @property
    def dead(self) -> asyncio.Event:
        return self.inner.dead

    @property
    def death_reason(self) -> str:
        return self.inner.death_reason

    @property
    def breach(self) -> ResourceLimitBreach | None:
        return self.inner.breach

    async def trial(self, rollout_id: str) -> Path | None:
        return await self.inner.trial(rollout_id)


class KeyedSite:
    """`site` as the engine sees it, each admission assigning its attempt (module doc)."""

    def __init__(self, site: Site, assign: Assign) -> None:
        self._site = site
        self._assign = assign
        self._wrapped: dict[int, _KeyedEndpoint] = {}

    def _wrap(self, endpoint: Endpoint) -> _KeyedEndpoint:
        wrapped = self._wrapped.get(id(endpoint))
        if wrapped is None or wrapped.inner is not endpoint:
            wrapped = self._wrapped[id(endpoint)] = _KeyedEndpoint(endpoint, self._assign)
        return wrapped

    @property
    def endpoints(self) -> Sequence[Endpoint]:
        return [self._wrap(endpoint) for endpoint in self._site.endpoints]

    async def start(self, replicas: int | None = None) -> None:
        await self._site.start(replicas)

    async def stop(self) -> None:
        await self._site.stop()

    async def replace(self, endpoint: Endpoint, reason: str) -> Endpoint:
        inner = endpoint.inner if isinstance(endpoint, _KeyedEndpoint) else endpoint
        return self._wrap(await self._site.replace(inner, reason))
