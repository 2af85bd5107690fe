"""The process that executes one evaluation run: `python -m osmosis.platform.run_worker <id>`.

The scheduler starts it. It claims the run (`running`), checks out the submitted commit,
writes the submitted config into the checkout, and hosts the engine exactly as
`osmosis eval run` does (`plan_local_run` + `run_local`) with the run directory at
`<home>/runs/<id>/`, so the journal there decides what is recorded and a restart resumes.

- A pre-flight failure (bad model key, missing dataset or secret, an entrypoint that does not
  start) ends the run `failed` with the reason in `error` and `logs.txt`; nothing is dispatched.
- A rollout server or provider that dies mid-run halts the engine; the worker resumes it up to
  `MAX_RESTARTS` times, then fails the run saying why. Attempts are never recorded as zeros.
- SIGTERM (a requested stop) cancels the engine, which writes the outputs for what finished;
  the run ends `stopped`. A server shutting down SIGKILLs its workers instead, so the run
  stays `running` with its unfinished attempts pending, and the next start resumes it.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import sys
import traceback
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC
from pathlib import Path
from typing import Any, cast

from sqlalchemy import CursorResult, update

from osmosis.eval.environment import RolloutEnvironmentError
from osmosis.eval.local_plan import LocalRunOptions, PlanError, plan_local_run
from osmosis.eval.local_run import RunFailed, run_local
from osmosis.eval.rollout_process import RolloutStartError
from osmosis.eval.run_dir import ResumeRefused, RunLocked
from osmosis.platform import datasets
from osmosis.platform.checkout import CheckoutError, checkout, remove_checkout
from osmosis.platform.crypto import KEY_ENV, load_secret_box
from osmosis.platform.db import make_engine, make_session_factory
from osmosis.platform.db.dataset_models import DatasetVersion
from osmosis.platform.db.models import utcnow
from osmosis.platform.db.run_models import EvalRun
from osmosis.platform.errors import NotFound, PlatformError
from osmosis.platform.run_files import append_log
from osmosis.platform.run_sink import AttemptSink
from osmosis.platform.runs import run_dir, runs_root, secrets_context
from osmosis.platform.secrets import resolve_secrets
from osmosis.platform.settings import Settings

MAX_RESTARTS = 2
_RESTART_PAUSE_SEC = 1.0


@dataclass(frozen=True)
class _Outcome:
    status: str  # finished | failed | stopped | left running
    error: str | None = None


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        print("usage: python -m osmosis.platform.run_worker <run_id>", file=sys.stderr)
        return 2
    return asyncio.run(_main(Settings.from_env(), args[0]))


async def _main(settings: Settings, run_id: str) -> int:
    worker = _Worker(settings, run_id)
    task = asyncio.current_task()
    assert task is not None
    loop = asyncio.get_running_loop()
    # Until this line a SIGTERM kills us outright; the scheduler then settles the run's status.
    loop.add_signal_handler(signal.SIGTERM, task.cancel)
    try:
        await worker.run()
    except asyncio.CancelledError:
        await asyncio.shield(worker.interrupted())
    finally:
        worker.close()
    return 0


class _Worker:
    def __init__(self, settings: Settings, run_id: str) -> None:
        assert settings.database_url is not None  # filled in by Settings
        self.settings = settings
        self.run_id = run_id
        self.dir = run_dir(settings, run_id)
        self.engine = make_engine(settings.database_url)
        self.sessions = make_session_factory(self.engine)
        env = {KEY_ENV: settings.secret_key} if settings.secret_key else {}
        self.box = load_secret_box(settings.home, env=env)
        self.claimed = False

    def log(self, message: str, *, level: str = "info") -> None:
        append_log(self.dir, message, level=level)

    def close(self) -> None:
        self.engine.dispose()

    # -- the run ----------------------------------------------------------------------------
    async def run(self) -> None:
        if not self._claim():
            return
        with self.sessions() as db:
            run = db.get(EvalRun, self.run_id)
            assert run is not None
            db.expunge(run)
        try:
            outcome = await self._execute(run)
        except Exception as error:  # a bug of ours: say so on the run rather than vanish
            traceback.print_exc()
            outcome = self._failed(f"internal error of the platform worker: {_message(error)}")
        self._finish(outcome)

    def _claim(self) -> bool:
        """pending/running → running, atomically: a run stopped meanwhile is left alone."""
        with self.sessions() as db:
            claim = update(EvalRun).where(
                EvalRun.id == self.run_id, EvalRun.status.in_(("pending", "running"))
            )
            result = db.execute(claim.values(status="running", worker_pid=os.getpid()))
            claimed = cast(CursorResult[Any], result).rowcount
            db.execute(
                update(EvalRun)
                .where(EvalRun.id == self.run_id, EvalRun.started_at.is_(None))
                .values(started_at=utcnow())
            )
            db.commit()
        self.claimed = bool(claimed)
        return self.claimed

    async def _execute(self, run: EvalRun) -> _Outcome:
        self.log(f"run {run.name} ({run.id}) started by the platform")
        try:
            config_path, dataset_file = await asyncio.to_thread(self._prepare, run)
            environ = self._environ(run)
        except (CheckoutError, PlatformError, OSError) as error:
            return self._failed(f"cannot prepare the run: {_message(error)}")
        threshold = float(json.loads(run.config)["evaluation"]["pass_threshold"])
        sink = AttemptSink(self.sessions, run_id=run.id, pass_threshold=threshold)
        await sink.resync(self.dir / "events.jsonl")
        options = LocalRunOptions(
            name=run.id,
            output=runs_root(self.settings),
            dataset_file=dataset_file,
            retry_failed=run.retry_failed,
            environ=environ,
            env_cache=self.settings.home / "envs",
        )
        restarts = 0
        while True:
            try:
                plan = plan_local_run(config_path, options)
            except PlanError as error:
                return self._failed(_message(error))
            self._set_total(plan.total_work_items, plan.selection.total_rows)
            try:
                async with sink.flushing():
                    report = await run_local(plan, sink)
            except (
                RunFailed,
                RolloutEnvironmentError,
                RolloutStartError,
                RunLocked,
                ResumeRefused,
            ) as error:
                return self._failed(_message(error))
            self._set_resumed(report.resumed)
            if report.status == "finished":
                return _Outcome("finished")
            reason = report.halted or (
                f"{report.total_work_items - report.resumed - report.dispatched} work items "
                "were not dispatched"
            )
            if restarts >= MAX_RESTARTS:
                return self._failed(
                    f"the run halted {restarts + 1} times; last: {reason}. Recorded attempts "
                    "are kept: retry the run to finish it"
                )
            restarts += 1
            self.log(
                f"the run halted: {reason}; resuming it (restart {restarts} of {MAX_RESTARTS})",
                level="warning",
            )
            await asyncio.sleep(_RESTART_PAUSE_SEC)

    def _prepare(self, run: EvalRun) -> tuple[Path, Path]:
        """Check out the commit, write the submitted config, and link the dataset in."""
        tree = checkout(
            self.settings.home,
            workspace_id=run.workspace_id,
            origin_url=run.origin_url,
            commit_sha=run.commit_sha,
            run_id=run.id,
            log=self.log,
        )
        config_path = tree / run.config_path
        config_path.parent.mkdir(parents=True, exist_ok=True)
        config_path.write_text(run.config_toml, encoding="utf-8")
        with self.sessions() as db:
            version = db.get(DatasetVersion, run.dataset_version_id or "")
            if version is None:
                raise NotFound(f"dataset {run.dataset_name!r} no longer exists")
            blob = datasets.version_path(self.settings, version)
        # Named after the dataset, so the run's metrics say `multiply`, not a content hash.
        dataset_file = tree / ".osmosis" / "datasets" / f"{run.dataset_name}{blob.suffix}"
        dataset_file.parent.mkdir(parents=True, exist_ok=True)
        dataset_file.unlink(missing_ok=True)
        try:
            os.link(blob, dataset_file)
        except OSError:
            shutil.copyfile(blob, dataset_file)
        return config_path, dataset_file

    def _environ(self, run: EvalRun) -> dict[str, str]:
        """The server's environment (minus its own settings) with the run's secrets: stored
        ones (personal over workspace), then the values given for this run, which win."""
        scopes: dict[str, str] = json.loads(run.secret_scopes)
        stored = [name for name, scope in scopes.items() if scope != "run"]
        environ = {
            name: value
            for name, value in os.environ.items()
            if not name.startswith(("OSMOSIS_", "_OSMOSIS_"))
        }
        with self.sessions() as db:
            if stored:
                if run.created_by is None:
                    raise PermissionError("the user who submitted the run no longer exists")
                environ.update(
                    resolve_secrets(
                        db,
                        box=self.box,
                        workspace_id=run.workspace_id,
                        user_id=run.created_by,
                        names=stored,
                    )
                )
        if run.secrets_ciphertext:
            provided = json.loads(
                self.box.decrypt(run.secrets_ciphertext, context=secrets_context(run.id))
            )
            environ.update(provided)
        return environ

    # -- bookkeeping ------------------------------------------------------------------------
    def _failed(self, reason: str) -> _Outcome:
        self.log(reason, level="error")
        return _Outcome("failed", reason)

    def _set_total(self, total: int, dataset_rows: int) -> None:
        with self.sessions() as db:
            db.execute(
                update(EvalRun)
                .where(EvalRun.id == self.run_id)
                .values(total=total, dataset_rows=dataset_rows)
            )
            db.commit()

    def _set_resumed(self, resumed: int) -> None:
        with self.sessions() as db:
            db.execute(
                update(EvalRun).where(EvalRun.id == self.run_id).values(resumed_count=resumed)
            )
            db.commit()

    async def interrupted(self) -> None:
        """SIGTERM: a requested stop ends the run `stopped`. Without a request (someone
        else sent it) the run is left as it is; the scheduler settles it."""
        if not self.claimed:
            return
        with self.sessions() as db:
            run = db.get(EvalRun, self.run_id)
            stop = run is not None and run.stop_requested
        if stop:
            self.log("stopped on request; the attempts that finished are kept", level="warning")
            self._finish(_Outcome("stopped", "stopped on request"))
        else:
            self.log("the worker was terminated without a stop request", level="warning")

    def _finish(self, outcome: _Outcome) -> None:
        with self.sessions() as db:
            run = db.get(EvalRun, self.run_id)
            assert run is not None
            run.status = outcome.status
            run.error = outcome.error
            run.completed_at = utcnow()
            if run.started_at is not None:
                elapsed = run.completed_at - run.started_at
                run.duration_ms = round(elapsed.total_seconds() * 1000, 3)
            metrics = _platform_metrics(self.dir / "metrics.json", run)
            run.summary = json.dumps(metrics) if metrics is not None else None
            run.secrets_ciphertext = None  # values given for this run live only while it runs
            run.retry_failed = False
            run.worker_pid = None
            db.commit()
        remove_checkout(self.settings.home, self.run_id)
        self.log(f"run {outcome.status}" + (f": {outcome.error}" if outcome.error else ""))


def _platform_metrics(path: Path, run: EvalRun) -> dict[str, Any] | None:
    """The engine's metrics.json with the platform run's identity, status and timing, written
    back: the engine knows the run by its directory (the id) and says `incomplete` where the
    platform says `stopped` or `failed`, and users download this file."""
    if not path.is_file():
        return None
    metrics: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    metrics["eval_run"] = {
        **metrics.get("eval_run", {}),
        "id": run.id,
        "name": run.name,
        "status": run.status,
        "duration_ms": run.duration_ms,
        "started_at": _iso(run.started_at),
        "completed_at": _iso(run.completed_at),
    }
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(metrics, indent=2) + "\n", encoding="utf-8")
    os.replace(partial, path)
    return metrics


def _iso(moment: Any) -> str | None:
    if moment is None:
        return None
    aware = moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)
    return str(aware.isoformat(timespec="milliseconds"))


def _message(error: BaseException) -> str:
    hint = getattr(error, "hint", "")
    text = str(error) or type(error).__name__
    return f"{text} ({hint})" if hint else text


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception:  # the scheduler reads this log when a worker dies without a status
        traceback.print_exc()
        sys.exit(1)
