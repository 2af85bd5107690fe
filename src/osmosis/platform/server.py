"""Run a platform process in its role, announcing itself through pid and state files.

    serve(Settings.from_env())                  # blocks until SIGINT/SIGTERM
    serve(Settings.from_env(role="worker"))     # claims and executes runs, serves no HTTP

Role `all` (the default) is the API and dashboard under uvicorn with the scheduler executing
runs in the same process; `api` is the HTTP part alone (its scheduler only registers the
process); `worker` is the scheduler alone. A process holds its home's lock for its role its
whole life (`osmosis.platform.core.home_lock`: `server.lock` for the HTTP part, `worker.lock` for
the worker; `all` takes both), works with umask 077, and tightens a home whose files others
could read. Before serving it checks the database's schema (`schema_revision`: only `all`
migrates by itself) and that its blob directory is the platform's (`blobs.check_identity`).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import threading
from datetime import UTC, datetime
from types import FrameType
from typing import Any

from osmosis.listen import bind_listener
from osmosis.platform.core.blobs import check_identity, open_store
from osmosis.platform.core.home_lock import HomeLock
from osmosis.platform.core.settings import Settings
from osmosis.private_file import (
    PRIVATE_UMASK,
    make_private_dir,
    tighten_home,
    write_private_json,
    write_private_text,
)

logger = logging.getLogger("osmosis.platform")


def serve(settings: Settings) -> None:
    """Lock the home, build the app and serve it in the foreground; clean up on the way out.

    `HomeInUse` (before anything in the home is touched) if another server holds the home;
    `PortInUse` / `ListenError` (`osmosis.listen`, before the database is touched) if the port
    is another socket's or cannot be bound.
    """
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    # Before the first file: the database, its WAL, blobs, logs, and everything the workers,
    # git and the rollout servers write inherit it.
    os.umask(PRIVATE_UMASK)
    make_private_dir(settings.home)
    locks = _lock(settings)
    listener = None
    try:
        if settings.role != "worker":
            # Bound first: a taken port fails the start in milliseconds, not after migrations.
            listener = bind_listener(settings.host, settings.port)
        if settings.role != "api" and (not settings.sandbox or settings.executor == "ray"):
            from osmosis.eval.sites.sandbox.support import OFF_WARNING, RAY_WARNING

            logger.warning(RAY_WARNING if settings.executor == "ray" else OFF_WARNING)
        _tighten(settings)
        prepare(settings)
        if settings.role == "worker":
            _work(settings)
        else:
            assert listener is not None
            _serve(settings, listener)
    finally:
        if listener is not None:
            listener.close()
        for lock in reversed(locks):
            lock.release()


def _lock(settings: Settings) -> list[HomeLock]:
    """The home's locks for this role, taken before anything in the home is touched."""
    locks = []
    try:
        if settings.role != "worker":
            locks.append(HomeLock.acquire(settings.lock_file, port=settings.port, url=settings.url))
        if settings.role != "api":
            locks.append(HomeLock.acquire(settings.worker_lock_file, port=0, url=""))
    except BaseException:
        for lock in locks:
            lock.release()
        raise
    return locks


def prepare(settings: Settings) -> None:
    """Check (role `all`: bring) the schema to this osmosis's, and the blob store to be the
    platform's; `SchemaMismatch` / `BlobStoreError` / `DatabaseUnavailable` say why not."""
    from sqlalchemy.exc import OperationalError

    from osmosis.platform.core.db import make_engine, make_session_factory
    from osmosis.platform.core.db.engine import DatabaseUnavailable, safe_url
    from osmosis.platform.core.schema_revision import check_schema

    assert settings.database_url is not None
    engine = make_engine(settings.database_url)
    try:
        check_schema(engine, migrate=settings.role == "all")
        store = open_store(settings)
        store.prepare()
        store_id = check_identity(store, make_session_factory(engine))
    except OperationalError as error:
        raise DatabaseUnavailable(
            f"cannot use the database at {safe_url(settings.database_url)}: {error.orig}"
        ) from None
    finally:
        engine.dispose()
    logger.info("blob store %s (%s, id %s)", store.root, store.mode, store_id)


def _tighten(settings: Settings) -> None:
    tightened = tighten_home(settings.home)
    if tightened.count:
        logger.warning(
            "removed group/other permissions from %d entries of %s that were readable by "
            "other users (e.g. %s)",
            tightened.count,
            settings.home,
            ", ".join(tightened.examples),
        )


def _serve(settings: Settings, listener: socket.socket) -> None:
    import uvicorn

    from osmosis.platform.app import create_app

    app = create_app(settings)
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level="info",
        # Our handler logs unexpected errors; uvicorn's access log has no secrets (no headers).
        server_header=False,
        timeout_graceful_shutdown=10,
    )
    server = uvicorn.Server(config)
    _write_state(settings)
    # uvicorn shuts down gracefully on SIGTERM, then re-raises the signal to the handler it
    # found; the default one would kill us before the pid file is removed, so exit cleanly.
    previous = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        server.run(sockets=[listener])
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
        _clear_state(settings)


def _work(settings: Settings) -> None:
    """Role `worker`: the scheduler alone, until SIGTERM or SIGINT."""
    import asyncio

    from osmosis.platform.core.crypto import KEY_ENV, SecretKeyError, load_secret_box
    from osmosis.platform.core.db import make_engine, make_session_factory
    from osmosis.platform.services.secrets import check_key

    assert settings.database_url is not None
    engine = make_engine(settings.database_url)
    sessions = make_session_factory(engine)
    env = {KEY_ENV: settings.secret_key} if settings.secret_key else {}
    box = load_secret_box(settings.home, env=env)
    with sessions() as db:
        if not check_key(db, box=box):
            engine.dispose()
            raise SecretKeyError(
                f"the secret key from {box.source} cannot decrypt the stored secrets: start "
                "with the key they were stored with (OSMOSIS_SECRET_KEY, the same for every "
                "process of the platform)"
            )

    async def work() -> None:
        from osmosis.platform.worker.scheduler import Scheduler

        scheduler = Scheduler(sessions, settings)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        await scheduler.start()
        logger.info("worker started (process %s): claiming runs", os.getpid())
        try:
            await stop.wait()
        finally:
            await scheduler.close()
            logger.info("worker stopped; its runs are left to resume")

    write_private_json(settings.worker_state_file, _state(settings))
    try:
        asyncio.run(work())
    finally:
        engine.dispose()
        _clear_worker_state(settings)


def _clear_worker_state(settings: Settings) -> None:
    try:
        data = json.loads(settings.worker_state_file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return
    if isinstance(data, dict) and data.get("pid") == os.getpid():
        settings.worker_state_file.unlink(missing_ok=True)


def _exit_on_sigterm(_signum: int, _frame: FrameType | None) -> None:
    raise SystemExit(0)


def _state(settings: Settings) -> dict[str, Any]:
    return {
        "pid": os.getpid(),
        "role": settings.role,
        "url": settings.url if settings.role != "worker" else None,
        "home": str(settings.home),
        "host": settings.host,
        "port": settings.port,
        "started_at": datetime.now(UTC).isoformat(),
    }


def _write_state(settings: Settings) -> None:
    write_private_text(settings.pid_file, f"{os.getpid()}\n")
    write_private_json(settings.state_file, _state(settings))


def _clear_state(settings: Settings) -> None:
    # Only the process named in the pid file removes it: a second server that failed to bind
    # must not erase the record of the one that is running.
    try:
        if int(settings.pid_file.read_text(encoding="utf-8").split()[0]) != os.getpid():
            return
    except (OSError, ValueError, IndexError):
        return
    settings.pid_file.unlink(missing_ok=True)
    settings.state_file.unlink(missing_ok=True)
