"""Engines and sessions. SQLite gets WAL, `synchronous=NORMAL`, foreign keys and a busy wait;
PostgreSQL goes through psycopg (v3), whatever driver the URL names or leaves out.

The platform uses synchronous SQLAlchemy: FastAPI runs plain `def` endpoints in its thread
pool, the SQLite driver is synchronous anyway, and SQLAlchemy 2.1's asyncio layer would add
greenlet and aiosqlite for no gain at this scale (WAL SQLite does ~1,850 commits/s). The
server's pool is sized to its request slots, so no running request waits for a connection
(`osmosis.platform.core.request_slots`).

Text never reaches either database with a NUL character in it: PostgreSQL refuses `\x00` in
text (the driver raises, a request would be a 500), and SQLite would keep it where PostgreSQL
cannot, so the same input would behave differently per backend. Every string bound into a
statement has NUL replaced by U+FFFD, the Unicode replacement character, on both. Names and
identifiers are refused earlier, by the validation of each field; this catches the free text
(logs, error messages, rollout output) and any field that validation lets through.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, QueuePool, create_engine, event, make_url
from sqlalchemy.orm import Session, sessionmaker

logger = logging.getLogger("osmosis.platform.core.db")
# How long a shutdown waits for the connections still in use to come back to the pool.
RETURN_WAIT_SEC = 5.0


class DatabaseUnavailable(RuntimeError):
    """The database cannot be used: its driver is missing or it does not answer."""


def safe_url(url: str) -> str:
    """`url` with any password masked, for messages and logs."""
    return make_url(url).render_as_string(hide_password=True)


def make_engine(url: str, *, pool_size: int | None = None) -> Engine:
    """An engine for `url`, tuned for SQLite when that is the backend.

    `pool_size` fixes the number of connections (no overflow): the server passes one per
    request slot plus a reserve (`request_slots.pool_size`); workers keep the default.

    engine = make_engine("sqlite:////tmp/p/platform.db", pool_size=20)
    """
    parsed = make_url(url)
    pool: dict[str, Any] = {} if pool_size is None else {"pool_size": pool_size, "max_overflow": 0}
    if parsed.drivername in _POSTGRESQL_ALIASES:
        # `postgresql://` would mean psycopg2 to SQLAlchemy; osmosis-eval[postgres] installs v3.
        parsed = parsed.set(drivername="postgresql+psycopg")
    if parsed.get_backend_name() != "sqlite":
        try:
            engine = create_engine(parsed, pool_pre_ping=True, **pool)
        except ModuleNotFoundError as error:
            extra = "osmosis-eval[postgres]" if parsed.get_backend_name() == "postgresql" else None
            fix = f"install {extra}" if extra else f"install the {error.name} package"
            raise DatabaseUnavailable(
                f"the driver for {parsed.drivername} ({error.name}) is not installed: {fix}"
            ) from None
        event.listen(engine, "before_cursor_execute", _without_nul, retval=True)
        return engine
    on_disk = bool(parsed.database) and parsed.database != ":memory:"
    if on_disk:
        _create_private(Path(str(parsed.database)))
    else:
        pool = {}  # an in-memory database has its own single-connection pool
    # Requests run in FastAPI's thread pool, so a connection may move between threads.
    engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30}, **pool)
    event.listen(engine, "connect", _sqlite_pragmas)
    event.listen(engine, "before_cursor_execute", _without_nul, retval=True)
    return engine


async def dispose_when_returned(engine: Engine, *, wait: float = RETURN_WAIT_SEC) -> int:
    """Close every connection of `engine` once those in use are back in its pool (waiting at
    most `wait` seconds); returns how many were still in use when it closed (0: none).

    A task cancelled at shutdown does not stop the thread running its query (asyncio cannot
    stop a thread): the thread returns its connection after the task is gone. `dispose()`
    before that leaves the connection, returned later, open in the discarded pool until the
    garbage collector finds it (PostgreSQL: an idle session of a stopped platform).

    await dispose_when_returned(engine)   # the app's shutdown, after its tasks are cancelled
    """
    pool = engine.pool
    deadline = time.monotonic() + wait
    in_use = _in_use(pool)
    while in_use and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
        in_use = _in_use(pool)
    if in_use:
        logger.warning(
            "closing the database pool with %d connections still in use after %.0f s",
            in_use,
            wait,
        )
    engine.dispose()
    return in_use


def _in_use(pool: object) -> int:
    # Only a QueuePool counts what it lent (on-disk SQLite and PostgreSQL use one); an
    # in-memory SQLite keeps its one connection for the process.
    return max(pool.checkedout(), 0) if isinstance(pool, QueuePool) else 0


_POSTGRESQL_ALIASES = frozenset({"postgresql", "postgres"})
NUL = "\x00"
NUL_REPLACEMENT = "\ufffd"


def without_nul(value: Any) -> Any:
    """`value` with every NUL replaced by U+FFFD when it is a string holding one."""
    if isinstance(value, str) and NUL in value:
        return value.replace(NUL, NUL_REPLACEMENT)
    return value


def _holds_nul(values: Any) -> bool:
    return any(isinstance(value, str) and NUL in value for value in values)


def _parameter_set(parameters: Any) -> Any:
    if isinstance(parameters, Mapping) and _holds_nul(parameters.values()):
        return {key: without_nul(value) for key, value in parameters.items()}
    if isinstance(parameters, tuple | list) and _holds_nul(parameters):
        return type(parameters)(without_nul(value) for value in parameters)
    return parameters


def _without_nul(
    _connection: Any,
    _cursor: Any,
    statement: str,
    parameters: Any,
    _context: Any,
    executemany: bool,
) -> tuple[str, Any]:
    # A scan of the bound values, copied only when one holds a NUL: cheap beside the query.
    # "insertmanyvalues" batches arrive flagged executemany with one flattened set (a mapping
    # for psycopg, a flat list for sqlite3): only a sequence of sets is many.
    many = executemany and isinstance(parameters, list | tuple) and parameters
    if many and isinstance(parameters[0], Mapping | list | tuple):
        return statement, [_parameter_set(one) for one in parameters]
    return statement, _parameter_set(parameters)


def _create_private(path: Path) -> None:
    """Create the database file 0600 before SQLite does: SQLite gives its `-wal` and `-shm`
    files the database file's mode, so all three stay owner-only whatever the umask."""
    if path.exists():
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileExistsError):
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    try:
        # WAL lets readers proceed while one writer commits; NORMAL is durable across app
        # crashes (only a power loss can drop the last transactions) and much faster than FULL.
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute("PRAGMA busy_timeout=30000")
    finally:
        cursor.close()


def make_session_factory(engine: Engine) -> sessionmaker[Session]:
    """Sessions whose objects stay readable after commit (responses are built after it)."""
    return sessionmaker(engine, expire_on_commit=False)
