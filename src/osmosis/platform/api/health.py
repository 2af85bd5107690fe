"""`GET /api/health`: the one route that needs no token (used to wait for start-up, and by
load balancers in front of several API processes).

It answers the home disk's free space, and whether the database and the blob store answered:
`status: degraded` with HTTP 503 when either did not. Those two are probed on a thread of
their own, at most every `PROBE_EVERY_SEC`, never on the request thread pool or the event
loop, and a request waits at most `PROBE_WAIT_SEC` for a probe in flight (else it gets the
last answer, with its age): health skips the queue of request slots and answers at once
under any load, as before.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
import time
from dataclasses import dataclass

from fastapi import APIRouter, Request, Response
from sqlalchemy import Engine, text

from osmosis._version import __version__
from osmosis.platform.core.blobs import BlobStore, open_store
from osmosis.platform.core.disk import disk_space
from osmosis.platform.core.schema_revision import schema_problem
from osmosis.platform.core.settings import Settings
from osmosis.wire import ComponentHealth, DiskPublic, Health

router = APIRouter(tags=["health"])
PATH = "/api/health"
PROBE_EVERY_SEC = 2.0
PROBE_WAIT_SEC = 1.0


@dataclass(frozen=True)
class _Answer:
    at: float  # monotonic
    database: ComponentHealth
    blob_store: ComponentHealth


class HealthProbe:
    """The latest answer of the database and the blob store, refreshed when asked and stale."""

    def __init__(self, engine: Engine, store: BlobStore) -> None:
        self.engine = engine
        self.store = store
        self._last: _Answer | None = None
        self._running: concurrent.futures.Future[_Answer] | None = None
        self._lock = threading.Lock()

    async def answer(self) -> _Answer | None:
        last = self._last
        if last is not None and time.monotonic() - last.at < PROBE_EVERY_SEC:
            return last
        future = self._start()
        with contextlib.suppress(TimeoutError):
            return await asyncio.wait_for(
                asyncio.shield(asyncio.wrap_future(future)), PROBE_WAIT_SEC
            )
        return self._last

    def _start(self) -> concurrent.futures.Future[_Answer]:
        with self._lock:
            if self._running is None or self._running.done():
                future: concurrent.futures.Future[_Answer] = concurrent.futures.Future()
                # A daemon thread, not the request pool: a database that hangs holds only it.
                threading.Thread(
                    target=self._probe, args=(future,), name="osmosis-health", daemon=True
                ).start()
                self._running = future
            return self._running

    def _probe(self, future: concurrent.futures.Future[_Answer]) -> None:
        answer = _Answer(time.monotonic(), self._database(), self._blob_store())
        self._last = answer
        future.set_result(answer)

    def _database(self) -> ComponentHealth:
        started = time.monotonic()
        try:
            with self.engine.connect() as connection:
                connection.execute(text("SELECT 1"))
            problem = schema_problem(self.engine)
        except Exception as error:  # whatever the driver raises: unreachable is the answer
            return ComponentHealth(
                ok=False, latency_ms=_ms(started), error=str(getattr(error, "orig", error))
            )
        detail = {"dialect": self.engine.dialect.name}
        return ComponentHealth(
            ok=problem is None, latency_ms=_ms(started), error=problem, detail=detail
        )

    def _blob_store(self) -> ComponentHealth:
        check = self.store.check()
        return ComponentHealth(
            ok=check.ok,
            latency_ms=check.latency_ms,
            error=check.error,
            detail={"mode": self.store.mode, "root": str(self.store.root)},
        )


def _ms(started: float) -> float:
    return round((time.monotonic() - started) * 1000, 3)


def _probe_of(request: Request) -> HealthProbe:
    state = request.app.state
    probe: HealthProbe | None = getattr(state, "health_probe", None)
    if probe is None:
        probe = state.health_probe = HealthProbe(state.engine, open_store(state.settings))
    return probe


@router.get(PATH, responses={503: {"model": Health, "description": "Degraded"}})
async def health(request: Request, response: Response) -> Health:
    settings: Settings = request.app.state.settings
    space = disk_space(settings.home, min_free_bytes=settings.min_free_disk_bytes)
    answer = await _probe_of(request).answer()
    unknown = ComponentHealth(ok=None, error="not checked yet")
    database = blob_store = unknown
    if answer is not None:
        age = round(time.monotonic() - answer.at, 1)
        database = answer.database.model_copy(update={"checked_s_ago": age})
        blob_store = answer.blob_store.model_copy(update={"checked_s_ago": age})
    degraded = database.ok is False or blob_store.ok is False
    if degraded:
        response.status_code = 503
    return Health(
        status="degraded" if degraded else "ok",
        version=__version__,
        role=settings.role,
        low_disk=space.low,
        disk=DiskPublic(
            free_bytes=space.free_bytes,
            total_bytes=space.total_bytes,
            min_free_bytes=space.min_free_bytes,
        ),
        database=database,
        blob_store=blob_store,
    )
