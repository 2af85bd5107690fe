"""How many requests the server works on at once, so that its threads and its database pool agree.

Every HTTP request but health first takes one of `settings.max_requests` slots and, when all
are taken, waits in line for one (first come, first served): load is queued, never refused.
The thread pool that runs the sync routes gets as many threads, and the database pool as many
connections plus `RESERVED_CONNECTIONS` (the scheduler, start-up). So a request that runs can
always get a connection at once.

Without this, FastAPI's 40 threads shared a pool of 15 connections: a request that held a
connection between two steps waited for a thread, while every thread waited for a
connection, until SQLAlchemy's 30 s pool timeout answered 500 (issue 13.2). uvicorn's own
`limit_concurrency` would answer 503 instead of queueing, so it stays unset.

    app.add_middleware(RequestSlots, slots=settings.max_requests, exempt={"/api/health"})
    await use_threads(settings.max_requests)  # in the lifespan, on the serving loop
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection

import anyio.to_thread
from starlette.types import ASGIApp, Receive, Scope, Send

RESERVED_CONNECTIONS = 4


def pool_size(max_requests: int) -> int:
    """Database connections for a server working on `max_requests` requests at once."""
    return max_requests + RESERVED_CONNECTIONS


async def use_threads(count: int) -> None:
    """Give the running loop's thread pool (sync routes and dependencies) `count` threads."""
    anyio.to_thread.current_default_thread_limiter().total_tokens = count


class RequestSlots:
    """ASGI middleware: at most `slots` requests in the app at once; the rest wait in line."""

    def __init__(self, app: ASGIApp, *, slots: int, exempt: Collection[str] = ()) -> None:
        self.app = app
        self.slots = slots
        self.exempt = frozenset(exempt)
        # Made on first use, on the loop that serves (tests may build an app in one loop and
        # call it from another).
        self._semaphore: asyncio.Semaphore | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def _line(self) -> asyncio.Semaphore:
        loop = asyncio.get_running_loop()
        if self._semaphore is None or self._loop is not loop:
            self._semaphore, self._loop = asyncio.Semaphore(self.slots), loop
        return self._semaphore

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in self.exempt:
            await self.app(scope, receive, send)
            return
        # Held until the response is sent: the request's database session closes only then.
        async with self._line():
            await self.app(scope, receive, send)
