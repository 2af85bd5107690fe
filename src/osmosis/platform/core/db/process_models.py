"""Tables of the platform's processes: who is running (API and worker processes, their
heartbeats) and facts of the installation every process checks (the blob store's id).

Several processes share one database (issue 14): `osmosis server status` lists the live ones
from `platform_processes`, and each run names the process holding it (`eval_runs.claimed_by`).
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import BigInteger, Integer, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from osmosis.platform.core.db.models import Base, UtcDateTime, new_id, utcnow


class PlatformProcess(Base):
    """One `osmosis server start` process: its role, where it runs and when it last said so."""

    __tablename__ = "platform_processes"

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    role: Mapped[str] = mapped_column(String(16))  # all | api | worker
    host: Mapped[str] = mapped_column(String(255))  # the machine's name, for people
    # The machine and pid namespace, for processes: a holder with the same node whose pid is
    # gone (or is another process now: `pid_start` differs) is dead, whatever its lease says.
    node: Mapped[str] = mapped_column(String(255))
    pid: Mapped[int] = mapped_column(Integer)
    pid_start: Mapped[int | None] = mapped_column(BigInteger)
    url: Mapped[str | None] = mapped_column(Text)
    home: Mapped[str] = mapped_column(Text)
    version: Mapped[str] = mapped_column(String(64))
    max_runs: Mapped[int | None] = mapped_column(Integer)
    started_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)
    heartbeat_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)
    stopped_at: Mapped[datetime | None] = mapped_column(UtcDateTime)


class PlatformMeta(Base):
    """Key/value facts of the installation, e.g. `blob_store_id`."""

    __tablename__ = "platform_meta"

    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[str] = mapped_column(Text)
