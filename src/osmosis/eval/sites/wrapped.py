"""A site seen through another rollout protocol: each endpoint's `api` wrapped, the rest as is.

The host hands the engine its site wrapped (admissions timed, each admitted rollout assigned
its attempt) without changing anything else of it:

    class TimedAPI(ForwardingAPI):
        async def start(self, request):
            began = time.monotonic()
            try:
                return await super().start(request)
            finally:
                print(time.monotonic() - began)

    engine = Engine(site=ApiWrappedSite(site, TimedAPI), ...)
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from pathlib import Path

from osmosis.eval.sites.api import Lease, ResourceLimitBreach, RolloutAPI
from osmosis.eval.sites.seam import Endpoint, Site
from osmosis.rollout.protocol import RolloutInitRequest, RolloutResultResponse

__all__ = ["ApiWrappedEndpoint", "ApiWrappedSite", "ForwardingAPI"]


class ForwardingAPI:
    """A `RolloutAPI` that passes every call on to `inner`; a subclass overrides what it adds."""

    def __init__(self, inner: RolloutAPI) -> None:
        self.inner = inner

    async def health(self) -> dict[str, object]:
        return await self.inner.health()

    async def start(self, request: RolloutInitRequest) -> Lease:
        return await self.inner.start(request)

    async def wait(
        self, lease: Lease, *, deadline_sec: float | None = None
    ) -> RolloutResultResponse:
        return await self.inner.wait(lease, deadline_sec=deadline_sec)

    async def cancel(self, rollout_ids: list[str]) -> dict[str, str]:
        return await self.inner.cancel(rollout_ids)

    async def aclose(self) -> None:
        await self.inner.aclose()


class ApiWrappedEndpoint:
    """`inner`, unchanged but for its `api`."""

    def __init__(self, inner: Endpoint, api: RolloutAPI) -> None:
        self.inner = inner
        self._api = api

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
        return self._api

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


class ApiWrappedSite:
    """`site` with every endpoint's `api` made by `wrap(api)`, replacements included;
    `replaced(old, reason)` is told after each replacement."""

    def __init__(
        self,
        site: Site,
        wrap: Callable[[RolloutAPI], RolloutAPI],
        *,
        replaced: Callable[[Endpoint, str], None] | None = None,
    ) -> None:
        self._site = site
        self._wrap_api = wrap
        self._replaced = replaced
        # One wrapper per endpoint, so the engine sees the same object on every read.
        self._wrapped: dict[int, ApiWrappedEndpoint] = {}

    def _wrap(self, endpoint: Endpoint) -> ApiWrappedEndpoint:
        wrapped = self._wrapped.get(id(endpoint))
        if wrapped is None or wrapped.inner is not endpoint:
            wrapped = ApiWrappedEndpoint(endpoint, self._wrap_api(endpoint.api))
            self._wrapped[id(endpoint)] = wrapped
        return wrapped

    @property
    def endpoints(self) -> Sequence[Endpoint]:
        return [self._wrap(endpoint) for endpoint in self._site.endpoints]

    async def start(self, replicas: int | None = None) -> None:
        await self._site.start(replicas)

    async def stop(self) -> None:
        await self._site.stop()

    async def replace(self, endpoint: Endpoint, reason: str) -> Endpoint:
        inner = endpoint.inner if isinstance(endpoint, ApiWrappedEndpoint) else endpoint
        replacement = await self._site.replace(inner, reason)
        if self._replaced is not None:
            self._replaced(inner, reason)
        return self._wrap(replacement)
