"""The FastAPI half of the rollout server, built on first need (`server.RolloutServer`).

The hot path (`server_hot.HotRoutes`) and the ASGI lifespan answer a rollout server's every
request in the common case without FastAPI, whose import costs ~100 ms of every start. This
module is what answers the rest, exactly as before: a body that fails validation, a missing
lease, a bad bearer token, an unknown path, a `root_path`, and whatever the user's code does
with the app as a FastAPI app (its routes, middleware, state, OpenAPI document).
"""

from __future__ import annotations

import secrets
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any, cast

from fastapi import APIRouter, FastAPI, Header, HTTPException, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.models import OpenAPI
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse, Response
from fastapi.routing import APIRoute

from osmosis._version import __version__
from osmosis.rollout.protocol import (
    COLLECTED_HEADER,
    LEASE_HEADER,
    TRAJECTORY_HEADER,
    WAIT_HEADER,
    CancelRolloutsRequest,
    CancelRolloutsResponse,
    RolloutInitRequest,
    RolloutInitResponse,
)
from osmosis.rollout.server_hot import ASGIApp, HotRoutes, Receive, Scope, Send

_PROTOCOL_ROUTES = (
    ("POST", "/rollout", "start_rollout"),
    ("GET", "/rollout/{rollout_id}/result", "rollout_result"),
    ("POST", "/rollout/cancel", "cancel_rollouts"),
)

RouteHandler = Callable[[Request], Awaitable[Response]]


def build_fastapi_app(
    hot: HotRoutes, *, lifespan: Callable[[], AbstractAsyncContextManager[None]]
) -> RolloutFastAPI:
    """The FastAPI app behind a `server.RolloutServer` and its hot path: routes, middleware,
    exception handler, and `lifespan` (which the server runs itself when it started first)."""
    service, registry, api_key = hot.service, hot.service.registry, hot.api_key
    app = RolloutFastAPI(
        title="osmosis rollout server",
        version=__version__,
        lifespan=lambda _: lifespan(),
        docs_url=None,
        redoc_url=None,
    )
    if api_key is not None:
        app.add_middleware(_BearerAuth, api_key=api_key)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.own_middleware = len(app.user_middleware)
    app.hot = hot

    @app.get("/health")
    async def health() -> JSONResponse:
        payload, headers = hot.health()
        return JSONResponse(payload, headers=headers)

    # The routes below answer whatever the hot path hands over (see `server`'s module doc),
    # with FastAPI's validation and error shapes: stand-ins that hand the request to their
    # typed twins, declared on first use (`_ProtocolRoutes`).
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


class RolloutFastAPI(FastAPI):
    """The FastAPI app, with the protocol's hot routes answered before its stack."""

    hot: HotRoutes | None = None
    protocol: _ProtocolRoutes | None = None
    own_middleware = 0
    _described: dict[str, Any] | None = None

    def openapi(self) -> dict[str, Any]:
        schema = super().openapi()
        if self.protocol is None or schema is self._described:
            return schema
        # FastAPI keeps the document in `openapi_schema`, and returns it while no route is added.
        self.openapi_schema = self._described = self.protocol.describe(schema)
        return self._described

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # A middleware the user added must see every request: then FastAPI serves them all.
        if (
            self.hot is not None
            and scope["type"] == "http"
            and len(self.user_middleware) == self.own_middleware
        ):
            await self.hot(scope, receive, send, self.stack)
            return
        await super().__call__(scope, receive, send)

    async def stack(self, scope: Scope, receive: Receive, send: Send) -> None:
        """FastAPI's own handling of a request: middleware, routing, validation."""
        await super().__call__(scope, receive, send)


async def _validation_error(request: Request, exc: Exception) -> JSONResponse:
    """422 with FastAPI's usual shape, minus the rejected input: a non-finite number in it
    (`1e999`) cannot be written as JSON, and echoing it would turn a 422 into a 500."""
    errors = exc.errors() if isinstance(exc, RequestValidationError) else []
    detail = [
        {key: value for key, value in error.items() if key in ("type", "loc", "msg")}
        for error in errors
    ]
    return JSONResponse({"detail": detail}, status_code=422)


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
