"""`GET /health` says when stopping the server runs nobody's code (`SHUTDOWN_HEADER: none`):
the engine then ends it at once rather than waiting out uvicorn's graceful exit. Anything
that could run on shutdown keeps the header away, and the graceful stop with it."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from osmosis import LocalBackend, create_rollout_server
from osmosis.rollout.protocol import SHUTDOWN_HEADER
from tests.unit.rollout.test_server_routes import Answer, Exact, PassThrough


class ClosingBackend(LocalBackend):
    async def shutdown(self) -> None:  # e.g. closes a pool of sandboxes
        return None


@contextlib.asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    yield


def plain(tmp_path, backend=LocalBackend, **options: Any) -> FastAPI:
    return create_rollout_server(
        backend=backend(workflow=Answer, grader=Exact, artifact_root=tmp_path),
        configure_logging=False,
        **options,
    )


def with_handler(app: FastAPI) -> FastAPI:
    app.router.on_shutdown.append(lambda: None)
    return app


def with_middleware(app: FastAPI) -> FastAPI:
    app.add_middleware(PassThrough)
    return app


CASES: dict[str, tuple[Callable[[Any], FastAPI], str | None]] = {
    "nothing of the user's": (lambda tmp: plain(tmp), "none"),
    "an api key (our own middleware)": (lambda tmp: plain(tmp, api_key="k"), "none"),
    "a lifespan": (lambda tmp: plain(tmp, lifespan=lifespan), None),
    "a shutdown handler added later": (lambda tmp: with_handler(plain(tmp)), None),
    "a backend with its own shutdown": (lambda tmp: plain(tmp, backend=ClosingBackend), None),
    "a middleware of the user's": (lambda tmp: with_middleware(plain(tmp)), None),
}


@pytest.mark.parametrize("case", list(CASES))
async def test_health_says_there_is_nothing_to_shut_down_only_when_nothing_would_run(
    tmp_path, case
) -> None:
    make, expected = CASES[case]
    app = make(tmp_path)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://rollout") as client:
        reply = await client.get("/health", headers={"Authorization": "Bearer k"})
    assert reply.status_code == 200
    assert reply.headers.get(SHUTDOWN_HEADER) == expected
