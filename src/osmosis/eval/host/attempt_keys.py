"""Telling the bridge's call record which attempt each rollout id is (issue 28, part 2).

The engine opens a fresh rollout id at the bridge for every attempt it dispatches, and sends
the attempt's row and run index to the rollout server with it (`extra_fields`). The record of
model calls keys each call by that attempt, so the host hands the engine its site through
`KeyedSite`: every rollout admitted on one of its endpoints is assigned its (row, run index)
first, before any of its model calls can arrive. Nothing else of the site changes.

    engine = Engine(site=KeyedSite(site, bridge.recorder.assign), bridge=bridge, ...)
"""

from __future__ import annotations

from collections.abc import Callable

from osmosis.eval.sites.api import Lease, RolloutAPI
from osmosis.eval.sites.seam import Site
from osmosis.eval.sites.wrapped import ApiWrappedSite, ForwardingAPI
from osmosis.rollout.protocol import RolloutInitRequest

__all__ = ["Assign", "KeyedSite"]

Assign = Callable[..., None]
"""`assign(rollout_id, row=..., run=...)`: `CallRecorder.assign`."""


class _KeyedAPI(ForwardingAPI):
    """The endpoint's rollout protocol; `start` assigns the rollout its attempt first."""

    def __init__(self, api: RolloutAPI, assign: Assign) -> None:
        super().__init__(api)
        self._assign = assign

    async def start(self, request: RolloutInitRequest) -> Lease:
        extra = request.extra_fields or {}
        row, run = extra.get("row_index"), extra.get("run_index")
        if isinstance(row, int) and isinstance(run, int):
            self._assign(request.rollout_id, row=row, run=run)
        return await self.inner.start(request)


class KeyedSite(ApiWrappedSite):
    """`site` as the engine sees it, each admission assigning its attempt (module doc)."""

    def __init__(self, site: Site, assign: Assign) -> None:
        super().__init__(site, lambda api: _KeyedAPI(api, assign))
