"""What the command line asks of a platform home from outside its processes.

    server_pid(settings)          # the home's server, or None
    worker_pid(settings)          # its worker (`--role worker`), or None
    platform_status(settings)     # {"database": {...}, "processes": [...]} from the database
    migrate_database(settings)    # (revision found, revision now)
    local_view(root, host="127.0.0.1").app   # the dashboard over local run directories
    local_row_texts(run_dir, 1.0)  # {row: (input, expected, {run: output})}, for reports

`status` shows every live process of the platform (whatever machine it runs on) and the runs
each worker holds, read from the database the settings name; a database that cannot be read
is reported, never a traceback. SQLAlchemy, Alembic and FastAPI are imported inside the
functions that need them, so `osmosis --help` stays fast; the rest is standard library.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fastapi import FastAPI

    from osmosis.platform.core.disk import DiskSpace
    from osmosis.platform.core.home_lock import Holder
    from osmosis.platform.core.settings import Settings


# -- the home's processes ----------------------------------------------------------------------
def server_pid(settings: Settings) -> int | None:
    """The server's pid: the pid file's, else the home lock's holder; only a live osmosis
    process counts (a pid recycled by another program after a crash must not be signalled)."""
    from osmosis.platform.core.home_lock import is_osmosis_process, read_holder

    try:
        pid = int(settings.pid_file.read_text(encoding="utf-8").split()[0])
    except (OSError, ValueError, IndexError):
        pid = None
    if pid is not None and is_osmosis_process(pid):
        return pid
    holder = read_holder(settings.lock_file)  # no pid file yet (starting), or a stale one
    return holder.pid if holder else None


def worker_pid(settings: Settings) -> int | None:
    """The home's worker process (`--role worker`, or the worker part of a server with role
    all, which is the server's own pid): its state file's, else the worker lock's holder."""
    from osmosis.platform.core.home_lock import is_osmosis_process, read_holder

    pid = worker_state_pid(settings)
    if pid is not None and is_osmosis_process(pid):
        return pid
    holder = read_holder(settings.worker_lock_file)
    if holder is None or holder.pid == server_pid(settings):
        return None  # no worker, or the one inside the server (role all)
    return holder.pid


def worker_state_pid(settings: Settings) -> int | None:
    """The pid a worker wrote to `<home>/worker.json` once it was ready, alive or not."""
    try:
        return int(json.loads(settings.worker_state_file.read_text(encoding="utf-8"))["pid"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def lock_holder(settings: Settings, *, worker: bool = False) -> Holder | None:
    """Who holds the home's server lock (or with `worker`, its worker lock), if anyone."""
    from osmosis.platform.core.home_lock import read_holder

    return read_holder(settings.worker_lock_file if worker else settings.lock_file)


def home_disk(settings: Settings) -> DiskSpace:
    """Free space on the disk that holds the home, against OSMOSIS_MIN_FREE_DISK_BYTES."""
    from osmosis.platform.core.disk import disk_space

    return disk_space(settings.home, min_free_bytes=settings.min_free_disk_bytes)


# -- the database's view -------------------------------------------------------------------
def _sqlite_missing(url: str) -> bool:
    """A SQLite URL whose file does not exist yet: nothing to read (and nothing to create)."""
    from sqlalchemy import make_url

    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite" or not parsed.database:
        return False
    return parsed.database != ":memory:" and not Path(parsed.database).exists()


def platform_status(settings: Settings) -> dict[str, Any]:
    """The live processes of the platform and the runs each holds."""
    from sqlalchemy.exc import SQLAlchemyError

    from osmosis.platform.core.db import make_engine, make_session_factory
    from osmosis.platform.core.db.engine import DatabaseUnavailable, safe_url
    from osmosis.platform.core.schema_revision import schema_problem
    from osmosis.platform.worker.leases import held_runs
    from osmosis.platform.worker.processes import db_now, live_processes

    url = settings.database_url
    assert url is not None
    database: dict[str, Any] = {"url": safe_url(url), "reachable": False}
    if _sqlite_missing(url):
        database["problem"] = "no database yet (the first start creates it)"
        return {"database": database, "processes": []}
    try:
        engine = make_engine(url)
    except DatabaseUnavailable as error:
        database["problem"] = str(error)
        return {"database": database, "processes": []}
    try:
        problem = schema_problem(engine)
        database["reachable"] = True
        if problem is not None:
            database["problem"] = problem
            return {"database": database, "processes": []}
        with make_session_factory(engine)() as db:
            now = db_now(db)
            processes = live_processes(db, now=now, within_s=settings.lease_s)
            runs = held_runs(db, now=now)
    except SQLAlchemyError as error:
        database["problem"] = f"cannot read the database: {getattr(error, 'orig', error)}"
        return {"database": database, "processes": []}
    finally:
        engine.dispose()
    by_holder: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for run in runs:
        by_holder[run.claimed_by].append(
            {"id": run.id, "name": run.name, "lease_expires_in_s": run.lease_expires_in_s}
        )
    live = {process.id for process in processes}
    listed = [
        {
            "id": process.id,
            "role": process.role,
            "host": process.host,
            "pid": process.pid,
            "url": process.url,
            "home": process.home,
            "version": process.version,
            "heartbeat_age_s": process.heartbeat_age_s,
            **({"runs": by_holder.get(process.id, [])} if process.role != "api" else {}),
        }
        for process in processes
    ]
    # Runs whose holder is not live: a worker that died; another takes them once the lease
    # has run out.
    orphaned = [run for holder, held in by_holder.items() if holder not in live for run in held]
    view: dict[str, Any] = {"database": database, "processes": listed}
    if orphaned:
        view["runs_without_a_live_worker"] = orphaned
    return view


def migrate_database(settings: Settings) -> tuple[str | None, str]:
    """Upgrade the database to this osmosis's newest revision: (revision found, revision now).

    `SchemaMismatch` when the database is newer than this osmosis; `DatabaseUnavailable` when
    it cannot be reached or used.
    """
    from sqlalchemy.exc import OperationalError

    from osmosis.platform.core.db import make_engine
    from osmosis.platform.core.db.engine import DatabaseUnavailable, safe_url
    from osmosis.platform.core.schema_revision import check_schema

    url = settings.database_url
    assert url is not None
    engine = make_engine(url)
    try:
        return check_schema(engine, migrate=True)
    except OperationalError as error:
        raise DatabaseUnavailable(
            f"cannot use the database at {safe_url(url)}: {error.orig}"
        ) from None
    finally:
        engine.dispose()


def copy_store(
    settings: Settings, url: str, *, progress: Callable[[str, int, int], None]
) -> dict[str, Any]:
    """Copy the directory store `settings` name (`OSMOSIS_BLOB_DIR`, else the home's) into
    the object store at `url`: dataset blobs, run directories and the store's marker, so the
    database accepts the object store as the same store. Idempotent and verified
    (`object_store.copy_directory_store`); `BlobStoreError` when it cannot be done."""
    from osmosis.platform.core.blobs import BlobStore, BlobStoreError, ObjectBlobStore
    from osmosis.platform.core.object_store import copy_directory_store

    source = BlobStore(settings.blob_dir, runs_root=settings.runs_dir)
    if not source.root.is_dir():
        raise BlobStoreError(
            f"no directory store at {source.root}: set OSMOSIS_BLOB_DIR (or --home) to the "
            "store to copy"
        )
    target = ObjectBlobStore(url, settings.blob_dir, runs_root=settings.runs_dir)
    target.prepare()
    report = copy_directory_store(source, target, progress=progress)
    return {
        "from": str(source.root),
        "runs_from": str(source.runs_root),
        "to": url,
        "copied": report.copied,
        "skipped": report.skipped,
        "bytes": report.bytes,
        "store_id": source.read_marker(),
    }


# -- `osmosis eval view` ----------------------------------------------------------------------
@dataclass(frozen=True)
class LocalView:
    """The dashboard's run pages over local run directories, and what they show."""

    app: FastAPI
    run_count: int
    single: bool
    """`root` is one run directory rather than a directory of runs."""


def local_view(root: Path, *, host: str) -> LocalView:
    """The read-only dashboard over the runs under `root`, for a server listening on `host`.

    On loopback it answers only requests addressed to a loopback name (or `host`), so a page
    in the browser cannot be reached through DNS rebinding; elsewhere it answers any name.
    """
    from osmosis.loopback import is_loopback
    from osmosis.platform.web import create_view_app
    from osmosis.platform.web.source_local import LocalSource
    from osmosis.platform.web.view_guard import LOOPBACK_NAMES

    allowed = LOOPBACK_NAMES | {host.lower()} if is_loopback(host) else None
    app = create_view_app(root, allowed_hosts=allowed)
    runs = LocalSource(root)
    return LocalView(app=app, run_count=runs.run_count(), single=runs.single)


RowTexts = tuple[str | None, str | None, dict[int, str | None]]
"""A row's input, its expected answer (the dataset's label) and each attempt's final output by
run index; None where nothing was recorded."""


def local_row_texts(run_dir: Path, pass_threshold: float) -> dict[int, RowTexts]:
    """Each row's texts in a local run directory, as the viewer's samples pages read them: the
    input and label from the dataset file the run recorded (while its SHA-256 is the run's),
    else the trajectory's first user message; the outputs from the trajectories (`eval run
    --report/--junit`)."""
    from osmosis.platform.web.samples_index import DatasetFile, SampleIndex

    try:
        manifest = json.loads((run_dir / "manifest.json").read_text())
    except (OSError, ValueError):
        manifest = {}
    index = SampleIndex(
        run_dir,
        pass_threshold=pass_threshold,
        dataset=DatasetFile.of_local_run(manifest if isinstance(manifest, dict) else {}),
    )
    index.refresh()
    outputs: dict[int, dict[int, str | None]] = defaultdict(dict)
    given: dict[int, tuple[str | None, str | None]] = {}
    for sample in index.with_texts(list(index.samples)):
        outputs[sample.row_index][sample.run_index] = sample.output
        if sample.row_index not in given:
            row = index.input_of(sample)
            given[sample.row_index] = (row.user, row.label) if row else (None, None)
    return {row: (*given[row], outputs[row]) for row in given}
