"""Workers claim runs from the database and hold them by a lease.

    claims = claim_runs(db, process_id=me, settings=settings, room=2)   # [Claim(run_id, epoch)]
    state = renew(db, process_id=me, held={run_id: epoch}, lease_s=30)  # lost, stopped, ended
    release(db, process_id=me, run_id=run_id, epoch=epoch)              # leave it to any worker
    db.execute(update(EvalRun).where(*holds(run_id, epoch)).values(status="finished"))

A run is claimable when it is `pending`, or `running` with no live holder: none recorded (an
earlier server's, or released), its lease ran out, or its holder ran on this machine and its
process is gone. Orphaned running runs are claimed first, then pending ones oldest first,
except that a user's fair share of the slots comes before age (`OSMOSIS_RUNS_PER_USER`, N):
while a user holding fewer than N slots has a run waiting, the runs of users holding N or
more wait for it. Alone, a user may use every slot; nothing running is stopped to make room.
`why_pending` says which of these holds a pending run back. A claim sets `claimed_by`, the
lease's expiry (`OSMOSIS_LEASE_S` from now) and `lease_epoch + 1`; the worker renews it every
third of the lease. Every write that ends or changes a claimed run names the epoch it was
claimed with (`holds`), so a worker that lost its lease (frozen, cut off from the database)
cannot end a run another worker has taken since.

PostgreSQL: the candidates are selected `FOR UPDATE SKIP LOCKED` (a worker never waits on a
row another transaction holds), inside a transaction-scoped advisory lock so that two workers
counting the platform's running runs (`OSMOSIS_MAX_CONCURRENT_RUNS`) cannot both take the last
slot. SQLite has one writer at a time: a round first looks without the write lock (a worker
frozen while holding it would stop every writer), and only when there is something to claim
or stop starts a transaction with a write, so that it holds the lock before it reads again;
each claim is a conditional UPDATE.

Lease times are the database server's clock on PostgreSQL (`processes.db_now`), so machines
whose clocks differ agree on when a lease runs out.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, cast

from sqlalchemy import ColumnElement, CursorResult, and_, case, false, func, or_, select, update
from sqlalchemy.orm import Session

from osmosis.platform.core.db.process_models import PlatformProcess
from osmosis.platform.core.db.run_models import EvalRun
from osmosis.platform.core.disk import disk_space
from osmosis.platform.core.settings import Settings
from osmosis.platform.worker.processes import db_now, dead_here, live_processes

# pg_advisory_xact_lock key of the claim step ("osmo").
CLAIM_LOCK = 0x6F736D6F
# Claimable runs a claim looks at to order them by the users' shares (oldest first).
_CANDIDATES = 1000
# A run's worker exits with this when it could not take the run after all (another process
# still holds the run directory, or the claim is no longer its): not a failure of the run.
TEMPFAIL = 75


@dataclass(frozen=True)
class Claim:
    """A run this worker now holds, with the epoch of its claim."""

    run_id: str
    epoch: int
    resumed: bool  # the run was `running` already: its worker died or let it go
    previous_holder: str | None = None


@dataclass
class LeaseState:
    """What `renew` found for the runs a worker holds."""

    lost: set[str] = field(default_factory=set)  # another worker took it, or it vanished
    stop_requested: set[str] = field(default_factory=set)
    ended: set[str] = field(default_factory=set)  # its worker gave it a final status


def holds(run_id: str, epoch: int) -> tuple[ColumnElement[bool], ...]:
    """The WHERE clause of a write by the holder of `run_id`'s claim number `epoch`."""
    return (EvalRun.id == run_id, EvalRun.lease_epoch == epoch, EvalRun.status == "running")


def _orphaned(now: datetime, dead: list[str]) -> ColumnElement[bool]:
    return or_(
        EvalRun.claimed_by.is_(None),
        EvalRun.lease_expires_at.is_(None),
        EvalRun.lease_expires_at < now,
        EvalRun.claimed_by.in_(dead),
    )


def _claimable(now: datetime, dead: list[str]) -> ColumnElement[bool]:
    return or_(
        and_(EvalRun.status == "pending", EvalRun.stop_requested == false()),
        and_(
            EvalRun.status == "running",
            EvalRun.stop_requested == false(),
            _orphaned(now, dead),
        ),
    )


def claim_runs(
    db: Session,
    *,
    process_id: str,
    settings: Settings,
    room: int,
    exclude: Collection[str] = (),
) -> list[Claim]:
    """Claim up to `room` runs (fewer when the platform-wide limit is near), orphaned running
    runs first, then pending ones oldest first within the users' shares (`_fair_order`);
    never those in `exclude` (runs this worker just failed to start). Commits."""
    postgres = db.get_bind().dialect.name == "postgresql"
    if postgres:
        db.execute(select(func.pg_advisory_xact_lock(CLAIM_LOCK)))
    else:
        # SQLite's write lock is the whole database's: a worker stopped while it holds it (a
        # frozen process, a paused VM) stops every other writer until it goes on. Most rounds
        # have nothing to write, so they look first without it.
        now, dead = db_now(db), dead_here(db, exclude=process_id)
        orphan = db.scalar(select(EvalRun.id).where(_orphan_to_stop(now, dead)).limit(1))
        if orphan is None and not _choose(db, now, dead, settings, room=room, exclude=exclude):
            db.rollback()
            return []
        # A write first: SQLite then holds the write lock for all this transaction reads.
        db.execute(
            update(PlatformProcess)
            .where(PlatformProcess.id == process_id)
            .values(heartbeat_at=PlatformProcess.heartbeat_at)
        )
    now = db_now(db)
    dead = dead_here(db, exclude=process_id)
    _stop_orphans(db, now=now, dead=dead)
    chosen = _choose(db, now, dead, settings, room=room, exclude=exclude)
    if not chosen:
        db.commit()
        return []
    if postgres:
        # Never wait on a row another transaction holds (a stop, a progress update).
        free = set(
            db.scalars(
                select(EvalRun.id)
                .where(EvalRun.id.in_([c.run_id for c in chosen]))
                .with_for_update(skip_locked=True)
            )
        )
        chosen = [c for c in chosen if c.run_id in free]
    claims: list[Claim] = []
    expires = now + timedelta(seconds=settings.lease_s)
    for candidate in chosen:
        run_id = candidate.run_id
        result = db.execute(
            update(EvalRun)
            .where(EvalRun.id == run_id, _claimable(now, dead))
            .values(
                status="running",
                claimed_by=process_id,
                heartbeat_at=now,
                lease_expires_at=expires,
                lease_epoch=EvalRun.lease_epoch + 1,
            )
        )
        if cast(CursorResult[Any], result).rowcount != 1:
            continue  # taken or stopped since it was selected (SQLite: never; defensive)
        epoch = int(db.scalar(select(EvalRun.lease_epoch).where(EvalRun.id == run_id)) or 0)
        resumed = candidate.status == "running"
        claims.append(Claim(run_id, epoch, resumed=resumed, previous_holder=candidate.holder))
    db.commit()
    return claims


def _choose(
    db: Session,
    now: datetime,
    dead: list[str],
    settings: Settings,
    *,
    room: int,
    exclude: Collection[str],
) -> list[_Candidate]:
    """The runs to claim, in order: as many of the claimable ones as `room` and the
    platform-wide limit let in, ordered by `_fair_order`."""
    held = held_by_user(db, now=now, dead=dead)
    wanted = min(room, settings.max_concurrent_runs - sum(held.values()))
    if wanted <= 0:
        return []
    candidates = db.execute(
        select(EvalRun.id, EvalRun.status, EvalRun.claimed_by, EvalRun.created_by)
        .where(_claimable(now, dead), EvalRun.id.not_in(list(exclude)))
        .order_by(case((EvalRun.status == "running", 0), else_=1), EvalRun.created_at)
        .limit(max(wanted, _CANDIDATES))
    ).all()
    return _fair_order(
        [_Candidate(*row) for row in candidates], held, share=settings.runs_per_user
    )[:wanted]


@dataclass(frozen=True)
class _Candidate:
    run_id: str
    status: str
    holder: str | None
    user: str | None


def held_by_user(db: Session, *, now: datetime, dead: list[str]) -> dict[str | None, int]:
    """Run slots held now, by the user who submitted the runs (None: a deleted user)."""
    rows = db.execute(
        select(EvalRun.created_by, func.count())
        .where(EvalRun.status == "running", ~_orphaned(now, dead))
        .group_by(EvalRun.created_by)
    ).all()
    return {user: int(count) for user, count in rows}


def _fair_order(
    candidates: list[_Candidate], held: Mapping[str | None, int], *, share: int
) -> list[_Candidate]:
    """The order runs take free slots in: orphaned running runs first (they were started
    already), then pending ones oldest first, except that while a user holding fewer than
    `share` slots has a run waiting, the runs of users at or past their share wait for it.

    >>> a1, a2, b1 = (_Candidate(i, "pending", None, i[0]) for i in ("a1", "a2", "b1"))
    >>> [c.run_id for c in _fair_order([a1, a2, b1], {"a": 1}, share=1)]
    ['b1', 'a1', 'a2']
    """
    counts = dict(held)
    order = [c for c in candidates if c.status == "running"]
    for candidate in order:
        counts[candidate.user] = counts.get(candidate.user, 0) + 1
    waiting = [c for c in candidates if c.status != "running"]
    while waiting:
        pick = next((c for c in waiting if counts.get(c.user, 0) < share), waiting[0])
        waiting.remove(pick)
        order.append(pick)
        counts[pick.user] = counts.get(pick.user, 0) + 1
    return order


def why_pending(db: Session, *, run: EvalRun, settings: Settings) -> str | None:
    """Why a pending run has not started, in one line (None when it is not pending): every
    slot is held (by its user's other runs, by other users'), its user is at their share
    while others wait, no worker process is running, or the home's disk is too full (no
    run starts until space is freed: the scheduler checks the same floor)."""
    if run.status != "pending" or run.stop_requested:
        return None
    space = disk_space(settings.home, min_free_bytes=settings.min_free_disk_bytes)
    if space.low:
        return (
            f"waiting for disk space: {space.describe(settings.home)}; it starts once space "
            "is freed"
        )
    now = db_now(db)
    dead = dead_here(db)
    held = held_by_user(db, now=now, dead=dead)
    slots, share = settings.max_concurrent_runs, settings.runs_per_user
    total, mine = sum(held.values()), held.get(run.created_by, 0)
    plural = "s" if slots != 1 else ""
    if total >= slots:
        if mine == total:
            whose = "by your other runs"
        elif mine == 0:
            whose = "by other users' runs"
        else:
            whose = f"{mine} by your other runs, {total - mine} by other users' runs"
        return (
            f"{total} of {slots} run slot{plural} held {whose} (OSMOSIS_MAX_CONCURRENT_RUNS); "
            "it starts when one is free"
        )
    if mine >= share:
        others = db.scalars(
            select(EvalRun.created_by).where(
                EvalRun.status == "pending",
                EvalRun.stop_requested == false(),
                EvalRun.id != run.id,
                EvalRun.created_by.is_distinct_from(run.created_by),
            )
        ).all()
        if any(held.get(user, 0) < share for user in others):
            return (
                f"your other runs hold {mine} run slot{'s' if mine != 1 else ''}, your share "
                f"while other users' runs wait (OSMOSIS_RUNS_PER_USER={share})"
            )
    workers = [
        p
        for p in live_processes(db, now=now, within_s=settings.lease_s)
        if p.role in ("all", "worker")
    ]
    if not workers:
        return "no worker process is running to start it (osmosis server start --role worker)"
    return "a run slot is free: a worker starts it at its next round"


def _orphan_to_stop(now: datetime, dead: list[str]) -> ColumnElement[bool]:
    return and_(EvalRun.status == "running", EvalRun.stop_requested, _orphaned(now, dead))


def _stop_orphans(db: Session, *, now: datetime, dead: list[str]) -> None:
    """A run asked to stop whose worker is gone is stopped here: there is nobody to tell."""
    db.execute(
        update(EvalRun)
        .where(_orphan_to_stop(now, dead))
        .values(
            status="stopped",
            error="stopped on request",
            completed_at=now,
            secrets_ciphertext=None,
            claimed_by=None,
            lease_expires_at=None,
            worker_pid=None,
        )
    )


def renew(
    db: Session, *, process_id: str, held: Mapping[str, int], lease_s: float, extend: bool = True
) -> LeaseState:
    """Extend the leases of the runs in `held` (run id -> epoch) when `extend`, and say which
    were lost, asked to stop, or ended by their worker. Commits."""
    state = LeaseState()
    if not held:
        return state
    now = db_now(db)
    if extend:
        expires = now + timedelta(seconds=lease_s)
        for run_id, epoch in held.items():
            db.execute(
                update(EvalRun)
                .where(*holds(run_id, epoch), EvalRun.claimed_by == process_id)
                .values(heartbeat_at=now, lease_expires_at=expires)
            )
    rows = db.execute(
        select(
            EvalRun.id,
            EvalRun.status,
            EvalRun.claimed_by,
            EvalRun.lease_epoch,
            EvalRun.stop_requested,
        ).where(EvalRun.id.in_(list(held)))
    ).all()
    db.commit()
    found = {row[0]: row[1:] for row in rows}
    for run_id, epoch in held.items():
        if run_id not in found:
            state.lost.add(run_id)  # deleted (its workspace was removed)
            continue
        status, holder, current, stop = found[run_id]
        if current != epoch or (status == "running" and holder != process_id):
            state.lost.add(run_id)
        elif status != "running":
            state.ended.add(run_id)
        elif stop:
            state.stop_requested.add(run_id)
    return state


def release(db: Session, *, process_id: str, run_id: str, epoch: int) -> bool:
    """Give the run back (it stays `running`, resumable at once by any worker). Commits."""
    result = db.execute(
        update(EvalRun)
        .where(*holds(run_id, epoch), EvalRun.claimed_by == process_id)
        .values(claimed_by=None, lease_expires_at=None, heartbeat_at=None, worker_pid=None)
    )
    db.commit()
    return bool(cast(CursorResult[Any], result).rowcount)


@dataclass(frozen=True)
class HeldRun:
    """A run and the process holding it, for `server status`."""

    id: str
    name: str
    claimed_by: str
    lease_epoch: int
    lease_expires_in_s: float | None


def held_runs(db: Session, *, now: datetime) -> list[HeldRun]:
    """Every `running` run with a holder, soonest-expiring lease first."""
    rows = db.execute(
        select(
            EvalRun.id,
            EvalRun.name,
            EvalRun.claimed_by,
            EvalRun.lease_epoch,
            EvalRun.lease_expires_at,
        )
        .where(EvalRun.status == "running", EvalRun.claimed_by.is_not(None))
        .order_by(EvalRun.lease_expires_at)
    ).all()
    return [
        HeldRun(
            id=run_id,
            name=name,
            claimed_by=str(holder),
            lease_epoch=int(epoch),
            lease_expires_in_s=(
                round((expires - now).total_seconds(), 1) if expires is not None else None
            ),
        )
        for run_id, name, holder, epoch, expires in rows
    ]
