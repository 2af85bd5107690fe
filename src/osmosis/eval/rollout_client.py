"""The engine's side of rollout protocol 0.4: admit a rollout, long-poll its result, cancel.

    async with RolloutClient("http://127.0.0.1:8123") as client:
        lease = await client.start(init_request)
        result = await client.wait(lease, deadline_sec=600)

It speaks to any conforming server (ours or one built with `osmosis-ai`). It uses aiohttp:
at 64 rollouts in flight httpx's connection pool costs more CPU than everything else the
engine does (measured with bench/engine.py). Faults are sorted
the way the dispatcher needs them: a 4xx admission is this attempt's failure
(`AdmissionRejected`); a dead server, 5xx or transport failure is the process's fault
(`RolloutServerUnavailable`) and must leave the work pending.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import aiohttp

from osmosis.rollout.protocol import (
    LEASE_HEADER,
    CancelRolloutsResponse,
    RolloutInitRequest,
    RolloutInitResponse,
    RolloutResultResponse,
)

_RETRYABLE_POLL_STATUSES = {502, 503, 504}
_DEFAULT_RETRY_AFTER_SEC = 1.0


class RolloutServerUnavailable(Exception):
    """The rollout server cannot take or report work: halt dispatch, keep items pending."""


class AdmissionRejected(Exception):
    """The server refused this one rollout (4xx other than 429): a terminal failure of it."""

    def __init__(self, status_code: int, detail: str) -> None:
        super().__init__(f"rollout server rejected the rollout (HTTP {status_code}): {detail}")
        self.status_code = status_code


class ResultDeadlineExceeded(Exception):
    """No terminal result arrived before the supervisor's deadline."""


@dataclass(frozen=True)
class Lease:
    """An admitted rollout and the token its polls must carry."""

    rollout_id: str
    token: str
    result_wait_timeout_sec: float


class RolloutClient:
    """Async client for one rollout server."""

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | None = None,
        transport_retries: int = 3,
        admission_wait_sec: float = 600.0,
    ) -> None:
        self._base_url = base_url.rstrip("/")
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._session: aiohttp.ClientSession | None = None
        self._transport_retries = transport_retries
        self._admission_wait_sec = admission_wait_sec

    def _client(self) -> aiohttp.ClientSession:
        # Created lazily: an aiohttp session must be made inside the running event loop.
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=60)
            self._session = aiohttp.ClientSession(connector=connector, headers=self._headers)
        return self._session

    async def __aenter__(self) -> RolloutClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def health(self) -> dict[str, object]:
        response = await self._request("GET", "/health")
        if response.status_code != 200:
            raise RolloutServerUnavailable(f"/health answered HTTP {response.status_code}")
        body = response.json()
        return dict(body) if isinstance(body, dict) else {}

    async def start(self, request: RolloutInitRequest) -> Lease:
        """Admit one rollout, waiting out 429s as `Retry-After` asks (up to a bound)."""
        body = request.model_dump(mode="json", exclude_none=True)
        give_up_at = time.monotonic() + self._admission_wait_sec
        while True:
            response = await self._request("POST", "/rollout", json_body=body, idempotent=False)
            if response.status_code == 202:
                accepted = RolloutInitResponse.model_validate(response.json())
                return Lease(
                    accepted.rollout_id,
                    accepted.polling_lease_token,
                    accepted.result_wait_timeout_sec,
                )
            if response.status_code == 429 and time.monotonic() < give_up_at:
                await asyncio.sleep(_retry_after(response))
                continue
            detail = _detail(response)
            if response.status_code >= 500 or response.status_code == 429:
                raise RolloutServerUnavailable(
                    f"rollout server answered HTTP {response.status_code} on admission: {detail}"
                )
            raise AdmissionRejected(response.status_code, detail)

    async def wait(
        self, lease: Lease, *, deadline_sec: float | None = None
    ) -> RolloutResultResponse:
        """Long-poll until the rollout reaches a terminal status (each poll renews its lease).

        With `deadline_sec`, a server that stops answering (user code blocking its event loop,
        say) ends in `ResultDeadlineExceeded` at the deadline rather than hanging the run.
        """
        give_up_at = None if deadline_sec is None else time.monotonic() + deadline_sec
        path = f"/rollout/{lease.rollout_id}/result"
        poll_timeout = lease.result_wait_timeout_sec + 30.0
        stalled = 0
        while True:
            timeout = poll_timeout
            if give_up_at is not None:
                remaining = give_up_at - time.monotonic()
                if remaining <= 0:
                    raise ResultDeadlineExceeded(
                        f"rollout {lease.rollout_id} gave no result within {deadline_sec:g}s"
                    )
                timeout = min(poll_timeout, remaining + 0.5)
            try:
                response = await self._request(
                    "GET", path, headers={LEASE_HEADER: lease.token}, read_timeout=timeout
                )
            except RolloutServerUnavailable as exc:
                stalled += 1
                timed_out = isinstance(exc.__cause__, TimeoutError)
                if give_up_at is None and (not timed_out or stalled > self._transport_retries):
                    raise
                if give_up_at is not None and not timed_out:
                    raise
                continue  # a stalled server: the deadline check above decides when to stop
            if response.status_code in _RETRYABLE_POLL_STATUSES:
                await asyncio.sleep(_DEFAULT_RETRY_AFTER_SEC)
                continue
            if response.status_code != 200:
                raise RolloutServerUnavailable(
                    f"result poll for {lease.rollout_id} answered HTTP {response.status_code}: "
                    f"{_detail(response)}"
                )
            result = RolloutResultResponse.model_validate(response.json())
            if result.status.terminal:
                return result

    async def cancel(self, rollout_ids: list[str]) -> dict[str, str]:
        """Cancel these rollouts; best effort, the dispositions as the server gives them."""
        if not rollout_ids:
            return {}
        response = await self._request("POST", "/rollout/cancel", json_body={"ids": rollout_ids})
        if response.status_code != 200:
            return {}
        return CancelRolloutsResponse.model_validate(response.json()).dispositions

    async def _request(
        self,
        method: str,
        path: str,
        *,
        idempotent: bool = True,
        json_body: Any = None,
        headers: Mapping[str, str] | None = None,
        read_timeout: float = 120.0,
    ) -> _Response:
        # Re-send only on transport faults. A POST that may have reached the server is not
        # re-sent (it could be admitted twice); one that never connected is safe to repeat.
        limits = aiohttp.ClientTimeout(total=None, sock_connect=10.0, sock_read=read_timeout)
        for attempt in range(self._transport_retries + 1):
            try:
                async with self._client().request(
                    method,
                    self._base_url + path,
                    json=json_body,
                    headers=headers,
                    timeout=limits,
                ) as response:
                    return _Response(response.status, dict(response.headers), await response.read())
            except (aiohttp.ClientError, TimeoutError) as exc:
                never_sent = isinstance(exc, aiohttp.ClientConnectorError)
                timed_out = isinstance(exc, TimeoutError)  # the caller owns read deadlines
                last = attempt == self._transport_retries
                if last or timed_out or not (idempotent or never_sent):
                    raise RolloutServerUnavailable(
                        f"rollout server unreachable ({method} {path}): {exc!r}"
                    ) from exc
                await asyncio.sleep(0.2 * 2**attempt)
        raise AssertionError("unreachable")


@dataclass(frozen=True)
class _Response:
    status_code: int
    headers: Mapping[str, str]
    content: bytes

    def json(self) -> Any:
        return json.loads(self.content)

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", errors="replace")


def _retry_after(response: _Response) -> float:
    try:
        return max(0.0, min(float(response.headers.get("Retry-After", "")), 60.0))
    except ValueError:
        return _DEFAULT_RETRY_AFTER_SEC


def _detail(response: _Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text[:300]
    detail = body.get("detail") if isinstance(body, dict) else body
    return str(detail)[:300]
