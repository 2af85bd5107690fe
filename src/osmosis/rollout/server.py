"""`create_rollout_server`: serve an execution backend over rollout protocol 0.4.

    app = create_rollout_server(backend=LocalBackend(workflow=Multiply, grader=ExactMatch))
    # uvicorn.run(app, port=int(os.environ["_OSMOSIS_ROLLOUT_PORT"]))

Routes: `GET /health`, `POST /rollout` (202 + lease; 429 at capacity; 409 duplicate; 503
while shutting down; 422 invalid), `GET /rollout/{id}/result` (long-poll with the lease
header; 403 wrong lease; 404 unknown), `POST /rollout/cancel` (`ids` | `prefix` | `all`).

The app serves the protocol's common case, and the ASGI lifespan, without FastAPI, whose
import (~100 ms) every rollout server start used to pay (`RolloutServer`). The routes every
attempt uses (`POST /rollout`, `GET /rollout/{id}/result`), the `GET /health` the engine
waits on at every start, and a valid `POST /rollout/cancel` are answered as bare ASGI
(`osmosis.rollout.server_hot`): the body is validated once by pydantic straight from its
JSON bytes, and answers are written as ready bytes (a finished rollout's result is
serialised once, when it finishes). Anything off the common path (a body that fails
validation, a missing lease header, a missing bearer token, an unknown path, a `root_path`,
a middleware the user added) goes to the FastAPI app, built then
(`osmosis.rollout.server_fastapi`), which answers exactly as before; so does any use of the
app as a FastAPI app. Finished rollouts keep only their serialised answer, and only briefly
once it has been read (`osmosis.rollout.registry`), so memory stays flat however long the
run.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import traceback
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import TYPE_CHECKING, Any

from osmosis._version import __version__
from osmosis.rollout.access_log import ProtocolAccessFilter
from osmosis.rollout.backend import ExecutionBackend
from osmosis.rollout.protocol import INSTANCE_HEADER, SDK_VERSION_HEADER, SHUTDOWN_HEADER
from osmosis.rollout.registry import DEFAULT_COLLECTED_RETENTION_SEC, RolloutRegistry
from osmosis.rollout.server_hot import HotRoutes, Receive, RolloutService, Scope, Send
from osmosis.rollout.types import PROTOCOL_VERSION

if TYPE_CHECKING:
    from osmosis.rollout.server_fastapi import RolloutFastAPI

logger = logging.getLogger("osmosis.rollout")

DEFAULT_RESULT_WAIT_TIMEOUT_SEC = 30.0
DEFAULT_POLLING_LEASE_TIMEOUT_SEC = 120.0
DEFAULT_RESULT_RETENTION_SEC = 900.0
DEFAULT_SHUTDOWN_GRACE_SEC = 10.0

# Called with the app `create_rollout_server` returned (a `RolloutServer`).
Lifespan = Callable[[Any], AbstractAsyncContextManager[Any]]


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
) -> RolloutServer:
    """Build the rollout server app around `backend`. With `api_key`, every route requires
    `Authorization: Bearer <api_key>`. On shutdown, rollouts in flight get
    `shutdown_grace_sec` to finish before they are cancelled. A result is kept
    `result_retention_sec` after its rollout finished, or `collected_result_retention_sec`
    after the controller read it, whichever ends first. `lifespan` is called with the app.

    The app is used as a FastAPI app (`@app.get(...)`, `app.add_middleware(...)`,
    `app.state`), yet is not one: see `RolloutServer`."""
    if configure_logging:
        _configure_logging()
    registry = RolloutRegistry(
        result_wait_timeout_sec=result_wait_timeout_sec,
        polling_lease_timeout_sec=polling_lease_timeout_sec,
        result_retention_sec=result_retention_sec,
        collected_retention_sec=collected_result_retention_sec,
        cancel_backend=lambda rollout_id: backend.cancel_rollouts(ids=[rollout_id]),
    )
    service = RolloutService(backend, registry)
    instance_id = os.environ.get("_OSMOSIS_ROLLOUT_INSTANCE_ID") or service.process_id

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
        if not server.has_shutdown_work():
            headers[SHUTDOWN_HEADER] = "none"
        return payload, headers

    hot = HotRoutes(service, api_key=api_key, health=health_answer)
    server = RolloutServer(hot, lifespan=lifespan, shutdown_grace_sec=shutdown_grace_sec)
    return server


class RolloutServer:
    """The rollout server's ASGI app: the protocol's common case and the ASGI lifespan are
    served without FastAPI; anything else builds the FastAPI app behind it, once
    (`fastapi_app()`), which then serves every request and, if built before the server
    started, the lifespan too (a user's middleware then sees every request).

    Used as a FastAPI app, it forwards: any attribute it does not have itself (`app.get`,
    `app.add_middleware`, `app.state`, `app.router`, `app.openapi()`, ...) is read from, and
    any it does not hold is set on, the FastAPI app. The one thing that does not hold:
    `isinstance(app, FastAPI)` is False.
    """

    __slots__ = ("_app", "_grace", "_hot", "_lifespan")

    def __init__(
        self, hot: HotRoutes, *, lifespan: Lifespan | None, shutdown_grace_sec: float
    ) -> None:
        self._hot = hot
        self._lifespan = lifespan
        self._grace = shutdown_grace_sec
        self._app: RolloutFastAPI | None = None

    def fastapi_app(self) -> RolloutFastAPI:
        """The FastAPI app behind this one, built on the first call."""
        app = self._app
        if app is None:
            from osmosis.rollout.server_fastapi import build_fastapi_app

            app = self._app = build_fastapi_app(self._hot, lifespan=self._running)
        return app

    def has_shutdown_work(self) -> bool:
        """Whether stopping the server runs anybody's code (`SHUTDOWN_HEADER`). Read when
        asked: the user may add handlers or middleware after the start. Rollouts still in
        flight are the engine's to cancel; the shared policy client only closes."""
        app = self._app
        return (
            self._lifespan is not None
            or type(self._hot.service.backend).shutdown is not ExecutionBackend.shutdown
            or (
                app is not None
                and (bool(app.router.on_shutdown) or len(app.user_middleware) > app.own_middleware)
            )
        )

    def __getattr__(self, name: str) -> Any:
        # Only for names this class lacks: FastAPI's API. Dunders are probed by libraries
        # (`__wrapped__`, ...) and must not build it.
        if name.startswith("__") or name in RolloutServer.__slots__:
            raise AttributeError(name)
        return getattr(self.fastapi_app(), name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in RolloutServer.__slots__:
            object.__setattr__(self, name, value)
        else:
            setattr(self.fastapi_app(), name, value)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        app = self._app
        if app is not None:
            await app(scope, receive, send)
        elif scope["type"] == "http":
            await self._hot(scope, receive, send, self._stack)
        elif scope["type"] == "lifespan":
            await self._serve_lifespan(receive, send)
        else:
            await self.fastapi_app()(scope, receive, send)

    async def _stack(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.fastapi_app().stack(scope, receive, send)

    async def _serve_lifespan(self, receive: Receive, send: Send) -> None:
        """The ASGI lifespan as Starlette's router serves it (its messages, its failures), for
        as long as the server runs: a FastAPI app built meanwhile does not start again."""
        started = False
        await receive()
        try:
            async with self._running():
                await send({"type": "lifespan.startup.complete"})
                started = True
                await receive()
        except BaseException:
            failed = "lifespan.shutdown.failed" if started else "lifespan.startup.failed"
            await send({"type": failed, "message": traceback.format_exc()})
            raise
        await send({"type": "lifespan.shutdown.complete"})

    @asynccontextmanager
    async def _running(self) -> AsyncIterator[None]:
        """The server's lifespan, whichever app serves it: the user's, then the drain."""
        service = self._hot.service
        try:
            if self._lifespan is None:
                _tell_ready()
                yield
            else:
                async with self._lifespan(self):
                    _tell_ready()
                    yield
        finally:
            service.accepting = False
            await _drain(service.registry, self._grace)
            await service.backend.shutdown()
            policy = sys.modules.get("osmosis.rollout.policy")  # loaded only if a workflow used it
            if policy is not None:
                await policy.close_shared_client()


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


__all__ = [
    "DEFAULT_POLLING_LEASE_TIMEOUT_SEC",
    "DEFAULT_RESULT_RETENTION_SEC",
    "DEFAULT_RESULT_WAIT_TIMEOUT_SEC",
    "DEFAULT_SHUTDOWN_GRACE_SEC",
    "RolloutServer",
    "create_rollout_server",
]
