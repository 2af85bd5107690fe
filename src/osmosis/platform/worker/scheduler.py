"""The worker side of a platform process: claim runs from the database, one worker process per
claimed run, hold each run's lease while its worker runs, and end what a worker left.

    scheduler = Scheduler(sessions, settings)
    await scheduler.start()      # in the app's lifespan, or `server start --role worker`
    scheduler.wake()             # a run was submitted, retried or asked to stop
    await scheduler.close()      # shutdown: its runs go back to the queue, resumable at once

Every process registers in `platform_processes` and heartbeats (`osmosis server status` lists
them). Roles `all` and `worker` also execute runs: each round claims what the platform-wide
limit (`OSMOSIS_MAX_CONCURRENT_RUNS`, counted in the database) and this process's own
(`OSMOSIS_WORKER_MAX_RUNS`) leave room for (`osmosis.platform.worker.leases`), orphaned runs first,
then pending ones by each user's share (`OSMOSIS_RUNS_PER_USER`):
a run whose worker died — on another machine once its lease ran out, on this one at once —
is resumed from its journal in the blob store, so every attempt is recorded once. A role `api`
process claims nothing; its stop and submit routes only write the database, which the
workers read each round (stop: SIGTERM to the run's worker, which ends it `stopped`). Rounds
come every half second; on PostgreSQL a stop request and a new run are also announced by
`NOTIFY` (`osmosis.platform.core.notify`), which starts the round of the process holding the
run, or of every idle worker, at once.

Leases are renewed every third of `OSMOSIS_LEASE_S`. A worker whose lease was taken (this
process was frozen, or cut off from the database for most of a lease) is SIGKILLed at once,
before another worker's resume can be disturbed, and its run is left to its new holder. A
worker that exits without giving its run a final status fails the run with a log line that
says so; when even that cannot be written (a full disk: the database refuses), the run stays
held and is tried again later, backing off up to a minute. A round whose claim the database
refuses backs off the same way. A worker that dies leaves its run's sandbox outbox behind: it is
removed before the run is settled or resumed. A worker killed by a signal (SIGKILL, the OOM
killer) is not the run's fault: the run is given back and resumed from its journal, up to
`OSMOSIS_RUN_CRASH_RESUMES` times; the next such death fails it, naming the signal.

Once at start and then hourly, the git mirrors of workspaces that no longer exist are removed
from the home (`osmosis.platform.worker.checkout.remove_stale_mirrors`), and so are the
checkouts a worker killed at its run's end had set aside (`remove_set_aside`).

While the home's disk has less than `settings.min_free_disk_bytes` free, nothing is claimed:
the runs next in line wait, with a log line saying why, and start once space is freed.

A warm spare: roles that execute runs keep one worker process started ahead
(`run_worker --warm`), its engine imported, waiting on its stdin; a claim hands the run to it
(`<run_id> <epoch>`, after which it takes the run's worker log as its output and its command
line names the run), so a run does not wait for a Python start and the engine's imports.
The next spare starts once the run it took has ended (the worker says so on a pipe,
`ENDED_FD_ENV`, once the run's status is written; its exit says so too), at most
`SPARE_HOLD_MAX_SEC` after the hand-off: its imports (~1 s of CPU) would otherwise compete
with that run's start and attempts (issue 30: a 500-row run dispatches in about a second).
A spare that ends is replaced (backing off up to a minute), never handed a run; `close`
kills it.
`OSMOSIS_WORKER_WARM=off` starts every worker for its run instead. A spare is told the last
run handed out (`SPARE_OF_ENV`), whose sandboxed rollout server it starts ahead
(`run_worker._start_spare`); what a killed one left is removed on close and at each sweep.

Workers lead their own process group and, on Linux, are SIGKILLed by the kernel when this
process dies (`PR_SET_PDEATHSIG`); each worker does the same for its rollout server, so a
SIGKILL leaves nothing behind. They run with umask 077: what they write is owner-only.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from sqlalchemy import Engine, select
from sqlalchemy.orm import Session, sessionmaker

from osmosis.eval.sites.sandbox.disk import remove_stale
from osmosis.eval.sites.sandbox.limits import sweep_groups

# The rollout process's parent-death hook serves the worker just as well.
from osmosis.eval.sites.spawn import die_with_parent_hook
from osmosis.platform.core import notify
from osmosis.platform.core.crypto import KEY_ENV
from osmosis.platform.core.db.models import Workspace, utcnow
from osmosis.platform.core.db.run_models import EvalRun
from osmosis.platform.core.disk import DiskSpace, disk_space
from osmosis.platform.core.schema_revision import schema_problem
from osmosis.platform.core.settings import Settings
from osmosis.platform.services.run_files import append_log
from osmosis.platform.services.runs import run_dir, runs_root
from osmosis.platform.worker import leases, processes
from osmosis.platform.worker.checkout import (
    remove_dead_spares,
    remove_set_aside,
    remove_stale_mirrors,
)

if TYPE_CHECKING:
    from osmosis.platform.worker.metrics import MetricsServer
from osmosis.private_file import PRIVATE_UMASK, make_private_dir, open_private_append

logger = logging.getLogger("osmosis.platform.worker.scheduler")

POLL_SEC = 0.5
SHUTDOWN_GRACE_SEC = 8.0
# How long `close` waits for a query of the round it cancelled (asyncio cannot stop its thread).
QUERY_WAIT_SEC = 5.0
BACKOFF_FIRST_SEC = 1.0
BACKOFF_MAX_SEC = 60.0
# A lease not renewed for this share of its length may already be another worker's.
SELF_FENCE_SHARE = 0.8
MIRROR_SWEEP_SEC = 3600.0
# The longest the next spare waits for the run handed to the last one to end (a long run, or
# one that builds its environment first, would otherwise leave the platform without a spare).
SPARE_HOLD_MAX_SEC = 5.0
# A spare's end of the pipe it writes to once its run has ended (`run_worker`).
ENDED_FD_ENV = "_OSMOSIS_RUN_ENDED_FD"
# The run a spare mirrors: the last one handed to a worker, whose server it starts ahead.
SPARE_OF_ENV = "_OSMOSIS_SPARE_OF"
_WORKER_MODULE = "osmosis.platform.worker.run_worker"
# Room in a spare's argv for `<run_id> <epoch>`, which it writes there once it takes a run
# (`run_worker._retitle`): `ps` and /proc then name the run, as for a worker started for it.
_TITLE_ROOM = " " * 96
_TAIL_BYTES = 4096
_TRIALS = "rollout_trials"  # a run directory's trials root (`osmosis.eval.host.run`)
T = TypeVar("T")


@dataclass
class _Held:
    """A run this process holds: its claim's epoch, its worker while it runs, and when its
    lease was last renewed (monotonic)."""

    epoch: int
    renewed: float
    worker: subprocess.Popen[bytes] | None = None
    stop_sent: bool = False
    fenced: bool = False  # its worker was killed because the lease is (maybe) lost
    exit_code: int | None = None  # its worker's end, while it waits to be recorded
    due: float = 0.0  # when to try recording it again
    delay: float = 0.0


@dataclass
class _Backoff:
    due: float = 0.0
    delay: float = 0.0

    def fail(self, now: float) -> float:
        self.delay = BACKOFF_FIRST_SEC if not self.delay else min(self.delay * 2, BACKOFF_MAX_SEC)
        self.due = now + self.delay
        return self.delay

    def succeed(self) -> None:
        self.due = self.delay = 0.0


class Scheduler:
    """Registers this process and, in roles `all` and `worker`, claims and executes runs."""

    def __init__(self, sessions: sessionmaker[Session], settings: Settings) -> None:
        self._sessions = sessions
        self._settings = settings
        self.executes = settings.role in ("all", "worker")
        self.process_id: str | None = None
        self._held: dict[str, _Held] = {}
        # Runs this process leaves to others for a while: their worker could not start, or
        # could not take the run (another process still holds its directory).
        self._not_now: dict[str, _Backoff] = {}
        self._claim_backoff = _Backoff()
        self._heartbeat_due = 0.0
        self._mirrors_due = 0.0
        self._schema_problem: str | None = None
        self._low_disk = False
        self._told_low_disk: set[str] = set()  # runs whose log says they wait for space
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        # The threads of `_db` still running, and what to do with the result of one whose
        # round was cancelled (`close` waits for them, then undoes what they did).
        self._calls: set[asyncio.Future[Any]] = set()
        self._late: list[tuple[asyncio.Future[Any], Callable[[Any], None]]] = []
        self._listener: notify.Listener | None = None
        self._metrics: MetricsServer | None = None  # OSMOSIS_METRICS_PORT
        self.warm = self.executes and settings.worker_warm
        self.spare: subprocess.Popen[bytes] | None = None  # the next claim's worker, started
        self._spare_says: int | None = None  # our end of the spare's run-ended pipe
        # The run-ended pipe of the worker the last spare became, and until when the next
        # spare waits for it (monotonic).
        self._hold: tuple[int, float] | None = None
        self._spare_backoff = _Backoff()
        self._last_run: str | None = None  # the run the next spare's server mirrors

    @property
    def _renew_every(self) -> float:
        return self._settings.lease_s / 3

    # -- control ----------------------------------------------------------------------------
    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        if self.executes and self._settings.metrics_port is not None:
            from osmosis.platform.worker.metrics import MetricsServer

            self._metrics = MetricsServer.start(self._settings, held=lambda: len(self._held))
        self._task = asyncio.create_task(self._run(), name="osmosis-scheduler")
        engine = self._sessions.kw.get("bind")
        if self.executes and isinstance(engine, Engine) and notify.is_postgres(engine):
            self._listener = notify.Listener(engine, on_notify=self._notified)
            self._listener.start()

    def _notified(self, kind: str, run_id: str) -> None:
        """A NOTIFY (listener thread): a run was submitted or retried, or a run this process
        holds was asked to stop; or the listener (re)connected and may have missed some."""
        if kind != notify.STOP or run_id in self._held:
            self.wake()

    def wake(self) -> None:
        """Look at the queue now rather than at the next poll (callable from any thread)."""
        loop, event = self._loop, self._wake
        if loop is not None and event is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(event.set)

    def stop_worker(self, run_id: str) -> None:
        """A stop was requested (`stop_requested` is in the database): the process holding
        the run, this one or another, SIGTERMs its worker at its next round."""
        self.wake()

    def running(self) -> list[str]:
        return [
            run_id
            for run_id, held in self._held.items()
            if held.worker is not None and held.worker.poll() is None
        ]

    async def close(self) -> None:
        """Stop scheduling and end every worker as a crash would: SIGKILL, then give their
        runs back (still `running`), so any worker resumes them at once from their journals.

        Not SIGTERM, which a worker takes for `eval stop`: a server shutdown is not a user's
        decision to end the run. A kill leaves every unfinished attempt pending in the journal,
        which is what the resume picks up.

        First the queries of the round it cancels end (their threads cannot be stopped; at
        most `QUERY_WAIT_SEC`): none runs once `close` returns, and a registration or a
        claim that ended late is given back with the rest.
        """
        if self._listener is not None:
            await asyncio.to_thread(self._listener.close)
            self._listener = None
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        await self._end_calls()
        workers = [held.worker for held in self._held.values() if held.worker is not None]
        if self.spare is not None:
            workers.append(self.spare)
            _close_stdin(self.spare)
            self.spare = None
        self._end_hold()
        self._forget_spare_pipe()
        for worker in workers:
            if worker.poll() is None:
                # The group: the worker and anything it started that shares it (uv, say).
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(worker.pid, signal.SIGKILL)
        with contextlib.suppress(TimeoutError):
            waits = (asyncio.to_thread(worker.wait) for worker in workers)
            await asyncio.wait_for(asyncio.gather(*waits), SHUTDOWN_GRACE_SEC)
        if self.warm:  # the killed spare's checkout, server directory and cgroup
            await asyncio.to_thread(
                remove_dead_spares, self._settings.home, runs_root(self._settings)
            )
            await asyncio.to_thread(sweep_groups)
        held, self._held = self._held, {}
        with contextlib.suppress(Exception):  # a dead database: the leases run out instead
            await asyncio.wait_for(asyncio.to_thread(self._give_back, held), SHUTDOWN_GRACE_SEC)
        if self._metrics is not None:
            await asyncio.to_thread(self._metrics.close)
            self._metrics = None

    async def _end_calls(self) -> None:
        """Wait (at most `QUERY_WAIT_SEC`) for the queries of the cancelled round, whose
        threads go on: none must touch the database after `close`, and a registration or a
        claim that ends late must be given back with the rest (or it lingers until its lease
        runs out, listed as live by `server status`)."""
        calls = set(self._calls)
        if calls:
            _, running = await asyncio.wait(calls, timeout=QUERY_WAIT_SEC)
            if running:
                logger.warning(
                    "%d queries of the run scheduler still run after %.0f s; stopping without "
                    "them (what they record is left to its lease)",
                    len(running),
                    QUERY_WAIT_SEC,
                )
        late, self._late = self._late, []
        for call, take in late:
            if call.done() and not call.cancelled() and call.exception() is None:
                take(call.result())
        for call in calls:  # retrieved, or asyncio logs "exception was never retrieved"
            if call.done() and not call.cancelled():
                call.exception()

    def _give_back(self, held: dict[str, _Held]) -> None:
        if self.process_id is None:
            return
        with self._sessions() as db:
            for run_id, run in held.items():
                leases.release(db, process_id=self.process_id, run_id=run_id, epoch=run.epoch)
            processes.mark_stopped(db, process_id=self.process_id)

    # -- the loop ---------------------------------------------------------------------------
    async def _run(self) -> None:
        assert self._wake is not None
        while True:
            try:
                await self._round()
            except Exception:  # a bad moment of the database must not end scheduling
                logger.exception("the run scheduler failed a round; retrying")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), POLL_SEC)
            self._wake.clear()

    async def _round(self) -> None:
        now = time.monotonic()
        beat = False
        if self.process_id is None:
            self.process_id = await self._db(self._register, late=self._registered_late)
            self._heartbeat_due = now + self._renew_every
        elif now >= self._heartbeat_due:
            beat = True
            self._heartbeat_due = now + self._renew_every
            try:
                await self._db(self._heartbeat)
            except Exception as error:  # the leases below say what it costs
                logger.warning("cannot record this process's heartbeat: %s", _brief(error))
        if not self.executes:
            return
        self._reap()
        await self._settle_ended(now)
        await self._watch_leases(now, extend=beat)
        await self._claim(now)
        self._keep_spare(now)
        if now >= self._mirrors_due:
            self._mirrors_due = now + MIRROR_SWEEP_SEC
            try:
                await self._db(self._sweep_mirrors)
            except Exception as error:  # the next sweep tries again
                logger.warning("cannot remove stale git mirrors: %s", _brief(error))

    async def _db(self, work: Callable[[], T], *, late: Callable[[T], None] | None = None) -> T:
        """`work()` in a thread; `late(result)`: what `close` does with a result that came
        after the round was cancelled."""
        # Off the event loop: an API process's requests never wait on the scheduler's queries.
        # Shielded, so the thread's end stays known to `close` when the round is cancelled.
        call = asyncio.ensure_future(asyncio.to_thread(work))
        self._calls.add(call)
        call.add_done_callback(self._calls.discard)
        try:
            return await asyncio.shield(call)
        except asyncio.CancelledError:
            if late is not None:
                self._late.append((call, late))
            raise

    def _registered_late(self, process_id: str) -> None:
        self.process_id = process_id  # so that `close` marks it stopped

    def _claimed_late(self, claims: list[leases.Claim]) -> None:
        for claim in claims:  # no worker: `close` gives them back to the queue
            self._held[claim.run_id] = _Held(epoch=claim.epoch, renewed=time.monotonic())

    def _register(self) -> str:
        limit = self._settings.worker_max_runs or None
        with self._sessions() as db:
            return processes.register(
                db, role=self._settings.role, settings=self._settings, max_runs=limit
            )

    def _sweep_mirrors(self) -> int:
        """Remove the git mirrors of deleted workspaces from this machine's home."""

        def workspace_ids() -> set[str]:
            with self._sessions() as db:
                return set(db.scalars(select(Workspace.id)))

        removed = remove_stale_mirrors(self._settings.home, workspace_ids=workspace_ids)
        if removed:
            logger.info("removed the git mirrors of %d deleted workspaces", removed)
        # Checkouts a killed worker had set aside but not yet deleted (`run_worker._finish`),
        # and a killed spare's checkout and server directory.
        remove_set_aside(self._settings.home)
        remove_dead_spares(self._settings.home, runs_root(self._settings))
        return removed

    def _heartbeat(self) -> None:
        assert self.process_id is not None
        with self._sessions() as db:
            processes.heartbeat(db, process_id=self.process_id)
        if self.executes:
            bind = self._sessions.kw["bind"]
            problem = schema_problem(bind)
            if problem != self._schema_problem and problem is not None:
                logger.error("%s: no new run is claimed", problem)
            self._schema_problem = problem

    # -- leases -----------------------------------------------------------------------------
    async def _watch_leases(self, now: float, *, extend: bool) -> None:
        """Renew (when due), and act on what the database says of the runs held."""
        assert self.process_id is not None
        held = {run_id: run.epoch for run_id, run in self._held.items()}
        if not held:
            return
        try:
            state = await self._db(lambda: self._renew(held, extend=extend))
        except Exception as error:
            logger.warning("cannot renew the leases of %d runs: %s", len(held), _brief(error))
            self._fence_stale(now)
            return
        for run_id in held:
            run = self._held.get(run_id)
            if run is None:
                continue
            if extend and run_id not in state.lost:
                run.renewed = now
            if run_id in state.lost:
                self._fence(run_id, run, "another worker holds its lease now")
            elif run_id in state.stop_requested and not run.stop_sent:
                run.stop_sent = True
                if run.worker is not None and run.worker.poll() is None:
                    # Said in our log: which side of a lost stop dropped it (see run_worker).
                    logger.info(
                        "eval run %s: stop requested, SIGTERM to its worker %s",
                        run_id,
                        run.worker.pid,
                    )
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(run.worker.pid, signal.SIGTERM)
        self._fence_stale(now)

    def _renew(self, held: dict[str, int], *, extend: bool) -> leases.LeaseState:
        assert self.process_id is not None
        with self._sessions() as db:
            return leases.renew(
                db,
                process_id=self.process_id,
                held=held,
                lease_s=self._settings.lease_s,
                extend=extend,
            )

    def _fence_stale(self, now: float) -> None:
        limit = self._settings.lease_s * SELF_FENCE_SHARE
        for run_id, run in list(self._held.items()):
            if now - run.renewed > limit and not run.fenced:
                self._fence(run_id, run, f"its lease could not be renewed for {limit:.0f} s")

    def _fence(self, run_id: str, run: _Held, why: str) -> None:
        """Kill the run's worker: the run may be another worker's now."""
        run.fenced = True
        if run.worker is not None and run.worker.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(run.worker.pid, signal.SIGKILL)
            logger.warning("killed the worker of eval run %s: %s", run_id, why)
        if run.worker is None or run.worker.poll() is not None:
            self._held.pop(run_id, None)

    # -- claiming ---------------------------------------------------------------------------
    async def _claim(self, now: float) -> None:
        if now < self._claim_backoff.due or self._schema_problem is not None:
            return
        local = self._settings.worker_max_runs or self._settings.max_concurrent_runs
        room = local - len(self._held)
        if room <= 0:
            return
        try:
            if await self._db(lambda: self._disk_is_low(room)):
                return
            excluded = {run_id for run_id, wait in self._not_now.items() if wait.due > now}
            claims = await self._db(
                lambda: self._claim_runs(room, excluded), late=self._claimed_late
            )
        except Exception as error:
            delay = self._claim_backoff.fail(now)
            logger.warning(
                "cannot claim eval runs (%s); trying again in %.0f s", _brief(error), delay
            )
            return
        self._claim_backoff.succeed()
        for claim in claims:
            self._held[claim.run_id] = _Held(epoch=claim.epoch, renewed=now)
            try:
                self._spawn(claim)
            except OSError as error:  # no log file, no fork: leave the run to a later round
                logger.warning("cannot start a worker for eval run %s: %s", claim.run_id, error)
                self._not_now.setdefault(claim.run_id, _Backoff()).fail(now)
                del self._held[claim.run_id]
                with contextlib.suppress(Exception):
                    await self._db(lambda: self._release(claim.run_id, claim.epoch))  # noqa: B023

    def _claim_runs(self, room: int, excluded: set[str]) -> list[leases.Claim]:
        assert self.process_id is not None
        with self._sessions() as db:
            claims = leases.claim_runs(
                db,
                process_id=self.process_id,
                settings=self._settings,
                room=room,
                exclude=excluded,
            )
        for claim in claims:
            self._log_claim(claim)
        return claims

    def _log_claim(self, claim: leases.Claim) -> None:
        how = (
            f"resumed by a worker on {processes.node().split('/')[0]} "
            f"(claim {claim.epoch}; the run's previous worker is gone)"
            if claim.resumed
            else f"claimed by a worker on {processes.node().split('/')[0]} (claim {claim.epoch})"
        )
        with contextlib.suppress(OSError):  # the disk may be too full even for this
            append_log(run_dir(self._settings, claim.run_id), f"{how}, process {os.getpid()}")

    def _release(self, run_id: str, epoch: int) -> None:
        assert self.process_id is not None
        with self._sessions() as db:
            leases.release(db, process_id=self.process_id, run_id=run_id, epoch=epoch)

    def _space(self) -> DiskSpace:
        return disk_space(self._settings.home, min_free_bytes=self._settings.min_free_disk_bytes)

    def _disk_is_low(self, room: int) -> bool:
        """Whether to claim nothing now; says so once in this process's log and in the log of
        each run next in line."""
        space = self._space()
        home = self._settings.home
        if not space.low:
            if self._low_disk:
                logger.info("%s again: starting runs", space.describe(home))
            self._low_disk = False
            self._told_low_disk.clear()
            return False
        if not self._low_disk:
            logger.warning("%s: no run starts until space is freed", space.describe(home))
        self._low_disk = True
        with self._sessions() as db:
            next_runs = list(
                db.scalars(
                    select(EvalRun.id)
                    .where(EvalRun.status == "pending")
                    .order_by(EvalRun.created_at)
                    .limit(room)
                )
            )
        for run_id in next_runs:
            if run_id in self._told_low_disk:
                continue
            self._told_low_disk.add(run_id)
            with contextlib.suppress(OSError):  # the disk may be too full even for this
                append_log(
                    run_dir(self._settings, run_id),
                    f"waiting for disk space: {space.describe(home)}; the run starts once "
                    "space is freed",
                    level="warning",
                )
        return True

    def _spawn(self, claim: leases.Claim) -> None:
        self._last_run = claim.run_id
        log_path = self._worker_log(claim.run_id)
        make_private_dir(log_path.parent)
        worker = self._hand_to_spare(claim)
        if worker is not None:
            self._held[claim.run_id].worker = worker
            logger.info("eval run %s went to warm worker %s", claim.run_id, worker.pid)
            return
        worker = self._start_worker([claim.run_id, str(claim.epoch)], log_path)
        self._held[claim.run_id].worker = worker
        logger.info("started worker %s for eval run %s", worker.pid, claim.run_id)

    def _start_worker(
        self, args: list[str], log_path: Path, *, says: int | None = None
    ) -> subprocess.Popen[bytes]:
        """A worker process; `says`: the write end of a spare's run-ended pipe."""
        # Spawned on the event loop's thread: the parent-death signal follows the thread
        # that forked, and this one lives as long as the process.
        spare = args[0] == "--warm"
        env = self._worker_env()
        if says is not None:
            env[ENDED_FD_ENV] = str(says)
        if spare and self._last_run is not None and self._settings.spare_server:
            env[SPARE_OF_ENV] = self._last_run
        with open(open_private_append(log_path), "ab") as output:
            return subprocess.Popen(
                [sys.executable, "-m", _WORKER_MODULE, *args],
                env=env,
                stdin=subprocess.PIPE if spare else subprocess.DEVNULL,
                stdout=output,
                stderr=subprocess.STDOUT,
                pass_fds=() if says is None else (says,),
                start_new_session=True,
                preexec_fn=die_with_parent_hook(),
                # Owner-only files for the worker and all it starts (git, uv, the rollout),
                # whatever umask the server was started with.
                umask=PRIVATE_UMASK,
            )

    def _hand_to_spare(self, claim: leases.Claim) -> subprocess.Popen[bytes] | None:
        """The spare, now running `claim`'s run; None when there is no live spare to take it."""
        spare, self.spare = self.spare, None
        says, self._spare_says = self._spare_says, None
        if spare is None or spare.poll() is not None or spare.stdin is None:
            if says is not None:
                os.close(says)
            return None
        try:
            spare.stdin.write(f"{claim.run_id} {claim.epoch}\n".encode())
            spare.stdin.close()
        except OSError:  # it died meanwhile: a worker of its own for the run
            _close_stdin(spare)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(spare.pid, signal.SIGKILL)
            if says is not None:
                os.close(says)
            return None
        self._spare_backoff.succeed()
        if says is not None:
            self._hold_spare(says)
        return spare

    def _hold_spare(self, says: int) -> None:
        """Start no spare until the run of the worker behind `says` has ended, or the
        worker has (the pipe is readable either way), or `SPARE_HOLD_MAX_SEC` passed."""
        self._end_hold()
        self._hold = (says, time.monotonic() + SPARE_HOLD_MAX_SEC)
        assert self._loop is not None
        self._loop.add_reader(says, self._run_ended)

    def _run_ended(self) -> None:
        """The run handed to the last spare has ended (or its worker has): start the
        next spare now rather than at the next round."""
        self._end_hold()
        self.wake()

    def _end_hold(self) -> None:
        if self._hold is None:
            return
        says, self._hold = self._hold[0], None
        if self._loop is not None and not self._loop.is_closed():
            self._loop.remove_reader(says)
        os.close(says)

    def _forget_spare_pipe(self) -> None:
        if self._spare_says is not None:
            os.close(self._spare_says)
            self._spare_says = None

    def _keep_spare(self, now: float) -> None:
        """Start a spare when there is none; replace one that ended (it never got a run)."""
        if not self.warm:
            return
        if self._hold is not None:
            if now < self._hold[1]:
                return
            self._end_hold()
        if self.spare is not None:
            code = self.spare.poll()
            if code is None:
                return
            how = f"killed by {_signal_name(-code)}" if code < 0 else f"exit code {code}"
            delay = self._spare_backoff.fail(now)
            logger.warning(
                "the warm spare worker %s ended (%s; its output is in %s); starting another "
                "in %.0f s",
                self.spare.pid,
                how,
                self._spare_log(),
                delay,
            )
            _close_stdin(self.spare)
            self.spare = None
            self._forget_spare_pipe()
        if now < self._spare_backoff.due:
            return
        log_path = self._spare_log()
        try:
            make_private_dir(log_path.parent)
            says, tells = os.pipe()  # tells: the spare's end, closed here once it is started
            try:
                self.spare = self._start_worker(["--warm", _TITLE_ROOM], log_path, says=tells)
            except BaseException:
                os.close(says)
                raise
            finally:
                os.close(tells)
            os.set_blocking(says, False)
            self._spare_says = says
        except OSError as error:
            delay = self._spare_backoff.fail(now)
            logger.warning("cannot start a warm spare worker (%s); trying in %.0f s", error, delay)
            return
        logger.info("started warm spare worker %s", self.spare.pid)

    def _spare_log(self) -> Path:
        """Where a spare writes until it takes a run (what it says only if it fails)."""
        return self._settings.home / "logs" / "workers" / "spare.log"

    def _worker_env(self) -> dict[str, str]:
        settings = self._settings
        assert settings.database_url is not None
        env = dict(os.environ)
        env.update(OSMOSIS_HOME=str(settings.home), OSMOSIS_DATABASE_URL=settings.database_url)
        if settings.blob_root is not None:
            env["OSMOSIS_BLOB_DIR"] = str(settings.blob_root)
            env["OSMOSIS_BLOB_SHARED"] = "1" if settings.blob_shared else "0"
        if settings.secret_key:
            env[KEY_ENV] = settings.secret_key
        env.pop("PROMETHEUS_MULTIPROC_DIR", None)  # the run worker counts only into ours
        if self._metrics is not None:
            env.update(self._metrics.child_env())
        return env

    def _worker_log(self, run_id: str) -> Path:
        return worker_log_path(self._settings.home, run_id)

    # -- what workers leave ---------------------------------------------------------------
    def _reap(self) -> None:
        for run_id, run in list(self._held.items()):
            if run.worker is None or run.exit_code is not None:
                continue
            code = run.worker.poll()
            if code is None:
                continue
            if run.fenced:
                del self._held[run_id]  # the run is (maybe) another worker's: leave it
                continue
            if code < 0:
                # Killed outright: what it started in its group (uv, say) goes with it,
                # before a resume starts the run again.
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(run.worker.pid, signal.SIGKILL)
            run.exit_code, run.due = code, 0.0

    async def _settle_ended(self, now: float) -> None:
        for run_id, run in list(self._held.items()):
            if run.exit_code is None or run.due > now:
                continue
            code = run.exit_code
            if code not in (0, leases.TEMPFAIL):
                # Its sandbox died with it; what the rollout wrote there did not (a full
                # outbox would fill the disk again on resume). The run is still ours: no
                # other engine uses its directory.
                trials = run_dir(self._settings, run_id) / _TRIALS
                # Tracked, as a query is: once `close` gave the run back, a resumed worker
                # writes there.
                await self._db(lambda: remove_stale(trials))  # noqa: B023
            try:
                await self._db(lambda: self._settle(run_id, run.epoch, code))  # noqa: B023
            except Exception as error:
                # Until the worker's end is recorded the run stays held: restarting it at
                # once on a full disk spawned a worker every half second (issue 13.5).
                run.delay = BACKOFF_FIRST_SEC if not run.delay else min(run.delay * 2, 60.0)
                run.due = now + run.delay
                logger.warning(
                    "cannot record the end of eval run %s's worker (%s); trying again in %.0f s",
                    run_id,
                    _brief(error),
                    run.delay,
                )
            else:
                del self._held[run_id]
                if code == leases.TEMPFAIL:  # 1 s, 2 s, 4 s … up to a minute
                    self._not_now.setdefault(run_id, _Backoff()).fail(now)
                else:
                    self._not_now.pop(run_id, None)

    def _settle(self, run_id: str, epoch: int, code: int) -> None:
        """A worker is gone: a run it left unfinished is stopped (if asked) or failed; one it
        could not take (`leases.TEMPFAIL`) is given back to the queue."""
        assert self.process_id is not None
        if code == leases.TEMPFAIL:
            self._release(run_id, epoch)
            return
        with self._sessions() as db:
            run = db.scalar(select(EvalRun).where(*leases.holds(run_id, epoch)))
            if run is None:
                return  # ended by its worker, or no longer ours
            how = f"killed by {_signal_name(-code)}" if code < 0 else f"exit code {code}"
            resumes = self._settings.run_crash_resumes
            if code < 0 and not run.stop_requested and run.crash_resumes < resumes:
                # Killed outright (SIGKILL, the OOM killer): the journal holds every attempt
                # it recorded, so a new worker resumes the run where it was.
                run.crash_resumes += 1
                count = run.crash_resumes
                run.worker_pid = None
                run.claimed_by = run.lease_expires_at = run.heartbeat_at = None
                db.commit()
                message = (
                    f"the run's worker process was {how}; resuming the run from its journal "
                    f"(resume {count} of {resumes}, OSMOSIS_RUN_CRASH_RESUMES)"
                )
                logger.warning("eval run %s: %s", run_id, message)
                with contextlib.suppress(OSError):
                    append_log(run_dir(self._settings, run_id), message, level="warning")
                return
            if run.stop_requested:
                run.status, run.error = "stopped", "stopped on request"
            else:
                run.status = "failed"
                run.error = f"the run's worker process ended unexpectedly: {how}"
                if code < 0 and run.crash_resumes:
                    run.error += (
                        f", after {run.crash_resumes} resume(s) from its journal "
                        f"(OSMOSIS_RUN_CRASH_RESUMES={resumes})"
                    )
                space = self._space()
                if space.low:  # the likeliest reason, and one the operator can fix
                    run.error += f"; {space.describe(self._settings.home)}"
            run.completed_at = utcnow()
            run.secrets_ciphertext = None
            run.worker_pid = None
            run.claimed_by = run.lease_expires_at = None
            db.commit()
            status, error = run.status, run.error
        tail = self._tail(run_id)
        message = error + (f"; its last output:\n{tail}" if tail and status == "failed" else "")
        logger.warning("eval run %s %s: %s", run_id, status, error)
        with contextlib.suppress(OSError):  # recorded already; a full disk may refuse the log
            append_log(run_dir(self._settings, run_id), message, level="error")

    def _tail(self, run_id: str) -> str:
        try:
            with self._worker_log(run_id).open("rb") as handle:
                size = handle.seek(0, 2)
                handle.seek(max(0, size - _TAIL_BYTES))
                text = handle.read().decode("utf-8", "replace")
        except OSError:
            return ""
        return "\n".join(text.strip().splitlines()[-10:])


def worker_log_path(home: Path, run_id: str) -> Path:
    """A run's worker log: its worker's stdout and stderr."""
    return home / "logs" / "workers" / f"{run_id}.log"


def _close_stdin(worker: subprocess.Popen[bytes]) -> None:
    """Close our end of a spare's stdin (it never took a run, or it died taking one)."""
    if worker.stdin is not None:
        with contextlib.suppress(OSError):
            worker.stdin.close()


def _signal_name(number: int) -> str:
    """`SIGKILL (signal 9: the OOM killer, or a kill -9)`, `SIGSEGV (signal 11)`."""
    try:
        name = signal.Signals(number).name
    except ValueError:
        return f"signal {number}"
    hint = ": the OOM killer, or a kill -9" if number == signal.SIGKILL else ""
    return f"{name} (signal {number}{hint})"


def _brief(error: Exception) -> str:
    """The driver's own words, one line: not SQLAlchemy's SQL text and background link."""
    return str(getattr(error, "orig", None) or error).splitlines()[0]
