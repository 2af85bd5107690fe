"""`create_rollout_server`: serve an execution backend over rollout protocol 0.4.

    app = create_rollout_server(backend=LocalBackend(workflow=Multiply, grader=ExactMatch))
    # uvicorn.run(app, port=int(os.environ["_OSMOSIS_ROLLOUT_PORT"]))

Routes: `GET /health`, `POST /rollout` (202 + lease; 429 at capacity; 409 duplicate; 503
while shutting down; 422 invalid), `GET /rollout/{id}/result` (long-poll with the lease
header; 403 wrong lease; 404 unknown), `POST /rollout/cancel` (`ids` | `prefix` | `all`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import sys
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

from fastapi import FastAPI, Header, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from osmosis._version import __version__
from osmosis.rollout.backend import ExecutionBackend, ExecutionRequest, ExecutionResult
from osmosis.rollout.context import RolloutContext
from osmosis.rollout.errors import categorize_exception
from osmosis.rollout.protocol import (
    INSTANCE_HEADER,
    LEASE_HEADER,
    SDK_VERSION_HEADER,
    CancelRolloutsRequest,
    CancelRolloutsResponse,
    RolloutInitRequest,
    RolloutInitResponse,
    RolloutResultResponse,
)
from osmosis.rollout.registry import (
    DuplicateRollout,
    InvalidLease,
    RolloutRegistry,
    TrackedRollout,
    UnknownRollout,
)
from osmosis.rollout.types import PROTOCOL_VERSION, RolloutStatus

logger = logging.getLogger("osmosis.rollout")

DEFAULT_RESULT_WAIT_TIMEOUT_SEC = 30.0
DEFAULT_POLLING_LEASE_TIMEOUT_SEC = 120.0
DEFAULT_RESULT_RETENTION_SEC = 900.0
DEFAULT_SHUTDOWN_GRACE_SEC = 10.0

Lifespan = Callable[[FastAPI], AbstractAsyncContextManager[Any]]


def create_rollout_server(
    *,
    backend: ExecutionBackend,
    lifespan: Lifespan | None = None,
    configure_logging: bool = True,
    result_wait_timeout_sec: float = DEFAULT_RESULT_WAIT_TIMEOUT_SEC,
    polling_lease_timeout_sec: float = DEFAULT_POLLING_LEASE_TIMEOUT_SEC,
    result_retention_sec: float = DEFAULT_RESULT_RETENTION_SEC,
    api_key: str | None = None,
    shutdown_grace_sec: float = DEFAULT_SHUTDOWN_GRACE_SEC,
) -> FastAPI:
    """Build the rollout server app around `backend`. With `api_key`, every route requires
    `Authorization: Bearer <api_key>`. On shutdown, rollouts in flight get
    `shutdown_grace_sec` to finish before they are cancelled."""
    if configure_logging:
        _configure_logging()
    registry = RolloutRegistry(
        result_wait_timeout_sec=result_wait_timeout_sec,
        polling_lease_timeout_sec=polling_lease_timeout_sec,
        result_retention_sec=result_retention_sec,
        cancel_backend=lambda rollout_id: backend.cancel_rollouts(ids=[rollout_id]),
    )
    process_id = uuid.uuid4().hex
    instance_id = os.environ.get("_OSMOSIS_ROLLOUT_INSTANCE_ID") or process_id
    state = {"accepting": True}

    @asynccontextmanager
    async def run_lifespan(app: FastAPI) -> AsyncIterator[None]:
        try:
            if lifespan is None:
                yield
            else:
                async with lifespan(app):
                    yield
        finally:
            state["accepting"] = False
            await _drain(registry, shutdown_grace_sec)
            await backend.shutdown()
            policy = sys.modules.get("osmosis.rollout.policy")  # loaded only if a workflow used it
            if policy is not None:
                await policy.close_shared_client()

    app = FastAPI(
        title="osmosis rollout server",
        version=__version__,
        lifespan=run_lifespan,
        docs_url=None,
        redoc_url=None,
    )
    if api_key is not None:
        app.add_middleware(_BearerAuth, api_key=api_key)
    app.add_exception_handler(RequestValidationError, _validation_error)

    @app.get("/health")
    async def health() -> JSONResponse:
        payload = dict(backend.health())
        payload.update(
            instance_id=instance_id,
            process_id=process_id,
            protocol_version=PROTOCOL_VERSION,
            lifecycle={
                "accepting_rollouts": state["accepting"],
                "active_rollouts": registry.active,
            },
        )
        headers = {INSTANCE_HEADER: instance_id, SDK_VERSION_HEADER: __version__}
        return JSONResponse(payload, headers=headers)

    @app.post("/rollout", status_code=202, response_model=RolloutInitResponse)
    async def start_rollout(request: RolloutInitRequest) -> JSONResponse:
        if not state["accepting"]:
            raise HTTPException(503, detail="rollout server is shutting down")
        if not backend.has_capacity():
            raise HTTPException(
                429, detail="rollout queue is full; retry later", headers={"Retry-After": "5"}
            )
        try:
            tracked = registry.admit(request.rollout_id)
        except DuplicateRollout:
            raise HTTPException(409, detail="rollout_id is already registered") from None
        execution = ExecutionRequest(
            id=request.rollout_id,
            prompt=request.initial_messages,
            label=request.label,
            metadata=request.metadata,
            agent_timeout_sec=request.agent_timeout_sec,
            grader_timeout_sec=request.grader_timeout_sec,
            grade=request.grade,
            extra_fields=request.extra_fields,
        )
        context = RolloutContext(
            chat_completions_url=request.chat_completions_url,
            api_key=request.llm_api_key,
            rollout_id=request.rollout_id,
            process_id=process_id,
            on_status=lambda status: registry.set_status(tracked, status),
        )
        tracked.task = asyncio.create_task(_run(backend, registry, tracked, execution, context))
        accepted = RolloutInitResponse(
            rollout_id=request.rollout_id,
            status=RolloutStatus.QUEUED,
            polling_lease_token=tracked.lease,
            result_wait_timeout_sec=result_wait_timeout_sec,
            polling_lease_timeout_sec=polling_lease_timeout_sec,
        )
        # Returned as a ready response: FastAPI would validate the model a second time.
        return JSONResponse(accepted.model_dump(mode="json"), status_code=202)

    @app.get("/rollout/{rollout_id}/result")
    async def rollout_result(
        rollout_id: str, lease: str = Header(alias=LEASE_HEADER, min_length=1)
    ) -> JSONResponse:
        try:
            result = await registry.wait_for_result(rollout_id, lease)
        except UnknownRollout:
            raise HTTPException(404, detail="unknown rollout_id") from None
        except InvalidLease:
            raise HTTPException(403, detail="invalid polling lease") from None
        body = result.model_dump(mode="json", exclude={"sample": {"trajectory_messages"}})
        return JSONResponse(body)

    @app.post("/rollout/cancel")
    async def cancel_rollouts(request: CancelRolloutsRequest) -> CancelRolloutsResponse:
        if request.selector_count() != 1:
            raise HTTPException(422, detail="pass exactly one selector: ids, prefix, or all")
        dispositions = registry.cancel(ids=request.ids, prefix=request.prefix, all=request.all)
        return CancelRolloutsResponse(dispositions=dispositions)

    return app


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


async def _validation_error(request: Request, exc: Exception) -> JSONResponse:
    """422 with FastAPI's usual shape, minus the rejected input: a non-finite number in it
    (`1e999`) cannot be written as JSON, and echoing it would turn a 422 into a 500."""
    errors = exc.errors() if isinstance(exc, RequestValidationError) else []
    detail = [
        {key: value for key, value in error.items() if key in ("type", "loc", "msg")}
        for error in errors
    ]
    return JSONResponse({"detail": detail}, status_code=422)


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


async def _drain(registry: RolloutRegistry, grace_sec: float) -> None:
    """Let rollouts in flight finish (their controller may still collect them), then cancel
    whatever is left so the process can exit."""
    tasks = registry.tasks()
    if tasks:
        await asyncio.wait(tasks, timeout=grace_sec)
    leftover = [task for task in tasks if not task.done()]
    for task in leftover:
        task.cancel()
    if leftover:
        await asyncio.wait(leftover, timeout=5.0)


def _configure_logging() -> None:
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False


ASGIApp = Callable[
    [MutableMapping[str, Any], Callable[[], Awaitable[Any]], Callable[[Any], Awaitable[None]]],
    Awaitable[None],
]


class _BearerAuth:
    """Pure ASGI middleware: every HTTP route requires the bearer token (constant-time)."""

    def __init__(self, app: ASGIApp, api_key: str) -> None:
        self.app = app
        self.expected = f"Bearer {api_key}".encode()

    async def __call__(
        self,
        scope: MutableMapping[str, Any],
        receive: Callable[[], Awaitable[Any]],
        send: Callable[[Any], Awaitable[None]],
    ) -> None:
        if scope["type"] == "http":
            supplied = dict(scope["headers"]).get(b"authorization", b"")
            if not secrets.compare_digest(supplied, self.expected):
                response = JSONResponse({"detail": "unauthorized"}, status_code=401)
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


__all__ = [
    "DEFAULT_POLLING_LEASE_TIMEOUT_SEC",
    "DEFAULT_RESULT_RETENTION_SEC",
    "DEFAULT_RESULT_WAIT_TIMEOUT_SEC",
    "DEFAULT_SHUTDOWN_GRACE_SEC",
    "create_rollout_server",
]
