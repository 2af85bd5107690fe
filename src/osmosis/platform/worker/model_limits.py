"""Adaptive model limits shared by every platform worker, through the database (issue 28.3).

Each run executes in its own worker process, and each process's bridges take their provider
calls' slots from the process's AIMD limit for the key (`osmosis.eval.model.bridge_limits`).
Two runs on one key would each grow their own limit until the provider answers 429, and
fight. `DatabaseLimits` (the worker installs it: `install_coordinator`) makes them share one:

- `model_limits` holds, per key (a hash of provider, base URL, model and key hash: never the
  API key), the global limit on calls in flight, the 429 count and the last cut;
- `model_limit_demands` holds what each worker wants of it (calls in flight and waiting, at
  most its `max_in_flight`), with a heartbeat;
- every `interval` s (at once after a 429) each worker reports what its limit saw: a cut
  cuts the global limit by `DECREASE`, unless the 429 answered a call sent before the last
  global cut (the same burst, seen by another worker: one cut per round trip); answers that
  found every slot taken add to it as AIMD does (one per answer until the key's first 429,
  then one per limit's worth), up to the sum of the live workers' ceilings;
- each worker then takes its max-min fair share of the global limit by demand among the
  workers seen in the last `seen_s` s (what the others leave is split evenly), as its own
  limit until the next round. Between rounds a 429 still cuts it at once; it grows only
  with the global limit (each worker growing its own share would probe past the provider's
  limit once per worker).

A database fault skips a round (the local limit goes on adapting alone) and is logged once
per minute at most; `close()` removes the worker's demand rows.

    coordinator = DatabaseLimits(engine)
    install_coordinator(coordinator)
    ...                                   # run the evaluation
    install_coordinator(None)
    coordinator.close()
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from datetime import timedelta
from typing import Any, cast

from sqlalchemy import CursorResult, Engine, delete, select, update
from sqlalchemy.exc import IntegrityError, SQLAlchemyError
from sqlalchemy.orm import Session

from osmosis.eval.model.bridge_limits import (
    DECREASE,
    INITIAL_LIMIT,
    AdaptiveLimit,
    LimitKey,
    LimitReport,
)
from osmosis.platform.core.db import make_session_factory
from osmosis.platform.core.db.models import new_id, utcnow
from osmosis.platform.core.db.process_models import ModelLimit, ModelLimitDemand

__all__ = ["DatabaseLimits", "fair_share", "limit_hash"]

logger = logging.getLogger("osmosis.platform.worker.model_limits")

INTERVAL_S = 0.5
"""How often a worker syncs its limits (a 429 syncs at once)."""
SEEN_S = 3.0
"""A worker whose demand is older than this is gone: the others share its part."""
_COMPLAIN_EVERY_S = 60.0


def limit_hash(key: LimitKey) -> str:
    """The `model_limits` key of a limit key (already free of the API key, hashed again so
    that the base URL and model are not stored either)."""
    return hashlib.sha256("\0".join(key).encode()).hexdigest()[:64]


def fair_share(total: float, demands: dict[str, int], own: str) -> float:
    """`own`'s max-min fair share of `total` among `demands`: a worker wanting less than an
    even split gets what it wants, the rest split the remainder; what nobody wants is split
    evenly on top (so a call arriving before the next round finds a slot).

        fair_share(20, {"a": 128, "b": 128}, "a")  # 10.0
        fair_share(20, {"a": 4, "b": 128}, "b")    # 16.0
    """
    remaining = float(total)
    ordered = sorted(demands.items(), key=lambda item: item[1])
    given: dict[str, float] = {}
    for index, (worker, demand) in enumerate(ordered):
        given[worker] = min(float(demand), remaining / (len(ordered) - index))
        remaining -= given[worker]
    return given.get(own, 0.0) + remaining / max(1, len(ordered))


class DatabaseLimits:
    """A `LimitCoordinator` sharing this process's limits through the platform database (see
    the module doc). Its rounds run in a background thread."""

    def __init__(
        self,
        engine: Engine,
        *,
        interval: float = INTERVAL_S,
        seen_s: float = SEEN_S,
        worker: str | None = None,
        background: bool = True,
    ) -> None:
        """`background=False`: no thread; rounds happen when the caller calls `sync`."""
        self.worker = worker or new_id()
        self.interval = interval
        self.seen_s = seen_s
        self._sessions = make_session_factory(engine)
        self._limits: list[tuple[str, AdaptiveLimit]] = []
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._complained = 0.0
        self._thread: threading.Thread | None = None
        if background:
            self._thread = threading.Thread(target=self._run, name="model-limits", daemon=True)
            self._thread.start()

    def attach(self, limit: AdaptiveLimit) -> None:
        with self._lock:
            self._limits.append((limit_hash(limit.key), limit))
        limit.on_cut = self._wake.set
        self._wake.set()

    def close(self) -> None:
        """Stop syncing and withdraw this worker's demand (the others take its share)."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self.sync()  # the last 429s and answers count too
        with self._lock:
            limits, self._limits = self._limits, []
        for _, limit in limits:
            limit.detach()
        try:
            with self._sessions() as db:
                db.execute(delete(ModelLimitDemand).where(ModelLimitDemand.worker == self.worker))
                db.commit()
        except SQLAlchemyError as error:  # its rows go stale by themselves in `seen_s`
            logger.warning("cannot withdraw this worker's model limit demand: %s", error)

    def sync(self) -> None:
        """One round for every limit (the background thread calls it every `interval`)."""
        with self._lock:
            limits = list(self._limits)
        for key, limit in limits:
            report = limit.take_report()
            try:
                with self._sessions() as db:
                    total, throttled, share = self._round(db, key, report)
                    db.commit()
            except IntegrityError:
                # Another worker created the key's row at the same moment: the next round.
                limit.restore(report)
                continue
            except SQLAlchemyError as error:
                limit.restore(report)
                now = time.monotonic()
                if now - self._complained > _COMPLAIN_EVERY_S:
                    self._complained = now
                    logger.warning(
                        "cannot share the model limit through the database (this worker "
                        "adapts alone until it can): %s",
                        error,
                    )
                continue
            limit.adopt(share, shared=(max(1, int(total)), throttled))

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.interval)
            self._wake.clear()
            if not self._stop.is_set():
                self.sync()

    def _round(self, db: Session, key: str, report: LimitReport) -> tuple[float, int, float]:
        """Report, update the global limit, and return (global limit, 429s, this share)."""
        now = utcnow()
        # The demand first: on SQLite this write takes the database's write lock, so the
        # read-modify-write of the limit below is never interleaved (PostgreSQL: row lock).
        values = {"demand": report.demand, "ceiling": report.ceiling, "seen_at": now}
        mine = (ModelLimitDemand.key == key, ModelLimitDemand.worker == self.worker)
        written = db.execute(update(ModelLimitDemand).where(*mine).values(**values))
        if cast(CursorResult[Any], written).rowcount == 0:
            db.add(ModelLimitDemand(key=key, worker=self.worker, **values))
            db.flush()
        row = db.execute(
            select(ModelLimit).where(ModelLimit.key == key).with_for_update()
        ).scalar_one_or_none()
        if row is None:
            start = float(min(INITIAL_LIMIT, report.ceiling))
            row = ModelLimit(
                key=key, in_flight_limit=start, throttled=0, cut_at=0.0, updated_at=now
            )
            db.add(row)
        live = db.execute(
            select(
                ModelLimitDemand.worker, ModelLimitDemand.demand, ModelLimitDemand.ceiling
            ).where(
                ModelLimitDemand.key == key,
                ModelLimitDemand.seen_at >= now - timedelta(seconds=self.seen_s),
            )
        ).all()
        cap = float(max(1, sum(ceiling for _, _, ceiling in live)))
        if report.cut_sent is not None and report.cut_sent > row.cut_at:
            row.in_flight_limit = max(1.0, min(row.in_flight_limit, cap) * DECREASE)
            row.cut_at = time.time()
        elif report.grown:
            slow_start = row.throttled == 0 and report.throttled == 0
            step = report.grown if slow_start else report.grown / row.in_flight_limit
            row.in_flight_limit = min(cap, row.in_flight_limit + step)
        row.throttled += report.throttled
        row.updated_at = now
        demands = {worker: demand for worker, demand, _ in live}
        share = fair_share(row.in_flight_limit, demands, self.worker)
        return row.in_flight_limit, row.throttled, share
