"""Tables of the platform's processes: who is running (API and worker processes, their
heartbeats) and facts of the installation every process checks (the blob store's id).

Several processes share one database (issue 14): `osmosis server status` lists the live ones
from `platform_processes`, and each run names the process holding it (`eval_runs.claimed_by`).
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import BigInteger, Float, Integer, String, Text
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


class ModelLimit(Base):
    """The adaptive limit on calls in flight to one provider key, shared by every worker
    (`osmosis.platform.worker.model_limits`). Keyed by a hash of (provider, base URL, model,
    key hash): never the API key itself."""

    __tablename__ = "model_limits"

    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    in_flight_limit: Mapped[float] = mapped_column(Float)
    throttled: Mapped[int] = mapped_column(BigInteger, default=0)  # 429s seen by every worker
    # Wall-clock seconds of the last cut: a 429 to a call sent before it is the same burst.
    cut_at: Mapped[float] = mapped_column(Float, default=0.0)
    updated_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)


class ModelLimitDemand(Base):
    """What one worker process wants of a shared model limit (calls in flight and waiting, at
    most its `max_in_flight`), with its heartbeat: the limit is split among the live ones."""

    __tablename__ = "model_limit_demands"

    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    worker: Mapped[str] = mapped_column(String(32), primary_key=True)
    demand: Mapped[int] = mapped_column(Integer)
    ceiling: Mapped[int] = mapped_column(Integer)
    seen_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)
