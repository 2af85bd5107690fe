"""Instant wake-ups between the platform's processes on PostgreSQL (`LISTEN/NOTIFY`).

    announce(db, "stop", run.id)          # before db.commit(): delivered at the commit
    listener = Listener(engine, on_notify=lambda kind, run_id: scheduler.wake())
    listener.start()                      # a thread with its own connection, LISTENing
    listener.close()

A stop request and a new (or retried) run are announced on the channel `osmosis_runs` with the
payload `<kind>:<run id>`, in the transaction that records them: PostgreSQL delivers a NOTIFY
at its transaction's commit, never for a rolled-back one. Each worker process listens on a
connection of its own (autocommit) and wakes its scheduler, which then reads the database at
once instead of at its next poll. Polling stays: a notification missed while the listener
reconnects, or one sent by a process of an older version, costs at most one poll interval.
SQLite has no NOTIFY: `announce` does nothing there and no listener starts.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from sqlalchemy import Engine, func, select
from sqlalchemy.orm import Session

if TYPE_CHECKING:
    import psycopg

logger = logging.getLogger("osmosis.platform.core.notify")

CHANNEL = "osmosis_runs"
STOP = "stop"  # a stop was requested for a running run
SUBMIT = "submit"  # a run is pending: submitted, or retried
# How often the listener thread looks at whether it is asked to close, and the longest wait
# between two connection attempts after the database refused one.
_CHECK_SEC = 0.25
_RETRY_MAX_SEC = 30.0
_CONNECT_TIMEOUT_SEC = 10

OnNotify = Callable[[str, str], None]  # (kind, run id); ("", "") after a (re)connect


def is_postgres(bind: Engine | Session) -> bool:
    engine = bind.get_bind() if isinstance(bind, Session) else bind
    return engine.dialect.name == "postgresql"


def announce(db: Session, kind: str, run_id: str) -> None:
    """Notify every listening process at this transaction's commit (nothing on SQLite)."""
    if is_postgres(db):
        db.execute(select(func.pg_notify(CHANNEL, f"{kind}:{run_id}")))


class Listener:
    """A daemon thread LISTENing on `CHANNEL` over its own connection, calling `on_notify`
    (from that thread) for each notification. A lost connection is opened again, backing off
    up to 30 s; `on_notify("", "")` after each (re)connect covers what was missed meanwhile."""

    def __init__(self, engine: Engine, *, on_notify: OnNotify) -> None:
        self._url = engine.url.set(drivername="postgresql").render_as_string(hide_password=False)
        self._on_notify = on_notify
        self._closing = threading.Event()
        self._listening = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="osmosis-notify", daemon=True)
        self._thread.start()

    def wait_listening(self, timeout: float) -> bool:
        """Whether the listener is LISTENing (within `timeout` seconds)."""
        return self._listening.wait(timeout)

    def close(self, timeout: float = 2.0) -> None:
        self._closing.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def _connect(self) -> psycopg.Connection[tuple[object, ...]]:
        import psycopg  # osmosis-eval[postgres]; only PostgreSQL platforms get here

        conn = psycopg.connect(self._url, autocommit=True, connect_timeout=_CONNECT_TIMEOUT_SEC)
        try:
            conn.execute(f"LISTEN {CHANNEL}")
        except BaseException:  # `_run` retries with a new one: this one must not stay open
            conn.close()
            raise
        return conn

    def _run(self) -> None:
        delay = 0.0
        while not self._closing.is_set():
            try:
                with self._connect() as conn:
                    if delay:
                        logger.info("listening for run notifications again")
                    delay = 0.0
                    self._listening.set()
                    self._on_notify("", "")
                    while not self._closing.is_set():
                        for note in conn.notifies(timeout=_CHECK_SEC):
                            kind, _, run_id = note.payload.partition(":")
                            self._on_notify(kind, run_id)
            except Exception as error:  # polling covers the gap; try again
                self._listening.clear()
                delay = min(delay * 2, _RETRY_MAX_SEC) if delay else 1.0
                logger.warning(
                    "cannot listen for run notifications (%s); polling meanwhile, trying again "
                    "in %.0f s",
                    str(error).splitlines()[0] if str(error) else type(error).__name__,
                    delay,
                )
                self._closing.wait(delay)
        self._listening.clear()
