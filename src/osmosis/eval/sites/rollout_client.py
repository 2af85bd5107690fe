"""The engine's side of rollout protocol 0.4 over HTTP: admit, long-poll, cancel, health.

    async with RolloutClient("http://127.0.0.1:8123") as client:
        lease = await client.start(init_request)
        result = await client.wait(lease, deadline_sec=600)

    RolloutClient("http://rollout", unix_socket="/tmp/…/scripted.sock")  # a sandboxed server

It speaks to any conforming server (ours or one built with `osmosis-ai`) and implements
`osmosis.eval.sites.api.RolloutAPI`, sorting faults as that module says: a 4xx admission is
this attempt's failure (`AdmissionRejected`), a 429 says when to come back (`AtCapacity`; the
engine then tries another endpoint), a body out of the protocol's shape is
`MalformedResponse`, and a dead server, 5xx or transport failure is the endpoint's fault
(`RolloutServerUnavailable`) and leaves the work pending.

Each admission asks the server to hold its answer until the rollout is finished
(`protocol.WAIT_HEADER`) and to send the trajectory with the result
(`protocol.TRAJECTORY_HEADER`): with our server an attempt is one HTTP exchange, with no
trajectory file written and read back. A server that ignores both (`osmosis-ai`) answers
202 at once and is polled, and its `trajectory.json` read, as before. It runs on
`osmosis.rollout.http1` (aiohttp cost ~0.25 ms of CPU per request here, that ~0.03 ms).
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from pydantic import ValidationError

from osmosis.eval.sites.api import (
    AdmissionRejected,
    AtCapacity,
    Lease,
    MalformedResponse,
    ResultDeadlineExceeded,
    RolloutServerUnavailable,
    parse_result,
)
from osmosis.rollout.http1 import (
    ConnectFailed,
    Exchange,
    Http1Client,
    TransportFailed,
    encode_headers,
)
from osmosis.rollout.protocol import (
    COLLECTED_HEADER,
    LEASE_HEADER,
    TRAJECTORY_HEADER,
    WAIT_HEADER,
    CancelRolloutsResponse,
    RolloutInitRequest,
    RolloutInitResponse,
    RolloutResultResponse,
)

_RETRYABLE_POLL_STATUSES = {502, 503, 504}
_JSON_BODY = encode_headers({"Content-Type": "application/json"})
_ADMISSION = encode_headers(
    {"Content-Type": "application/json", WAIT_HEADER: "terminal", TRAJECTORY_HEADER: "inline"}
)
_LEASE = LEASE_HEADER.lower()
_HELD = WAIT_HEADER.lower()
_COLLECTED = COLLECTED_HEADER.encode("latin-1")
_RELEASE_BATCH = 128  # ids per admission: a header of a few KiB at most
_DEFAULT_RETRY_AFTER_SEC = 1.0
_DEFAULT_WAIT_SEC = 30.0  # a held admission's poll window until the server names its own
_HELD_READ_SEC = 3600.0  # without a supervisor deadline: how long a held answer may take
_REQUEST_SEC = 120.0


class RolloutClient:
    """Async client for one rollout server."""

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | None = None,
        transport_retries: int = 3,
        unix_socket: str | os.PathLike[str] | None = None,
        handoff: bool = False,
    ) -> None:
        self._base_url = base_url.rstrip("/")
        # A sandboxed server is reached through a Unix socket (`handoff`: its shim passes a
        # connection to the server, `Http1Client`); `base_url` then only names it.
        self._http = Http1Client(
            self._base_url,
            unix_socket=os.fspath(unix_socket) if unix_socket is not None else None,
            handoff=handoff,
        )
        self._auth = encode_headers({"Authorization": f"Bearer {api_key}"}) if api_key else b""
        self._transport_retries = transport_retries
        self._held: dict[str, Exchange] = {}  # admissions whose answer is still coming
        # Results received, for the server to forget (protocol.COLLECTED_HEADER): told on the
        # next admission, so a long run does not leave ten seconds of them in its memory.
        self._received: list[str] = []

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
        held, self._held = self._held, {}
        for exchange in held.values():
            exchange.close()
        await self._http.aclose()

    async def health(self) -> dict[str, object]:
        response = await self._request("GET", "/health")
        if response.status_code != 200:
            raise RolloutServerUnavailable(f"/health answered HTTP {response.status_code}")
        body = response.json()
        return dict(body) if isinstance(body, dict) else {}

    async def start(self, request: RolloutInitRequest) -> Lease:
        """Admit one rollout. A 429 raises `AtCapacity` with the server's `Retry-After`."""
        # Serialised once, by pydantic, straight to the bytes sent.
        body = request.model_dump_json(exclude_none=True).encode()
        headers = _ADMISSION
        if self._received:
            released = self._received[:_RELEASE_BATCH]
            del self._received[:_RELEASE_BATCH]
            headers += b"%s: %s\r\n" % (_COLLECTED, ",".join(released).encode("latin-1"))
        exchange = await self._open("POST", "/rollout", body, headers, idempotent=False)
        token = exchange.headers.get(_LEASE)
        if exchange.status == 202 and token and exchange.headers.get(_HELD) == "terminal":
            # Held: the result comes on this exchange; `wait` reads it.
            self._held[request.rollout_id] = exchange
            return Lease(request.rollout_id, token, _DEFAULT_WAIT_SEC)
        response = await self._finish(exchange, "POST", "/rollout", _REQUEST_SEC)
        if response.status_code == 202:
            return _lease(response.content)
        if response.status_code == 429:
            raise AtCapacity(_retry_after(response))
        detail = _detail(response)
        if response.status_code >= 500:
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
        held = self._held.pop(lease.rollout_id, None)
        if held is not None:
            outcome = await self._read_held(held, lease, give_up_at, deadline_sec)
            if isinstance(outcome, RolloutResultResponse):
                self._received_result(lease.rollout_id)
                return outcome
            lease = outcome
        path = f"/rollout/{lease.rollout_id}/result"
        # Our server then answers once the rollout is finished (one poll per attempt, not one
        # per status change); a server that does not know the header answers each change.
        headers = encode_headers({LEASE_HEADER: lease.token, WAIT_HEADER: "terminal"})
        poll_timeout = lease.result_wait_timeout_sec + 30.0
        stalled = 0
        while True:
            timeout = poll_timeout
            if give_up_at is not None:
                remaining = give_up_at - time.monotonic()
                if remaining <= 0:
                    raise _deadline(lease, deadline_sec)
                timeout = min(poll_timeout, remaining + 0.5)
            try:
                response = await self._request("GET", path, headers=headers, timeout=timeout)
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
            result = parse_result(response.content)
            if result.status.terminal:
                self._received_result(lease.rollout_id)
                return result

    async def _read_held(
        self,
        held: Exchange,
        lease: Lease,
        give_up_at: float | None,
        deadline_sec: float | None,
    ) -> RolloutResultResponse | Lease:
        """The held admission's body: the terminal result, or the lease to poll with."""
        timeout = _HELD_READ_SEC if give_up_at is None else give_up_at - time.monotonic() + 0.5
        try:
            body = await held.read(timeout)
        except TimeoutError:
            if give_up_at is not None and time.monotonic() >= give_up_at:
                raise _deadline(lease, deadline_sec) from None
            return lease  # a stalled server: poll with the lease until the deadline
        except TransportFailed as error:
            raise RolloutServerUnavailable(
                f"rollout server unreachable (result of {lease.rollout_id}): {error}"
            ) from error
        result = parse_result(body)
        if result.status.terminal:
            return result
        return _lease(body)  # the server's wait ran out: its admission body; poll from here

    def _received_result(self, rollout_id: str) -> None:
        # Ids that could not travel in a comma-separated header value keep the re-read window.
        if rollout_id.isascii() and rollout_id.isprintable() and "," not in rollout_id:
            self._received.append(rollout_id)

    async def cancel(self, rollout_ids: list[str]) -> dict[str, str]:
        """Cancel these rollouts; best effort, the dispositions as the server gives them."""
        if not rollout_ids:
            return {}
        body = json.dumps({"ids": rollout_ids}).encode()
        response = await self._request("POST", "/rollout/cancel", body=body, headers=_JSON_BODY)
        if response.status_code != 200:
            return {}
        return CancelRolloutsResponse.model_validate(response.json()).dispositions

    async def _request(
        self,
        method: str,
        path: str,
        *,
        body: bytes = b"",
        headers: bytes = b"",
        timeout: float = _REQUEST_SEC,  # noqa: ASYNC109 - the whole exchange
    ) -> _Response:
        """An idempotent request, re-sent on transport faults."""
        for attempt in range(self._transport_retries + 1):
            try:
                reply = await self._http.request(
                    method, path, body=body, headers=self._auth + headers, timeout=timeout
                )
            except (TransportFailed, TimeoutError) as exc:
                await self._retry_or_raise(exc, attempt, method, path, idempotent=True)
                continue
            return _Response(reply.status, reply.headers, reply.body)
        raise AssertionError("unreachable")

    async def _open(
        self, method: str, path: str, body: bytes, headers: bytes, *, idempotent: bool
    ) -> Exchange:
        for attempt in range(self._transport_retries + 1):
            try:
                return await self._http.open(
                    method, path, body=body, headers=self._auth + headers, timeout=_REQUEST_SEC
                )
            except (TransportFailed, TimeoutError) as exc:
                await self._retry_or_raise(exc, attempt, method, path, idempotent=idempotent)
        raise AssertionError("unreachable")

    async def _retry_or_raise(
        self,
        exc: TransportFailed | TimeoutError,
        attempt: int,
        method: str,
        path: str,
        *,
        idempotent: bool,
    ) -> None:
        # Re-send only on transport faults. A POST that may have reached the server is not
        # re-sent (it could be admitted twice); one that never connected is safe to repeat.
        never_sent = isinstance(exc, ConnectFailed)
        timed_out = isinstance(exc, TimeoutError)  # the caller owns read deadlines
        last = attempt == self._transport_retries
        if last or timed_out or not (idempotent or never_sent):
            raise RolloutServerUnavailable(
                f"rollout server unreachable ({method} {path}): {exc!r}"
            ) from exc
        await asyncio.sleep(0.2 * 2**attempt)

    @staticmethod
    async def _finish(
        exchange: Exchange,
        method: str,
        path: str,
        timeout: float,  # noqa: ASYNC109 - the rest of the exchange
    ) -> _Response:
        try:
            content = await exchange.read(timeout)
        except (TransportFailed, TimeoutError) as exc:
            raise RolloutServerUnavailable(
                f"rollout server unreachable ({method} {path}): {exc!r}"
            ) from exc
        return _Response(exchange.status, exchange.headers, content)


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


def _lease(body: bytes) -> Lease:
    try:
        accepted = RolloutInitResponse.model_validate_json(body)
    except ValidationError as error:
        raise MalformedResponse(f"malformed admission body: {error.errors()[0]['msg']}") from None
    return Lease(
        accepted.rollout_id, accepted.polling_lease_token, accepted.result_wait_timeout_sec
    )


def _deadline(lease: Lease, deadline_sec: float | None) -> ResultDeadlineExceeded:
    return ResultDeadlineExceeded(
        f"rollout {lease.rollout_id} gave no result within {deadline_sec:g}s"
    )


def _retry_after(response: _Response) -> float:
    try:
        return max(0.0, min(float(response.headers.get("retry-after", "")), 60.0))
    except ValueError:
        return _DEFAULT_RETRY_AFTER_SEC


def _detail(response: _Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text[:300]
    detail = body.get("detail") if isinstance(body, dict) else body
    return str(detail)[:300]


__all__ = [
    "AdmissionRejected",
    "AtCapacity",
    "Lease",
    "MalformedResponse",
    "ResultDeadlineExceeded",
    "RolloutClient",
    "RolloutServerUnavailable",
]
