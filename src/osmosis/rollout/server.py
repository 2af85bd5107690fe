"""`create_rollout_server`: serve an execution backend over rollout protocol 0.4.

    app = create_rollout_server(backend=LocalBackend(workflow=Multiply, grader=ExactMatch))
    # uvicorn.run(app, port=int(os.environ["_OSMOSIS_ROLLOUT_PORT"]))

Routes: `GET /health`, `POST /rollout` (202 + lease; 429 at capacity; 409 duplicate; 503
while shutting down; 422 invalid), `GET /rollout/{id}/result` (long-poll with the lease
header; 403 wrong lease; 404 unknown), `POST /rollout/cancel` (`ids` | `prefix` | `all`).

The two routes every attempt uses (`POST /rollout`, `GET /rollout/{id}/result`), and the
`GET /health` the engine waits on at every start, are served before FastAPI's middleware,
routing and validation layers: the body is validated once by
pydantic straight from its JSON bytes, and answers are written as ready bytes (a finished
rollout's result is serialised once, when it finishes). Anything off the common path (a body
that fails validation, a missing lease header, a missing bearer token, a mounted app, a
middleware the user added) goes through the FastAPI routes below, which answer exactly as
before; they are declared with their typed parameters only when a request first needs them,
which keeps ~35 ms of CPU off every start (`_ProtocolRoutes`), and the OpenAPI document
describes them as typed routes. Finished rollouts keep only their serialised answer, and only
briefly once it has been read (`osmosis.rollout.registry`), so memory stays flat however long
the run.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import secrets
import sys
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any, cast

from fastapi import APIRouter, FastAPI, Header, HTTPException, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.models import OpenAPI
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse, Response
from fastapi.routing import APIRoute
from pydantic import ValidationError

from osmosis._version import __version__
from osmosis.rollout.access_log import ProtocolAccessFilter
from osmosis.rollout.backend import ExecutionBackend, ExecutionRequest, ExecutionResult
from osmosis.rollout.context import RolloutContext
from osmosis.rollout.errors import categorize_exception
from osmosis.rollout.protocol import (
    COLLECTED_HEADER,
    INSTANCE_HEADER,
    LEASE_HEADER,
    SDK_VERSION_HEADER,
    SHUTDOWN_HEADER,
    TRAJECTORY_HEADER,
    WAIT_HEADER,
    CancelRolloutsRequest,
    CancelRolloutsResponse,
    RolloutInitRequest,
    RolloutInitResponse,
    RolloutResultResponse,
)
from osmosis.rollout.registry import (
    DEFAULT_COLLECTED_RETENTION_SEC,
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


def _tell_ready() -> None:
    """Tell the engine that started this server that it is about to listen: uvicorn binds its
    socket right after the application's startup. The engine then asks `GET /health` every
    few milliseconds instead of polling slowly (`_OSMOSIS_ROLLOUT_READY_FD`, the write end of
    a pipe it handed down; absent when the server was started some other way)."""
    value = os.environ.pop("_OSMOSIS_ROLLOUT_READY_FD", None)
    if not value:
        return
    try:
        fd = int(value)
        os.write(fd, b"ready\n")
        os.close(fd)
    except (ValueError, OSError):  # not ours after all: the engine falls back to polling
        pass


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
    collected_result_retention_sec: float = DEFAULT_COLLECTED_RETENTION_SEC,
) -> FastAPI:
    """Build the rollout server app around `backend`. With `api_key`, every route requires
    `Authorization: Bearer <api_key>`. On shutdown, rollouts in flight get
    `shutdown_grace_sec` to finish before they are cancelled. A result is kept
    `result_retention_sec` after its rollout finished, or `collected_result_retention_sec`
    after the controller read it, whichever ends first."""
    if configure_logging:
        _configure_logging()
    registry = RolloutRegistry(
        result_wait_timeout_sec=result_wait_timeout_sec,
        polling_lease_timeout_sec=polling_lease_timeout_sec,
        result_retention_sec=result_retention_sec,
        collected_retention_sec=collected_result_retention_sec,
        cancel_backend=lambda rollout_id: backend.cancel_rollouts(ids=[rollout_id]),
    )
    service = _Service(backend, registry)
    instance_id = os.environ.get("_OSMOSIS_ROLLOUT_INSTANCE_ID") or service.process_id

    @asynccontextmanager
    async def run_lifespan(app: FastAPI) -> AsyncIterator[None]:
        try:
            if lifespan is None:
                _tell_ready()
                yield
            else:
                async with lifespan(app):
                    _tell_ready()
                    yield
        finally:
            service.accepting = False
            await _drain(registry, shutdown_grace_sec)
            await backend.shutdown()
            policy = sys.modules.get("osmosis.rollout.policy")  # loaded only if a workflow used it
            if policy is not None:
                await policy.close_shared_client()

    app = _RolloutApp(
        title="osmosis rollout server",
        version=__version__,
        lifespan=run_lifespan,
        docs_url=None,
        redoc_url=None,
    )
    if api_key is not None:
        app.add_middleware(_BearerAuth, api_key=api_key)
    app.add_exception_handler(RequestValidationError, _validation_error)
    own_middleware = len(app.user_middleware)
    app.hot = hot = _HotRoutes(service, api_key=api_key, own_middleware=own_middleware)

    def health_answer() -> tuple[dict[str, Any], dict[str, str]]:
        payload = dict(backend.health())
        payload.update(
            instance_id=instance_id,
            process_id=service.process_id,
            protocol_version=PROTOCOL_VERSION,
            lifecycle={
                "accepting_rollouts": service.accepting,
                "active_rollouts": registry.active,
            },
        )
        headers = {INSTANCE_HEADER: instance_id, SDK_VERSION_HEADER: __version__}
        if not has_shutdown_work():
            headers[SHUTDOWN_HEADER] = "none"
        return payload, headers

    @app.get("/health")
    async def health() -> JSONResponse:
        payload, headers = health_answer()
        return JSONResponse(payload, headers=headers)

    hot.health = health_answer

    def has_shutdown_work() -> bool:
        # Read when asked: the user may add handlers or middleware after this call. Rollouts
        # still in flight are the engine's to cancel; the shared policy client only closes.
        return (
            lifespan is not None
            or bool(app.router.on_shutdown)
            or type(backend).shutdown is not ExecutionBackend.shutdown
            or len(app.user_middleware) > own_middleware
        )

    # The routes below answer whatever the hot path hands over (see the module doc), with
    # FastAPI's validation and error shapes: stand-ins that hand the request to their typed
    # twins, declared on first use (`_ProtocolRoutes`).
    def declare(router: APIRouter) -> None:
        @router.post("/rollout", status_code=202, response_model=RolloutInitResponse)
        async def start_rollout(
            request: RolloutInitRequest,
            trajectory: str | None = Header(default=None, alias=TRAJECTORY_HEADER),
            collected: str | None = Header(default=None, alias=COLLECTED_HEADER),
        ) -> Response:
            inline = (trajectory or "").lower() == "inline"
            released = collected.split(",") if collected else ()
            status, body, headers, _ = service.start(
                request, inline_trajectory=inline, released=released
            )
            return Response(
                body, status_code=status, headers=headers, media_type="application/json"
            )

        @router.get("/rollout/{rollout_id}/result")
        async def rollout_result(
            rollout_id: str,
            lease: str = Header(alias=LEASE_HEADER, min_length=1),
            wait: str | None = Header(default=None, alias=WAIT_HEADER),
        ) -> Response:
            until_terminal = (wait or "").lower() == "terminal"
            status, body = await service.poll(rollout_id, lease, until_terminal=until_terminal)
            return Response(body, status_code=status, media_type="application/json")

        @router.post("/rollout/cancel")
        async def cancel_rollouts(request: CancelRolloutsRequest) -> CancelRolloutsResponse:
            if request.selector_count() != 1:
                raise HTTPException(422, detail="pass exactly one selector: ids, prefix, or all")
            dispositions = registry.cancel(ids=request.ids, prefix=request.prefix, all=request.all)
            return CancelRolloutsResponse(dispositions=dispositions)

    app.protocol = protocol = _ProtocolRoutes(declare, overrides=app)
    for method, path, name in _PROTOCOL_ROUTES:
        app.add_api_route(path, protocol.stand_in(name), methods=[method], name=name)

    return app


class _Service:
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


_PROTOCOL_ROUTES = (
    ("POST", "/rollout", "start_rollout"),
    ("GET", "/rollout/{rollout_id}/result", "rollout_result"),
    ("POST", "/rollout/cancel", "cancel_rollouts"),
)

RouteHandler = Callable[[Request], Awaitable[Response]]


class _ProtocolRoutes:
    """The protocol's routes with FastAPI's typed parameters, declared on first use.

    Declaring a route whose function takes a body, a header or a path parameter costs FastAPI
    ~35 ms of CPU at start (it imports `pydantic.v1` to rule out v1 models, then builds each
    field), yet the hot path answers nearly every request. So the app holds stand-ins that
    take only the `Request` and hand it to their typed twin's FastAPI handler: the same code
    reads, validates and answers it, and raises into the app's exception handlers, as before.
    `app.openapi()` describes the twins; a document built by hand from `app.routes` (FastAPI's
    `get_openapi(routes=app.routes)`) shows the stand-ins, without parameters or bodies.
    """

    def __init__(self, declare: Callable[[APIRouter], None], *, overrides: FastAPI) -> None:
        self._declare = declare
        self._overrides = overrides
        self._router: APIRouter | None = None
        self._handlers: dict[str, RouteHandler] = {}

    def router(self) -> APIRouter:
        if self._router is None:
            router = APIRouter(dependency_overrides_provider=self._overrides)
            self._declare(router)
            self._router = router
        return self._router

    def handler(self, name: str) -> RouteHandler:
        handler = self._handlers.get(name)
        if handler is None:
            (route,) = [r for r in self.router().routes if getattr(r, "name", None) == name]
            assert isinstance(route, APIRoute)
            handler = self._handlers[name] = route.get_route_handler()
        return handler

    def stand_in(self, name: str) -> RouteHandler:
        async def stand_in(request: Request) -> Response:
            return await self.handler(name)(request)

        stand_in.__name__ = stand_in.__qualname__ = name
        return stand_in

    def describe(self, schema: dict[str, Any]) -> dict[str, Any]:
        """`schema` (the app's OpenAPI document) with the typed twins in place of the
        stand-ins and their models among the component schemas."""
        typed = get_openapi(title="", version="", routes=self.router().routes)
        paths = dict(schema.get("paths", {}))
        for path, operations in typed["paths"].items():
            paths[path] = {**paths.get(path, {}), **operations}
        components = dict(schema.get("components", {}))
        models = {**components.get("schemas", {}), **typed.get("components", {}).get("schemas", {})}
        components["schemas"] = {name: models[name] for name in sorted(models)}
        described = {**schema, "paths": paths, "components": components}
        # Through FastAPI's own model, as get_openapi does: its order of keys, its omissions.
        return cast(
            dict[str, Any],
            jsonable_encoder(OpenAPI(**described), by_alias=True, exclude_none=True),
        )


class _RolloutApp(FastAPI):
    """The FastAPI app, with the protocol's hot routes answered before its stack."""

    hot: _HotRoutes | None = None
    protocol: _ProtocolRoutes | None = None
    _described: dict[str, Any] | None = None

    def openapi(self) -> dict[str, Any]:
        schema = super().openapi()
        if self.protocol is None or schema is self._described:
            return schema
        # FastAPI keeps the document in `openapi_schema`, and returns it while no route is added.
        self.openapi_schema = self._described = self.protocol.describe(schema)
        return self._described

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        hot = self.hot
        # A middleware the user added must see every request: then FastAPI serves them all.
        if (
            hot is not None
            and scope["type"] == "http"
            and (len(self.user_middleware) == hot.own_middleware)
        ):
            await hot(scope, receive, send, super().__call__)
            return
        await super().__call__(scope, receive, send)


class _HotRoutes:
    """`POST /rollout` and `GET /rollout/{id}/result` as bare ASGI: the common case only;
    everything else goes to `fallback` (the FastAPI app), with the request body replayed."""

    def __init__(self, service: _Service, *, api_key: str | None, own_middleware: int) -> None:
        self.service = service
        self.authorization = f"Bearer {api_key}".encode() if api_key is not None else None
        self.own_middleware = own_middleware
        # `GET /health`'s document and headers (set by create_rollout_server). Served here
        # too: FastAPI's first answer on a route reads its endpoint's source for error
        # messages (inspect, tokenize's patterns compiled), 30-70 ms of CPU that the engine's
        # first readiness check waited for on every server start.
        self.health: Callable[[], tuple[dict[str, Any], dict[str, str]]] | None = None

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
        elif method == "GET" and path == "/health" and self.health is not None:
            await self._health(scope, receive, send, fallback)
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
        assert self.health is not None
        if self._headers(scope) is None:
            await fallback(scope, receive, send)  # the 401, from the FastAPI stack
            return
        payload, headers = self.health()
        # JSONResponse's bytes: the same document either way.
        body = json.dumps(
            payload, ensure_ascii=False, allow_nan=False, indent=None, separators=(",", ":")
        ).encode("utf-8")
        await _send_json(send, 200, body, headers)

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
    # uvicorn's access log would log every poll of the protocol; its dictConfig keeps a
    # logger's filters, so this one survives `uvicorn.run(app)`.
    access = logging.getLogger("uvicorn.access")
    if not any(isinstance(f, ProtocolAccessFilter) for f in access.filters):
        access.addFilter(ProtocolAccessFilter())
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False


class _BearerAuth:
    """Pure ASGI middleware: every HTTP route requires the bearer token (constant-time)."""

    def __init__(self, app: ASGIApp, api_key: str) -> None:
        self.app = app
        self.expected = f"Bearer {api_key}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
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
