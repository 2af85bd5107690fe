"""The queue of evaluation runs: one worker process per running run, at most
`settings.max_concurrent_runs` at once, pending runs started oldest first.

    scheduler = Scheduler(sessions, settings)
    await scheduler.start()      # in the app's lifespan
    scheduler.wake()             # a run was submitted or retried
    scheduler.stop_worker(id)    # a stop was requested: SIGTERM its worker
    await scheduler.close()      # shutdown: runs stay `running`, to resume at the next start

On start, runs left `running` by a previous server (whose workers died with it) are resumed
first. A worker that exits without giving its run a final status fails the run with a log
line that says so. Workers lead their own process group and, on Linux, are SIGKILLed by the
kernel when the server dies (`PR_SET_PDEATHSIG`); each worker does the same for its rollout
server, so a SIGKILL of the server leaves nothing behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import subprocess
import sys
from pathlib import Path

from sqlalchemy import case, select
from sqlalchemy.orm import Session, sessionmaker

# The rollout process's parent-death hook serves the worker just as well.
from osmosis.eval.rollout_process import _die_with_parent_hook
from osmosis.platform.crypto import KEY_ENV
from osmosis.platform.db.models import utcnow
from osmosis.platform.db.run_models import TERMINAL, EvalRun
from osmosis.platform.run_files import append_log
from osmosis.platform.runs import run_dir
from osmosis.platform.settings import Settings

logger = logging.getLogger("osmosis.platform.scheduler")

POLL_SEC = 0.5
SHUTDOWN_GRACE_SEC = 8.0
_TAIL_BYTES = 4096


class Scheduler:
    """Starts, watches and stops the worker processes of evaluation runs."""

    def __init__(self, sessions: sessionmaker[Session], settings: Settings) -> None:
        self._sessions = sessions
        self._settings = settings
        self._workers: dict[str, subprocess.Popen[bytes]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None

    # -- control ----------------------------------------------------------------------------
    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        self._task = asyncio.create_task(self._run(), name="osmosis-scheduler")

    def wake(self) -> None:
        """Look at the queue now rather than at the next poll (callable from any thread)."""
        loop, event = self._loop, self._wake
        if loop is not None and event is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(event.set)

    def stop_worker(self, run_id: str) -> None:
        """SIGTERM the run's worker: it cancels the engine, writes what finished, and ends
        the run `stopped` (its `stop_requested` is set before this is called)."""
        worker = self._workers.get(run_id)
        if worker is not None and worker.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(worker.pid, signal.SIGTERM)
        self.wake()

    def running(self) -> list[str]:
        return [run_id for run_id, worker in self._workers.items() if worker.poll() is None]

    async def close(self) -> None:
        """Stop scheduling and end every worker as a crash would: SIGKILL. Their runs stay
        `running` and resume at the next start from their journals.

        Not SIGTERM, which a worker takes for `eval stop`: a server shutdown is not a user's
        decision to end the run. A kill leaves every unfinished attempt pending in the journal,
        which is what the next start resumes.
        """
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        workers = list(self._workers.values())
        for worker in workers:
            if worker.poll() is None:
                # The group: the worker and anything it started that shares it (uv, say).
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(worker.pid, signal.SIGKILL)
        with contextlib.suppress(TimeoutError):
            waits = (asyncio.to_thread(worker.wait) for worker in workers)
            await asyncio.wait_for(asyncio.gather(*waits), SHUTDOWN_GRACE_SEC)
        self._workers.clear()

    # -- the loop ---------------------------------------------------------------------------
    async def _run(self) -> None:
        assert self._wake is not None
        while True:
            try:
                self._tick()
            except Exception:  # a bad moment of the database must not end scheduling
                logger.exception("the run scheduler failed a round; retrying")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), POLL_SEC)
            self._wake.clear()

    def _tick(self) -> None:
        self._reap()
        free = self._settings.max_concurrent_runs - len(self._workers)
        if free <= 0:
            return
        with self._sessions() as db:
            # Runs a dead server left `running` come first, then pending ones, oldest first.
            query = (
                select(EvalRun.id)
                .where(EvalRun.status.in_(("running", "pending")))
                .order_by(case((EvalRun.status == "running", 0), else_=1), EvalRun.created_at)
            )
            waiting = [run_id for run_id in db.scalars(query) if run_id not in self._workers]
        for run_id in waiting[:free]:
            self._spawn(run_id)

    def _spawn(self, run_id: str) -> None:
        # Spawned on the event loop's thread: the parent-death signal follows the thread
        # that forked, and this one lives as long as the server.
        log_path = self._worker_log(run_id)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with log_path.open("ab") as output:
            worker = subprocess.Popen(
                [sys.executable, "-m", "osmosis.platform.run_worker", run_id],
                env=self._worker_env(),
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_die_with_parent_hook(),
            )
        self._workers[run_id] = worker
        logger.info("started worker %s for eval run %s", worker.pid, run_id)

    def _worker_env(self) -> dict[str, str]:
        settings = self._settings
        assert settings.database_url is not None
        env = dict(os.environ)
        env.update(OSMOSIS_HOME=str(settings.home), OSMOSIS_DATABASE_URL=settings.database_url)
        if settings.secret_key:
            env[KEY_ENV] = settings.secret_key
        return env

    def _worker_log(self, run_id: str) -> Path:
        return self._settings.home / "logs" / "workers" / f"{run_id}.log"

    def _reap(self) -> None:
        for run_id, worker in list(self._workers.items()):
            code = worker.poll()
            if code is None:
                continue
            del self._workers[run_id]
            self._settle(run_id, code)

    def _settle(self, run_id: str, code: int) -> None:
        """A worker is gone: a run it left unfinished is stopped (if asked) or failed."""
        with self._sessions() as db:
            run = db.get(EvalRun, run_id)
            if run is None or run.status in TERMINAL:
                return
            if run.status == "pending" and code == 0:
                return  # its worker ended the run cleanly, then a retry queued it again
            how = f"killed by signal {-code}" if code < 0 else f"exit code {code}"
            if run.stop_requested:
                run.status, run.error = "stopped", "stopped on request"
            else:
                run.status = "failed"
                run.error = f"the run's worker process ended unexpectedly ({how})"
            run.completed_at = utcnow()
            run.secrets_ciphertext = None
            run.worker_pid = None
            db.commit()
            status, error = run.status, run.error
        tail = self._tail(run_id)
        message = error + (f"; its last output:\n{tail}" if tail and status == "failed" else "")
        append_log(run_dir(self._settings, run_id), message, level="error")
        logger.warning("eval run %s %s: %s", run_id, status, error)

    def _tail(self, run_id: str) -> str:
        try:
            with self._worker_log(run_id).open("rb") as handle:
                size = handle.seek(0, 2)
                handle.seek(max(0, size - _TAIL_BYTES))
                text = handle.read().decode("utf-8", "replace")
        except OSError:
            return ""
        return "\n".join(text.strip().splitlines()[-10:])
