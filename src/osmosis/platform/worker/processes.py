"""The platform's processes in the database: each `server start` registers itself, says it is
alive every few seconds, and marks itself stopped on the way out.

    me = register(db, role="worker", settings=settings)      # a platform_processes id
    heartbeat(db, process_id=me)
    live = live_processes(db, now=db_now(db), within_s=settings.lease_s)
    mark_stopped(db, process_id=me)

Workers name their process in the runs they hold (`eval_runs.claimed_by`); `osmosis server
status` lists the live processes and their runs. A holder that ran on this machine and whose
process is gone (`dead_here`) lost its runs at once: nobody has to wait for its leases to run
out after a crash or a `kill -9` of the server.
"""

from __future__ import annotations

import contextlib
import functools
import os
import socket
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

from sqlalchemy import delete, func, select, update
from sqlalchemy.orm import Session

from osmosis._version import __version__
from osmosis.platform.core.db.models import utcnow
from osmosis.platform.core.db.process_models import PlatformProcess
from osmosis.platform.core.home_lock import process_alive
from osmosis.platform.core.settings import Settings

# Rows of processes gone this long are deleted by whoever heartbeats next.
FORGET_AFTER = timedelta(days=1)


def db_now(db: Session) -> datetime:
    """The time every lease is measured in: the database server's clock on PostgreSQL (the
    machines' clocks may differ), this machine's on SQLite (which only it uses)."""
    if db.get_bind().dialect.name == "postgresql":
        now = db.scalar(select(func.now()))
        assert isinstance(now, datetime)
        return now
    return utcnow()


@functools.cache
def node() -> str:
    """This machine and pid namespace: two processes with the same node can see each other's
    pids. The boot id changes with each boot; the pid namespace's inode tells containers apart."""
    parts = [socket.gethostname()]
    with contextlib.suppress(OSError):
        parts.append(Path("/proc/sys/kernel/random/boot_id").read_text().strip())
    with contextlib.suppress(OSError):
        parts.append(str(os.stat("/proc/self/ns/pid").st_ino))
    return "/".join(parts)[:255]


def process_start(pid: int) -> int | None:
    """When `pid` started (clock ticks after boot; Linux), or None where /proc does not say:
    with the pid, it names one process even after the pid is reused."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rpartition(")")[2].split()
    try:
        return int(fields[19])  # field 22 of proc(5); fields[0] is field 3
    except (IndexError, ValueError):
        return None


def register(db: Session, *, role: str, settings: Settings, max_runs: int | None = None) -> str:
    """Record this process as running `role`; returns its id."""
    now = db_now(db)
    process = PlatformProcess(
        role=role,
        host=socket.gethostname()[:255],
        node=node(),
        pid=os.getpid(),
        pid_start=process_start(os.getpid()),
        url=settings.url if role != "worker" else None,
        home=str(settings.home),
        version=__version__,
        max_runs=max_runs,
        started_at=now,
        heartbeat_at=now,
    )
    db.add(process)
    db.commit()
    return process.id


def heartbeat(db: Session, *, process_id: str) -> None:
    """Say this process is alive; also forget processes gone for a day."""
    now = db_now(db)
    db.execute(
        update(PlatformProcess)
        .where(PlatformProcess.id == process_id)
        .values(heartbeat_at=now, stopped_at=None)
    )
    db.execute(delete(PlatformProcess).where(PlatformProcess.heartbeat_at < now - FORGET_AFTER))
    db.commit()


def mark_stopped(db: Session, *, process_id: str) -> None:
    db.execute(
        update(PlatformProcess)
        .where(PlatformProcess.id == process_id)
        .values(stopped_at=db_now(db))
    )
    db.commit()


@dataclass(frozen=True)
class ProcessView:
    """A registered process as `server status` shows it."""

    id: str
    role: str
    host: str
    pid: int
    url: str | None
    home: str
    version: str
    max_runs: int | None
    started_at: datetime
    heartbeat_at: datetime
    heartbeat_age_s: float


def live_processes(db: Session, *, now: datetime, within_s: float) -> list[ProcessView]:
    """Processes not stopped that said they were alive in the last `within_s` seconds."""
    rows = db.scalars(
        select(PlatformProcess)
        .where(
            PlatformProcess.stopped_at.is_(None),
            PlatformProcess.heartbeat_at >= now - timedelta(seconds=within_s),
        )
        .order_by(PlatformProcess.role, PlatformProcess.started_at)
    )
    return [
        ProcessView(
            id=row.id,
            role=row.role,
            host=row.host,
            pid=row.pid,
            url=row.url,
            home=row.home,
            version=row.version,
            max_runs=row.max_runs,
            started_at=row.started_at,
            heartbeat_at=row.heartbeat_at,
            heartbeat_age_s=round(max((now - row.heartbeat_at).total_seconds(), 0.0), 1),
        )
        for row in rows
    ]


def dead_here(db: Session, *, exclude: str | None = None) -> list[str]:
    """Ids of processes that ran on this node and are gone (or stopped): their runs are free."""
    rows = db.execute(
        select(
            PlatformProcess.id,
            PlatformProcess.pid,
            PlatformProcess.pid_start,
            PlatformProcess.stopped_at,
        ).where(PlatformProcess.node == node(), PlatformProcess.id != (exclude or ""))
    )
    dead = []
    for process_id, pid, pid_start, stopped_at in rows:
        gone = not process_alive(pid) or (
            pid_start is not None and process_start(pid) not in (None, pid_start)
        )
        if stopped_at is not None or gone:
            dead.append(process_id)
    return dead
