"""A stopping platform waits for the queries of the background tasks it cancels (the scheduler's
round, the token-use flush): asyncio cannot stop their threads, and before, a query blocked
as the platform stopped finished after it -- a process row listed as live by `server status`
until its lease ran out, a connection out after the engine was closed (the CI flake of
1b2d95f).

Each test holds a lock the blocked query waits on (PostgreSQL: LOCK TABLE, or the claims'
advisory lock; SQLite: a write transaction, which the platform's busy wait waits on) and lets
it go half a second after the stop began."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from datetime import timedelta
from typing import Any

import psycopg
from fastapi.testclient import TestClient
from sqlalchemy import Engine, event, make_url, update

from osmosis.platform import create_app
from osmosis.platform.core.db.models import ApiToken, Workspace
from osmosis.platform.core.db.run_models import EvalRun
from osmosis.platform.core.settings import Settings
from osmosis.platform.operations import platform_status
from osmosis.platform.services.token_use import TokenUses, keep_flushing
from osmosis.platform.worker import leases, processes
from osmosis.platform.worker.scheduler import POLL_SEC, Scheduler
from tests.platform.databases import Databases
from tests.platform.test_roles_leases import World
from tests.platform.test_shutdown_connections import within

RELEASE_AFTER_SEC = 0.5
LEASE_LEFT_SEC = 1.0


@contextmanager
def _table_locked(settings: Settings, table: str) -> Iterator[Callable[[], None]]:
    """Writes to `table` wait until the function yielded is called (or the block ends)."""
    with _holding(settings, postgresql=f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE") as release:
        yield release


@contextmanager
def _holding(
    settings: Settings, *, postgresql: str, then: str = ""
) -> Iterator[Callable[[], None]]:
    """A transaction holding a lock (SQLite: its one write lock; PostgreSQL: `postgresql`),
    which also did `then`, until the function yielded is called (or the block ends)."""
    assert settings.database_url is not None
    url = make_url(settings.database_url)
    if url.get_backend_name() == "sqlite":
        assert url.database is not None
        lite = sqlite3.connect(url.database, isolation_level=None, check_same_thread=False)
        lite.execute("BEGIN IMMEDIATE")  # the database's one write lock, for every table
        if then:
            lite.execute(then)
        release = lambda: lite.in_transaction and lite.execute("COMMIT")  # noqa: E731
        close = lite.close
    else:
        conninfo = url.set(drivername="postgresql").render_as_string(hide_password=False)
        pg = psycopg.connect(conninfo)
        pg.execute(postgresql)
        if then:
            pg.execute(then)
        release, close = pg.commit, pg.close
    lock = threading.Lock()
    released = False

    def once() -> None:
        nonlocal released
        with lock:
            if not released:
                released = True
                release()

    try:
        yield once
    finally:
        once()
        close()


def _released_later(release: Callable[[], None]) -> threading.Timer:
    timer = threading.Timer(RELEASE_AFTER_SEC, release)
    timer.start()
    return timer


def _record_after(engine: Engine, stopped: threading.Event) -> list[str]:
    """Every statement and commit on `engine` once `stopped` is set."""
    late: list[str] = []

    def statement(_conn: Any, _cursor: Any, sql: str, *_rest: Any) -> None:
        if stopped.is_set():
            late.append(sql)

    def commit(_conn: Any) -> None:
        if stopped.is_set():
            late.append("COMMIT")

    event.listen(engine, "after_cursor_execute", statement)
    event.listen(engine, "commit", commit)
    return late


def test_a_platform_stopped_while_registering_is_not_listed_as_live(tmp_path, databases: Databases):
    settings = databases.settings(tmp_path / "home")
    app = create_app(settings)
    engine = app.state.engine
    try:
        with _table_locked(settings, "platform_processes") as release:
            with TestClient(app):
                # The scheduler's first query, registering this process, waits on the lock.
                assert within(30, lambda: engine.pool.checkedout() == 1)
                registered = app.state.scheduler.process_id
                timer = _released_later(release)  # once the platform is stopping
            timer.join()
        assert registered is None  # the stop came while it registered
        status = platform_status(settings)
        assert status["database"]["reachable"] is True
        assert status["processes"] == [], "a stopped platform is listed as live"
    finally:
        engine.dispose()


async def test_no_query_of_the_scheduler_runs_after_close(tmp_path, databases: Databases):
    settings = databases.settings(tmp_path / "home")
    app = create_app(settings)  # the database, migrated; its lifespan does not run here
    engine = app.state.engine
    stopped = threading.Event()
    late = _record_after(engine, stopped)
    scheduler = Scheduler(app.state.sessions, settings)
    try:
        with _table_locked(settings, "platform_processes") as release:
            await scheduler.start()
            checked_out = lambda: engine.pool.checkedout() == 1  # noqa: E731
            assert await asyncio.to_thread(within, 30, checked_out)
            timer = _released_later(release)
            await scheduler.close()
            stopped.set()
            in_use = engine.pool.checkedout()
            await asyncio.to_thread(timer.join)
            # Time for a query left running to land (none must).
            await asyncio.to_thread(within, 10, lambda: engine.pool.checkedout() == 0)
        assert in_use == 0, "close() returned while a query of the scheduler still ran"
        assert late == [], f"the scheduler wrote after close(): {late}"
        status = await asyncio.to_thread(platform_status, settings)
        assert status["processes"] == []
    finally:
        engine.dispose()


async def test_a_stopped_flusher_has_written_the_use_its_cancelled_flush_held(
    tmp_path, databases: Databases
):
    settings = databases.settings(tmp_path / "home")
    app = create_app(settings)
    engine, sessions = app.state.engine, app.state.sessions
    with sessions() as db:
        token = db.query(ApiToken).one()
        assert token.last_used_at is None
    uses = TokenUses()
    uses.record(token)
    stopped = threading.Event()
    late = _record_after(engine, stopped)
    try:
        with _table_locked(settings, "api_tokens") as release:
            flusher = asyncio.create_task(keep_flushing(uses, sessions, every=0.01))
            checked_out = lambda: engine.pool.checkedout() == 1  # noqa: E731
            assert await asyncio.to_thread(within, 30, checked_out)  # the flush is blocked
            assert len(uses) == 0  # its batch is taken
            flusher.cancel()
            timer = _released_later(release)
            with suppress(asyncio.CancelledError):
                await flusher
            stopped.set()
            in_use = engine.pool.checkedout()
            with sessions() as db:
                written = db.get(ApiToken, token.id)
                assert written is not None
                last_used = written.last_used_at
            await asyncio.to_thread(timer.join)
            await asyncio.to_thread(within, 10, lambda: engine.pool.checkedout() == 0)
        assert in_use == 0, "the flusher ended while its flush still ran"
        assert last_used is not None, "the use was not written when the flusher ended"
        assert [sql for sql in late if sql.lstrip().startswith("UPDATE")] == []
    finally:
        engine.dispose()


async def test_a_run_claimed_as_the_worker_stopped_is_given_back(tmp_path, databases: Databases):
    settings = databases.settings(tmp_path / "home", worker_warm=False)
    app = create_app(settings)
    engine, sessions = app.state.engine, app.state.sessions
    with sessions() as db:
        workspace = Workspace(identity="example.com/team/repo")
        db.add(workspace)
        db.commit()
        world = World(settings, sessions, workspace.id)
    (run_id,) = world.runs(1)
    sqlite = not databases.postgresql
    with sessions() as db:
        if sqlite:
            # A round takes SQLite's write lock only once it sees a run to claim: this one,
            # whose lease runs out (its worker froze) while the lock below is held.
            expires = processes.db_now(db) + timedelta(seconds=LEASE_LEFT_SEC)
            changes = {"status": "running", "claimed_by": "frozen", "lease_expires_at": expires}
        else:
            changes = {"status": "failed"}  # out of the queue until the lock puts it back
        db.execute(update(EvalRun).where(EvalRun.id == run_id).values(**changes))
        db.commit()
    scheduler = Scheduler(sessions, settings)
    try:
        await scheduler.start()
        assert await asyncio.to_thread(within, 30, lambda: scheduler.process_id is not None)
        # The next claim waits on the lock (PostgreSQL: the claims' own lock); the run it
        # then finds is pending again.
        pending = f"UPDATE eval_runs SET status = 'pending' WHERE id = '{run_id}'"
        holding = _holding(
            settings,
            postgresql=f"SELECT pg_advisory_xact_lock({leases.CLAIM_LOCK})",
            then="" if sqlite else pending,
        )
        with holding as release:
            if sqlite:  # a round has seen the lease run out since, and waits for the lock
                await asyncio.sleep(LEASE_LEFT_SEC + 2 * POLL_SEC)
            checked_out = lambda: engine.pool.checkedout() == 1  # noqa: E731
            assert await asyncio.to_thread(within, 30, checked_out)
            timer = _released_later(release)
            await scheduler.close()
            await asyncio.to_thread(timer.join)
            # Time for a claim left running to land (none must).
            await asyncio.to_thread(within, 10, lambda: engine.pool.checkedout() == 0)
        run = world.run(run_id)
        assert run.status == "running"  # claimed, as the worker stopped
        assert run.claimed_by is None, "the run stays held by a stopped worker"
        assert run.lease_expires_at is None  # any worker resumes it at once
    finally:
        engine.dispose()
