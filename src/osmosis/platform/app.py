"""`create_app(settings)`: the whole platform from one settings object, nothing at import.

    app = create_app(Settings(home=tmp_path))

Building the app creates the home and blob directories, opens the engine, applies the Alembic
migrations and, on first start, creates the admin user. It also loads the key for secrets at
rest (`OSMOSIS_SECRET_KEY`, else `<home>/secret.key`, created 0600 on first start).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import Depends, FastAPI
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session, sessionmaker

from osmosis._version import __version__
from osmosis.platform.api import (
    admin,
    auth,
    cli,
    datasets,
    eval_runs,
    health,
    metrics,
    secrets,
    workspaces,
)
from osmosis.platform.core.body_limit import BodyLimit
from osmosis.platform.core.crypto import KEY_ENV, SecretBox, SecretKeyError, load_secret_box
from osmosis.platform.core.db import make_engine, make_session_factory, upgrade
from osmosis.platform.core.db.engine import DatabaseUnavailable, dispose_when_returned, safe_url
from osmosis.platform.core.errors import install_error_handling
from osmosis.platform.core.request_slots import RequestSlots, pool_size, use_threads
from osmosis.platform.core.settings import Settings
from osmosis.platform.deps import current_token
from osmosis.platform.services.bootstrap import bootstrap
from osmosis.platform.services.datasets import recover_interrupted
from osmosis.platform.services.secrets import check_key as check_secret_key
from osmosis.platform.services.token_use import TokenUses, keep_flushing
from osmosis.platform.web import install_dashboard
from osmosis.platform.worker.scheduler import Scheduler
from osmosis.private_file import make_private_dir
from osmosis.wire import ErrorBody

_ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorBody, "description": description}
    for status, description in {
        401: "No valid API token",
        403: "Not allowed for this user",
        404: "Not found",
        409: "Conflict",
        422: "Invalid request",
        507: "The platform's disk is full: the change was not saved (code DISK_FULL)",
    }.items()
}


def create_app(settings: Settings) -> FastAPI:
    """Build the platform application for `settings` (engine, schema, first admin, routes)."""
    make_private_dir(settings.home)
    make_private_dir(settings.blob_dir)
    assert settings.database_url is not None  # filled in by Settings
    # As many connections as requests can run at once, plus a reserve: none waits for one.
    engine = make_engine(settings.database_url, pool_size=pool_size(settings.max_requests))
    try:
        upgrade(engine)
    except OperationalError as error:
        engine.dispose()
        raise DatabaseUnavailable(
            f"cannot use the database at {safe_url(settings.database_url)}: {error.orig}"
        ) from None
    sessions = make_session_factory(engine)
    try:
        bootstrap(sessions, settings)
        recover_interrupted(sessions, settings)  # uploads a crash cut short end `error`
        secret_box = _secret_box(sessions, settings)
    except BaseException:  # SecretKeyError or any other: no app, so no open connection
        engine.dispose()
        raise

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        await use_threads(settings.max_requests)  # one thread per request slot
        await scheduler.start()  # evaluation runs execute only while the server serves
        # Token uses are written here, never by the request that made them (issue 25.5).
        flusher = asyncio.create_task(keep_flushing(token_uses, sessions), name="token-uses")
        try:
            yield
        finally:
            flusher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await flusher
            await scheduler.close()
        # After the threads of cancelled tasks (a scheduler round, a late flush) give back
        # their connections: one given back to a disposed pool would stay open.
        await dispose_when_returned(engine)

    app = FastAPI(
        title="osmosis platform",
        version=__version__,
        lifespan=lifespan,
        responses={500: {"model": ErrorBody, "description": "Internal error"}},
    )
    app.state.settings = settings
    app.state.engine = engine
    app.state.sessions = sessions
    app.state.secret_box = secret_box
    app.state.token_uses = token_uses = TokenUses()
    app.state.scheduler = scheduler = Scheduler(sessions, settings)
    install_error_handling(app)
    # Before any route reads a body: JSON and forms are parsed whole (uploads stream).
    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes)
    # Outermost: requests beyond `max_requests` wait in line here; health never waits.
    app.add_middleware(RequestSlots, slots=settings.max_requests, exempt={health.PATH})

    app.include_router(health.router)
    # Every other router is mounted behind the token check: a route added later cannot
    # forget it. Routes that also need the user use `CurrentUser`; FastAPI caches the lookup.
    for router in (
        auth.router,
        admin.router,
        workspaces.router,
        secrets.router,
        datasets.router,
        eval_runs.router,
    ):
        app.include_router(router, dependencies=[Depends(current_token)], responses=_ERRORS)
    cli.install(app)  # /api/cli: the official osmosis CLI's routes, over the same services
    install_dashboard(app)  # the HTML pages at /, signed in with the same tokens
    metrics.install(app, settings, sessions)  # /metrics for the operator's Prometheus
    return app


def _secret_box(sessions: sessionmaker[Session], settings: Settings) -> SecretBox:
    """The key for secrets at rest; a key that cannot read the stored secrets stops start-up
    here, with a clear message, rather than failing each later request that needs them."""
    env = {KEY_ENV: settings.secret_key} if settings.secret_key else {}
    box = load_secret_box(settings.home, env=env)
    with sessions() as db:
        if not check_secret_key(db, box=box):
            raise SecretKeyError(
                f"the secret key from {box.source} cannot decrypt the stored secrets: start "
                "with the key they were stored with (OSMOSIS_SECRET_KEY or <home>/secret.key)"
            )
    return box
