"""The database side of `osmosis server status` and `osmosis server migrate`.

    view = platform_view(settings)        # {"processes": [...], "database": {...}}
    found, now = migrate_database(settings)

`status` shows every live process of the platform (whatever machine it runs on) and the runs
each worker holds, read from the database the settings name; a database that cannot be read
is reported, never a traceback. SQLAlchemy and Alembic are imported here, inside the
commands, so `osmosis --help` stays fast.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from osmosis.platform.core.settings import Settings


def _sqlite_missing(url: str) -> bool:
    """A SQLite URL whose file does not exist yet: nothing to read (and nothing to create)."""
    from sqlalchemy import make_url

    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite" or not parsed.database:
        return False
    return parsed.database != ":memory:" and not Path(parsed.database).exists()


def platform_view(settings: Settings) -> dict[str, Any]:
    """The live processes of the platform and the runs each holds."""
    from sqlalchemy.exc import SQLAlchemyError

    from osmosis.platform.core.db import make_engine, make_session_factory
    from osmosis.platform.core.db.engine import DatabaseUnavailable, safe_url
    from osmosis.platform.core.schema_revision import schema_problem
    from osmosis.platform.worker.leases import held_runs
    from osmosis.platform.worker.processes import db_now, live_processes

    url = settings.database_url
    assert url is not None
    database: dict[str, Any] = {"url": safe_url(url), "reachable": False}
    if _sqlite_missing(url):
        database["problem"] = "no database yet (the first start creates it)"
        return {"database": database, "processes": []}
    try:
        engine = make_engine(url)
    except DatabaseUnavailable as error:
        database["problem"] = str(error)
        return {"database": database, "processes": []}
    try:
        problem = schema_problem(engine)
        database["reachable"] = True
        if problem is not None:
            database["problem"] = problem
            return {"database": database, "processes": []}
        with make_session_factory(engine)() as db:
            now = db_now(db)
            processes = live_processes(db, now=now, within_s=settings.lease_s)
            runs = held_runs(db, now=now)
    except SQLAlchemyError as error:
        database["problem"] = f"cannot read the database: {getattr(error, 'orig', error)}"
        return {"database": database, "processes": []}
    finally:
        engine.dispose()
    by_holder: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for run in runs:
        by_holder[run.claimed_by].append(
            {"id": run.id, "name": run.name, "lease_expires_in_s": run.lease_expires_in_s}
        )
    live = {process.id for process in processes}
    listed = [
        {
            "id": process.id,
            "role": process.role,
            "host": process.host,
            "pid": process.pid,
            "url": process.url,
            "home": process.home,
            "version": process.version,
            "heartbeat_age_s": process.heartbeat_age_s,
            **({"runs": by_holder.get(process.id, [])} if process.role != "api" else {}),
        }
        for process in processes
    ]
    # Runs whose holder is not live: a worker that died; another takes them once the lease
    # has run out.
    orphaned = [run for holder, held in by_holder.items() if holder not in live for run in held]
    view: dict[str, Any] = {"database": database, "processes": listed}
    if orphaned:
        view["runs_without_a_live_worker"] = orphaned
    return view


def migrate_database(settings: Settings) -> tuple[str | None, str]:
    """Upgrade the database to this osmosis's newest revision; `CLIError` when it is newer
    than that, or cannot be reached."""
    from sqlalchemy.exc import OperationalError

    from osmosis.cli.output import CLIError
    from osmosis.platform.core.db import make_engine
    from osmosis.platform.core.db.engine import DatabaseUnavailable, safe_url
    from osmosis.platform.core.schema_revision import SchemaMismatch, check_schema

    url = settings.database_url
    assert url is not None
    try:
        engine = make_engine(url)
    except DatabaseUnavailable as error:
        raise CLIError(str(error), code="VALIDATION", hint="check OSMOSIS_DATABASE_URL") from None
    try:
        return check_schema(engine, migrate=True)
    except SchemaMismatch as error:
        raise CLIError(
            str(error), code="CONFLICT", hint="upgrade osmosis on this machine"
        ) from None
    except OperationalError as error:
        raise CLIError(
            f"cannot use the database at {safe_url(url)}: {error.orig}",
            code="VALIDATION",
            hint="check OSMOSIS_DATABASE_URL",
        ) from None
    finally:
        engine.dispose()
