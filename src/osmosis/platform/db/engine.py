"""Engines and sessions. SQLite gets WAL, `synchronous=NORMAL`, foreign keys and a busy wait.

The platform uses synchronous SQLAlchemy: FastAPI runs plain `def` endpoints in its thread
pool, the SQLite driver is synchronous anyway, and SQLAlchemy 2.1's asyncio layer would add
greenlet and aiosqlite for no gain at this scale (WAL SQLite does ~1,850 commits/s).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Engine, create_engine, event, make_url
from sqlalchemy.orm import Session, sessionmaker


class DatabaseUnavailable(RuntimeError):
    """The database cannot be used: its driver is missing or it does not answer."""


def safe_url(url: str) -> str:
    """`url` with any password masked, for messages and logs."""
    return make_url(url).render_as_string(hide_password=True)


def make_engine(url: str) -> Engine:
    """An engine for `url`, tuned for SQLite when that is the backend.

    engine = make_engine("sqlite:////tmp/p/platform.db")
    """
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite":
        try:
            return create_engine(url, pool_pre_ping=True)
        except ModuleNotFoundError as error:
            extra = "osmosis[postgres]" if parsed.get_backend_name() == "postgresql" else None
            fix = f"install {extra}" if extra else f"install the {error.name} package"
            raise DatabaseUnavailable(
                f"the driver for {parsed.drivername} ({error.name}) is not installed: {fix}"
            ) from None
    # Requests run in FastAPI's thread pool, so a connection may move between threads.
    engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})
    event.listen(engine, "connect", _sqlite_pragmas)
    return engine


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
