"""Claims and leases on one database, as several worker processes see it (issue 14.2): each
run is claimed once however many workers ask at the same moment, the platform-wide limit
holds, a run whose worker is gone goes to another worker, and a worker that lost its lease
can no longer end the run. Every test runs on SQLite and on PostgreSQL."""

from __future__ import annotations

import sqlite3
import subprocess
import threading
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import select, update

from osmosis.platform.core.db import make_engine, make_session_factory, upgrade
from osmosis.platform.core.db.models import Workspace, utcnow
from osmosis.platform.core.db.process_models import PlatformProcess
from osmosis.platform.core.db.run_models import EvalRun
from osmosis.platform.core.settings import Settings
from osmosis.platform.worker import leases, processes

CLAIMERS = 8


@pytest.fixture
def world(tmp_path: Path, databases):
    """A migrated database with one workspace, and a way to add pending runs."""
    settings = databases.settings(tmp_path / "home", max_concurrent_runs=100, lease_s=30)
    assert settings.database_url is not None
    engine = make_engine(settings.database_url)
    upgrade(engine)
    sessions = make_session_factory(engine)
    with sessions() as db:
        workspace = Workspace(identity="example.com/team/repo")
        db.add(workspace)
        db.commit()
        workspace_id = workspace.id
    yield World(settings, sessions, workspace_id)
    engine.dispose()


class World:
    def __init__(self, settings: Settings, sessions, workspace_id: str) -> None:
        self.settings = settings
        self.sessions = sessions
        self.workspace_id = workspace_id
        self._count = 0

    def runs(self, count: int) -> list[str]:
        ids = []
        with self.sessions() as db:
            for _ in range(count):
                self._count += 1
                run = EvalRun(
                    name=f"run-{self._count}",
                    workspace_id=self.workspace_id,
                    status="pending",
                    created_at=utcnow() + timedelta(microseconds=self._count),
                    payload="{}",
                    config="{}",
                    config_toml="",
                    config_path="configs/eval/x.toml",
                    rollout="x",
                    entrypoint="main.py",
                    model_path="openai/fake",
                    dataset_name="d",
                    origin_url="/srv/git/repo",
                    commit_sha="0" * 40,
                )
                db.add(run)
                db.flush()
                ids.append(run.id)
            db.commit()
        return ids

    def worker(self, role: str = "worker") -> str:
        with self.sessions() as db:
            return processes.register(db, role=role, settings=self.settings)

    def claim(self, worker: str, room: int, **changes) -> list[leases.Claim]:
        settings = self.settings.replace(**changes) if changes else self.settings
        with self.sessions() as db:
            return leases.claim_runs(db, process_id=worker, settings=settings, room=room)

    def run(self, run_id: str) -> EvalRun:
        with self.sessions() as db:
            run = db.get(EvalRun, run_id)
            assert run is not None
            return run

    def expire(self, run_id: str) -> None:
        """As if its holder stopped renewing a while ago."""
        with self.sessions() as db:
            past = processes.db_now(db) - timedelta(seconds=1)
            db.execute(update(EvalRun).where(EvalRun.id == run_id).values(lease_expires_at=past))
            db.commit()


def test_many_workers_claiming_at_once_take_each_run_exactly_once(world):
    ids = world.runs(24)
    workers = [world.worker() for _ in range(CLAIMERS)]
    taken: dict[str, list[str]] = {w: [] for w in workers}
    start = threading.Barrier(CLAIMERS)

    def claimer(worker: str) -> None:
        start.wait()
        for _ in range(6):  # every worker keeps asking until the queue is empty
            taken[worker] += [claim.run_id for claim in world.claim(worker, room=2)]

    threads = [threading.Thread(target=claimer, args=(w,)) for w in workers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    claimed = [run_id for runs in taken.values() for run_id in runs]
    assert sorted(claimed) == sorted(ids)  # every run once, none twice
    assert sum(1 for runs in taken.values() if runs) > 1  # not one worker taking all
    for run_id in ids:
        run = world.run(run_id)
        assert (run.status, run.lease_epoch) == ("running", 1)
        assert run.claimed_by in [w for w, runs in taken.items() if run_id in runs]
        assert run.lease_expires_at is not None and run.lease_expires_at > utcnow()


def test_the_platform_wide_limit_holds_across_workers(world):
    world.runs(10)
    workers = [world.worker() for _ in range(4)]
    claims = []
    start = threading.Barrier(len(workers))

    def claimer(worker: str) -> None:
        start.wait()
        claims.extend(world.claim(worker, room=3, max_concurrent_runs=5))

    threads = [threading.Thread(target=claimer, args=(w,)) for w in workers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert len(claims) == 5
    with world.sessions() as db:
        statuses = sorted(db.scalars(select(EvalRun.status)))
    assert statuses == ["pending"] * 5 + ["running"] * 5
    # A run that ends frees its slot for the next claim.
    with world.sessions() as db:
        db.execute(update(EvalRun).where(EvalRun.id == claims[0].run_id).values(status="finished"))
        db.commit()
    assert len(world.claim(workers[0], room=3, max_concurrent_runs=5)) == 1


def test_a_run_whose_lease_ran_out_goes_to_another_worker_and_fences_the_first(world):
    (run_id,) = world.runs(1)
    first, second = world.worker(), world.worker()
    (claim,) = world.claim(first, room=1)
    assert world.claim(second, room=1) == []  # held: nothing to take
    world.expire(run_id)

    (taken,) = world.claim(second, room=1)
    assert (taken.run_id, taken.epoch, taken.resumed, taken.previous_holder) == (
        run_id,
        claim.epoch + 1,
        True,
        first,
    )
    with world.sessions() as db:
        state = leases.renew(db, process_id=first, held={run_id: claim.epoch}, lease_s=30)
        assert state.lost == {run_id}
        # Its writes name the old claim: they change nothing.
        ended = db.execute(
            update(EvalRun).where(*leases.holds(run_id, claim.epoch)).values(status="failed")
        )
        db.commit()
        assert ended.rowcount == 0
        assert not leases.release(db, process_id=first, run_id=run_id, epoch=claim.epoch)
        state = leases.renew(db, process_id=second, held={run_id: taken.epoch}, lease_s=30)
        assert not (state.lost or state.ended or state.stop_requested)
    run = world.run(run_id)
    assert (run.status, run.claimed_by, run.lease_epoch) == ("running", second, 2)


def test_the_runs_of_a_dead_process_on_this_machine_are_taken_at_once(world):
    (run_id,) = world.runs(1)
    dead = world.worker()
    (claim,) = world.claim(dead, room=1)
    gone = subprocess.Popen(["true"])
    gone.wait()
    with world.sessions() as db:  # the holder is a process that has exited
        db.execute(update(PlatformProcess).where(PlatformProcess.id == dead).values(pid=gone.pid))
        db.commit()
    # Its lease still has most of 30 s to run, yet the run is free.
    (taken,) = world.claim(world.worker(), room=1)
    assert (taken.run_id, taken.epoch, taken.resumed) == (run_id, claim.epoch + 1, True)


def test_a_released_run_is_resumable_at_once_and_a_stop_reaches_its_holder(world):
    first_run, second_run = world.runs(2)
    worker = world.worker()
    claims = {c.run_id: c for c in world.claim(worker, room=2)}
    with world.sessions() as db:
        assert leases.release(
            db, process_id=worker, run_id=first_run, epoch=claims[first_run].epoch
        )
        db.execute(update(EvalRun).where(EvalRun.id == second_run).values(stop_requested=True))
        db.commit()
        state = leases.renew(
            db,
            process_id=worker,
            held={second_run: claims[second_run].epoch},
            lease_s=30,
        )
    assert state.stop_requested == {second_run}
    (again,) = world.claim(world.worker(), room=2)
    assert (again.run_id, again.resumed, again.epoch) == (first_run, True, 2)


def test_a_stop_of_a_run_whose_worker_is_gone_ends_it_stopped(world):
    (run_id,) = world.runs(1)
    worker = world.worker()
    world.claim(worker, room=1)
    with world.sessions() as db:
        db.execute(update(EvalRun).where(EvalRun.id == run_id).values(stop_requested=True))
        db.commit()
    world.expire(run_id)
    assert world.claim(world.worker(), room=1) == []  # not started again
    run = world.run(run_id)
    assert (run.status, run.error, run.claimed_by) == ("stopped", "stopped on request", None)
    assert run.completed_at is not None


def test_live_processes_are_listed_and_a_stopped_one_is_not(world):
    api, worker = world.worker(role="api"), world.worker()
    with world.sessions() as db:
        processes.mark_stopped(db, process_id=api)
        now = processes.db_now(db)
        live = processes.live_processes(db, now=now, within_s=30)
    assert [(p.id, p.role) for p in live] == [(worker, "worker")]
    assert live[0].heartbeat_age_s < 30


@pytest.mark.databases("sqlite")  # PostgreSQL locks rows, not the database
def test_on_sqlite_a_round_with_nothing_to_claim_never_takes_the_write_lock(world):
    # SQLite's write lock is the database's: a worker frozen (SIGSTOP, a paused VM) while it
    # held it would stop every other writer. Idle rounds, most of them, must not take it.
    (running,) = world.runs(1)
    worker = world.worker()
    assert [c.run_id for c in world.claim(worker, room=1)] == [running]
    path = world.settings.database_url.removeprefix("sqlite:///")
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # another process, stopped mid-write
    try:
        outcome: list[list[leases.Claim]] = []
        idle = threading.Thread(target=lambda: outcome.append(world.claim(worker, room=1)))
        idle.start()
        idle.join(timeout=10)
        assert not idle.is_alive() and outcome == [[]]  # nothing waiting: no lock needed
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    (waiting,) = world.runs(1)
    assert [c.run_id for c in world.claim(worker, room=1)] == [waiting]
