"""The rollout server's hot path: the protocol's common case as bare ASGI, no FastAPI.

`RolloutService` is what `POST /rollout` and `GET /rollout/{id}/result` do, whichever layer
serves them; `HotRoutes` answers those two, `GET /health` and a valid `POST /rollout/cancel`
straight from the request's bytes, and hands anything else to a fallback (the FastAPI app's
stack, `osmosis.rollout.server_fastapi`) with the request body replayed.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import uuid
from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from typing import Any

from pydantic import ValidationError

from osmosis.rollout.backend import ExecutionBackend, ExecutionRequest, ExecutionResult
from osmosis.rollout.context import RolloutContext
from osmosis.rollout.errors import categorize_exception
from osmosis.rollout.protocol import (
    COLLECTED_HEADER,
    LEASE_HEADER,
    TRAJECTORY_HEADER,
    WAIT_HEADER,
    CancelRolloutsRequest,
    RolloutInitRequest,
    RolloutResultResponse,
)
from osmosis.rollout.registry import (
    DuplicateRollout,
    InvalidLease,
    RolloutRegistry,
    TrackedRollout,
    UnknownRollout,
)
from osmosis.rollout.types import RolloutStatus

logger = logging.getLogger("osmosis.rollout")

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Any]]
Send = Callable[[Any], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

_RESULT_PREFIX = "/rollout/"
_RESULT_SUFFIX = "/result"
_LEASE = LEASE_HEADER.lower().encode()
_WAIT = WAIT_HEADER.lower().encode()
_TRAJECTORY = TRAJECTORY_HEADER.lower().encode()
_COLLECTED = COLLECTED_HEADER.lower().encode()
_JSON = (b"content-type", b"application/json")
_HELD = (_WAIT, b"terminal")


class RolloutService:
    """What the two hot routes do, whichever layer (hot path or FastAPI route) serves them."""

    def __init__(self, backend: ExecutionBackend, registry: RolloutRegistry) -> None:
        self.backend = backend
        self.registry = registry
        self.process_id = uuid.uuid4().hex
        self.accepting = True

    def start(
        self,
        request: RolloutInitRequest,
        *,
        inline_trajectory: bool = False,
        released: Sequence[str] = (),
    ) -> tuple[int, bytes, dict[str, str], TrackedRollout | None]:
        """Admit one rollout: (status, JSON body, extra headers, the admitted rollout).
        `released`: results the controller says it holds (`protocol.COLLECTED_HEADER`)."""
        admitted = self._admit(request, inline_trajectory)
        # After the admission: a released id must still count as a duplicate for this one.
        self.registry.release(released)
        return admitted

    def _admit(
        self, request: RolloutInitRequest, inline_trajectory: bool
    ) -> tuple[int, bytes, dict[str, str], TrackedRollout | None]:
        if not self.accepting:
            return (*_detail(503, "rollout server is shutting down"), None)
        if not self.backend.has_capacity():
            busy = _detail(429, "rollout queue is full; retry later", {"Retry-After": "5"})
            return (*busy, None)
        registry = self.registry
        try:
            tracked = registry.admit(request.rollout_id)
        except DuplicateRollout:
            return (*_detail(409, "rollout_id is already registered"), None)
        execution = ExecutionRequest(
            id=request.rollout_id,
            prompt=request.initial_messages,
            label=request.label,
            metadata=request.metadata,
            agent_timeout_sec=request.agent_timeout_sec,
            grader_timeout_sec=request.grader_timeout_sec,
            grade=request.grade,
            extra_fields=request.extra_fields,
            return_trajectory=inline_trajectory,
        )
        context = RolloutContext(
            chat_completions_url=request.chat_completions_url,
            api_key=request.llm_api_key,
            rollout_id=request.rollout_id,
            process_id=self.process_id,
            on_status=lambda status: registry.set_status(tracked, status),
        )
        task = asyncio.create_task(_run(self.backend, registry, tracked, execution, context))
        registry.started(tracked, task)
        accepted = {
            "rollout_id": request.rollout_id,
            "status": RolloutStatus.QUEUED.value,
            "polling_lease_token": tracked.lease,
            "result_wait_timeout_sec": float(registry.result_wait_timeout_sec),
            "polling_lease_timeout_sec": float(registry.polling_lease_timeout_sec),
        }
        return 202, json.dumps(accepted, separators=(",", ":")).encode(), {}, tracked

    async def poll(self, rollout_id: str, lease: str, *, until_terminal: bool) -> tuple[int, bytes]:
        """One long-poll of a result: (status, JSON body). A final answer that is sent counts
        as collected (`RolloutRegistry.collected`)."""
        try:
            answer, rollout = await self.registry.wait_for_result(
                rollout_id, lease, until_terminal=until_terminal
            )
        except UnknownRollout:
            return _detail(404, "unknown rollout_id")[:2]
        except InvalidLease:
            return _detail(403, "invalid polling lease")[:2]
        if answer is rollout.answer:
            self.registry.collected(rollout)
        return 200, answer

    async def hold(self, rollout: TrackedRollout, admission: bytes) -> bytes:
        """The body of a held admission: the final answer if the rollout finishes within
        the result wait, else `admission` (the controller polls from there)."""
        try:
            answer, _ = await self.registry.wait_for_result(
                rollout.rollout_id, rollout.lease, until_terminal=True
            )
        except UnknownRollout:  # forgotten meanwhile (retention 0): the poll says so
            return admission
        if answer is not rollout.answer:
            return admission
        self.registry.collected(rollout)
        return answer


class HotRoutes:
    """`POST /rollout`, `GET /rollout/{id}/result`, `GET /health` and `POST /rollout/cancel`
    as bare ASGI: the common case only; everything else goes to `fallback` (the FastAPI
    app's stack), with the request body replayed."""

    def __init__(
        self,
        service: RolloutService,
        *,
        api_key: str | None,
        health: Callable[[], tuple[dict[str, Any], dict[str, str]]],
    ) -> None:
        self.service = service
        self.api_key = api_key
        self.authorization = f"Bearer {api_key}".encode() if api_key is not None else None
        # `GET /health`'s document and headers. Served here too: FastAPI's first answer on a
        # route reads its endpoint's source for error messages (inspect, tokenize's patterns
        # compiled), 30-70 ms of CPU that the engine's first readiness check waited for.
        self.health = health

    async def __call__(self, scope: Scope, receive: Receive, send: Send, fallback: ASGIApp) -> None:
        path: str = scope["path"]
        method: str = scope["method"]
        if scope.get("root_path"):
            await fallback(scope, receive, send)
            return
        if method == "POST" and path == "/rollout":
            await self._start(scope, receive, send, fallback)
        elif method == "GET" and path.startswith(_RESULT_PREFIX) and path.endswith(_RESULT_SUFFIX):
            await self._poll(scope, receive, send, fallback)
        elif method == "GET" and path == "/health":
            await self._health(scope, receive, send, fallback)
        elif method == "POST" and path == "/rollout/cancel":
            await self._cancel(scope, receive, send, fallback)
        else:
            await fallback(scope, receive, send)

    def _headers(self, scope: Scope) -> dict[bytes, bytes] | None:
        """The request's headers; None when the bearer token is missing or wrong (the
        FastAPI stack then answers 401)."""
        headers = dict(scope["headers"])
        expected = self.authorization
        if expected is not None and not secrets.compare_digest(
            headers.get(b"authorization", b""), expected
        ):
            return None
        return headers

    async def _start(self, scope: Scope, receive: Receive, send: Send, fallback: ASGIApp) -> None:
        headers = self._headers(scope)
        body = await _read_body(receive)
        content_type = headers.get(b"content-type", b"application/json") if headers else b""
        request = None
        if headers is not None and content_type.lower().startswith(b"application/json"):
            try:
                request = RolloutInitRequest.model_validate_json(body)
            except ValidationError:
                request = None  # FastAPI answers the 422, in its own shape
        if request is None:
            await fallback(scope, _replay(body, receive), send)
            return
        assert headers is not None
        inline = headers.get(_TRAJECTORY, b"").lower() == b"inline"
        collected = headers.get(_COLLECTED)
        released = collected.decode("latin-1").split(",") if collected else ()
        status, answer, extra, tracked = self.service.start(
            request, inline_trajectory=inline, released=released
        )
        if tracked is None or headers.get(_WAIT, b"").lower() != b"terminal":
            await _send_json(send, status, answer, extra)
            return
        # Held (protocol.WAIT_HEADER): the lease now, the result when there is one.
        lease = (_LEASE, tracked.lease.encode())
        await send({"type": "http.response.start", "status": 202, "headers": [_JSON, lease, _HELD]})
        final = await self.service.hold(tracked, answer)
        await send({"type": "http.response.body", "body": final})

    async def _health(self, scope: Scope, receive: Receive, send: Send, fallback: ASGIApp) -> None:
        if self._headers(scope) is None:
            await fallback(scope, receive, send)  # the 401, from the FastAPI stack
            return
        payload, headers = self.health()
        await _send_json(send, 200, _json_response_body(payload), headers)

    async def _cancel(self, scope: Scope, receive: Receive, send: Send, fallback: ASGIApp) -> None:
        headers = self._headers(scope)
        body = await _read_body(receive)
        # FastAPI reads a body without this content type otherwise: its answer, then.
        content_type = headers.get(b"content-type", b"") if headers else b""
        request = None
        if content_type.lower().startswith(b"application/json"):
            try:
                request = CancelRolloutsRequest.model_validate_json(body)
            except ValidationError:
                request = None
        if request is None or request.selector_count() != 1:
            await fallback(scope, _replay(body, receive), send)
            return
        dispositions = self.service.registry.cancel(
            ids=request.ids, prefix=request.prefix, all=request.all
        )
        await _send_json(send, 200, _json_response_body({"dispositions": dispositions}), {})

    async def _poll(self, scope: Scope, receive: Receive, send: Send, fallback: ASGIApp) -> None:
        headers = self._headers(scope)
        path: str = scope["path"]
        rollout_id = path[len(_RESULT_PREFIX) : -len(_RESULT_SUFFIX)]
        lease = headers.get(_LEASE) if headers is not None else None
        if not lease or not rollout_id or "/" in rollout_id:
            await fallback(scope, receive, send)
            return
        assert headers is not None
        until_terminal = headers.get(_WAIT, b"").lower() == b"terminal"
        status, answer = await self.service.poll(
            rollout_id, lease.decode("latin-1"), until_terminal=until_terminal
        )
        await _send_json(send, status, answer, {})


async def _read_body(receive: Receive) -> bytes:
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            break
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def _replay(body: bytes, receive: Receive) -> Receive:
    """A `receive` that hands over an already-read body first, then the connection's own."""
    pending = [{"type": "http.request", "body": body, "more_body": False}]

    async def replaying() -> Any:
        return pending.pop() if pending else await receive()

    return replaying


async def _send_json(send: Send, status: int, body: bytes, headers: dict[str, str]) -> None:
    raw = [_JSON, (b"content-length", str(len(body)).encode())]
    raw += [(name.lower().encode(), value.encode()) for name, value in headers.items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})


def _json_response_body(payload: Any) -> bytes:
    # JSONResponse's bytes: the same document whichever layer answers.
    return json.dumps(
        payload, ensure_ascii=False, allow_nan=False, indent=None, separators=(",", ":")
    ).encode("utf-8")


def _detail(
    status: int, detail: str, headers: dict[str, str] | None = None
) -> tuple[int, bytes, dict[str, str]]:
    # The shape of FastAPI's HTTPException answers.
    return status, json.dumps({"detail": detail}).encode(), headers or {}


async def _run(
    backend: ExecutionBackend,
    registry: RolloutRegistry,
    tracked: TrackedRollout,
    request: ExecutionRequest,
    context: RolloutContext,
) -> None:
    try:
        with context:
            outcome = await backend.execute(request)
        result = outcome.result
    except asyncio.CancelledError:
        registry.finish(tracked, _cancelled(tracked.rollout_id))
        raise
    except Exception as exc:
        logger.exception("rollout %s crashed", request.id)
        result = ExecutionResult(
            status=RolloutStatus.FAILURE,
            err_message=str(exc) or type(exc).__name__,
            err_category=categorize_exception(exc),
        )
        registry.finish(tracked, _wire_result(tracked.rollout_id, result))
        return
    registry.finish(
        tracked, _wire_result(tracked.rollout_id, result), trajectory=outcome.trajectory
    )


def _wire_result(rollout_id: str, result: ExecutionResult) -> RolloutResultResponse:
    sample = result.sample.wire_copy() if result.sample is not None else None
    if sample is not None and (result.status is not RolloutStatus.SUCCESS or sample.remove_sample):
        sample.reward = None  # a reward is only trusted on success, never on a removed sample
    return RolloutResultResponse(
        rollout_id=rollout_id,
        status=result.status,
        sample=sample,
        err_message=result.err_message,
        err_category=result.err_category,
    )


def _cancelled(rollout_id: str) -> RolloutResultResponse:
    return RolloutResultResponse(
        rollout_id=rollout_id, status=RolloutStatus.CANCELLED, err_message="cancelled"
    )
