"""`osmosis server`: run a platform process in the foreground or background, stop it, show its
state, migrate the database.

A running server announces itself in `<home>/server.pid` and `<home>/server.json`, a worker
process (`--role worker`) in `<home>/worker.json`; `stop` and `status` read those, and
`status` also lists every live process of the platform from the database
(`osmosis.platform.platform_status`). Typer only at module level: FastAPI loads when a server
starts. The platform is reached only through its public face, `osmosis.platform`.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

if TYPE_CHECKING:
    from osmosis.cli.output import CLIError
    from osmosis.platform import HomeInUse, Settings

app = typer.Typer(help="Run the self-hosted platform.", no_args_is_help=True)

HomeOption = typer.Option(
    None, "--home", help="Platform data directory (default: OSMOSIS_HOME or ~/.osmosis/platform)."
)
START_TIMEOUT = 60.0
STOP_TIMEOUT = 20.0


def _settings(**overrides: Any) -> Settings:
    from osmosis.cli.output import CLIError
    from osmosis.platform import Settings, SettingsError

    try:
        return Settings.from_env(os.environ, **overrides)
    except SettingsError as error:
        raise CLIError(str(error), code="VALIDATION") from None


@app.command("start")
def start(
    host: str | None = typer.Option(
        None, "--host", help="Interface to listen on (default 127.0.0.1)."
    ),
    port: int | None = typer.Option(None, "--port", help="Port to listen on (default 8765)."),
    home: Path | None = HomeOption,
    detach: bool = typer.Option(
        False,
        "--detach",
        help="Run in the background; log to <home>/server.log (<home>/worker.log for a worker).",
    ),
    role: str | None = typer.Option(
        None,
        "--role",
        help="all (default: HTTP API, dashboard and the worker executing runs), api (HTTP "
        "only) or worker (runs only). Default: OSMOSIS_ROLE, else all.",
    ),
) -> None:
    """Start the platform: database migrations, first admin user, then the HTTP API.

    First start writes the admin token to <home>/credentials.json (mode 0600).

    The local CLI reads that file, so no login is needed.

    A team's platform: `osmosis server migrate` once, then `--role api` and
    `--role worker` processes on one PostgreSQL and one blob directory.
    """
    from osmosis.cli.output import CLIError, output
    from osmosis.loopback import is_loopback

    settings = _settings(host=host, port=port, home=home, role=role)
    serves_http = settings.role != "worker"
    if serves_http and not is_loopback(settings.host) and not settings.allow_insecure_http:
        raise CLIError(
            f"refusing to serve plain http on {settings.host}: tokens would travel unencrypted",
            code="VALIDATION",
            hint="listen on 127.0.0.1 behind a TLS proxy, or set OSMOSIS_ALLOW_INSECURE_HTTP=1",
        )
    from osmosis.eval.sites.sandbox.support import sandbox_report

    # Only a process that executes runs (roles all and worker) starts workspace code.
    sandbox = sandbox_report(settings.sandbox, settings.sandbox_bwrap, executor=settings.executor)
    if settings.role != "api" and settings.sandbox and sandbox["available"] is False:
        # Workspace code must not run unsandboxed by accident (docs: Security model).
        raise CLIError(
            f"refusing to start: the rollout sandbox is unavailable: {sandbox['reason']}",
            code="VALIDATION",
            details={"sandbox": sandbox},
            hint=str(sandbox["fix"]),
        )
    if sandbox["warning"] and settings.role != "api":
        output().warn(str(sandbox["warning"]))
    from osmosis.listen import ListenError, PortInUse, port_taken
    from osmosis.platform import Holder, HomeInUse, lock_holder, server_pid, worker_pid

    holder = lock_holder(settings) if serves_http else None
    running = server_pid(settings) if serves_http else None
    if holder is not None or running is not None:
        # The server's lock decides (see `serve`); this early check only saves a spawn.
        state = _read_state(settings)
        known = holder or Holder(pid=running or 0, port=state.get("port", 0), url="")
        raise _home_in_use(HomeInUse(settings.home, known))
    worker = worker_pid(settings) if settings.role != "api" else None
    if worker is not None:
        raise _worker_in_use(settings, worker)
    if serves_http and port_taken(settings.host, settings.port):
        raise _port_in_use(settings)
    if detach:
        pid = _spawn(settings)
        if serves_http:
            message = f"Platform running at {settings.url} (pid {pid}, log {settings.log_file})"
        else:
            message = f"Worker running (pid {pid}, log {settings.worker_log_file})"
        output().operation(
            "server.start",
            message=message,
            resource=_describe(settings, pid=pid, running=True),
            next_steps=[{"command": "osmosis server stop"}],
        )
        return
    from osmosis.platform import (
        BlobStoreError,
        DatabaseUnavailable,
        SchemaMismatch,
        SecretKeyError,
        serve,
    )

    if serves_http:
        output().info(f"Platform at {settings.url} (home {settings.home}); Ctrl-C stops it.")
    else:
        output().info(f"Worker for {settings.home}: claiming runs; Ctrl-C stops it.")
    try:
        serve(settings)
    except HomeInUse as error:
        if error.home == settings.home and settings.role != "api":
            worker = worker_pid(settings)
            if worker is not None:
                raise _worker_in_use(settings, worker) from None
        raise _home_in_use(error) from None
    except PortInUse:
        raise _port_in_use(settings) from None
    except ListenError as error:
        raise CLIError(
            str(error),
            code="VALIDATION",
            details={"host": settings.host, "port": settings.port},
            hint="--host must be an address of this machine (or 0.0.0.0)",
        ) from None
    except SchemaMismatch as error:
        raise CLIError(
            str(error), code="VALIDATION", hint="osmosis server migrate; then start again"
        ) from None
    except BlobStoreError as error:
        raise CLIError(
            str(error), code="VALIDATION", hint="check OSMOSIS_BLOB_DIR and OSMOSIS_BLOB_SHARED"
        ) from None
    except DatabaseUnavailable as error:
        raise CLIError(str(error), code="VALIDATION", hint="check OSMOSIS_DATABASE_URL") from None
    except SecretKeyError as error:
        raise CLIError(
            str(error),
            code="VALIDATION",
            hint=f"check OSMOSIS_SECRET_KEY or {settings.home / 'secret.key'}",
        ) from None


@app.command("stop")
def stop(home: Path | None = HomeOption) -> None:
    """Stop a home's background server and worker (SIGTERM, then wait).

    A stopped worker's runs go back to the queue, for any worker to resume."""
    from osmosis.cli.output import output
    from osmosis.platform import server_pid, worker_pid

    settings = _settings(home=home)
    pid = server_pid(settings)
    worker = worker_pid(settings)
    if pid is None and worker is None:
        _clear_stale(settings)
        output().operation(
            "server.stop",
            message=f"No server is running for {settings.home}.",
            resource=_describe(settings, pid=None, running=False),
        )
        return
    stopped = []
    for what, target in (("server", pid), ("worker", worker)):
        if target is not None:
            _terminate(target, what)
            stopped.append(f"the {what} (pid {target})")
    _clear_stale(settings)
    output().operation(
        "server.stop",
        message=f"Stopped {' and '.join(stopped)}.",
        resource={
            **_describe(settings, pid=pid or worker, running=False),
            "worker_pid": worker,
        },
    )


def _terminate(pid: int, what: str) -> None:
    from osmosis.cli.output import CLIError
    from osmosis.platform import process_alive

    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_TIMEOUT
    while process_alive(pid):
        if time.monotonic() > deadline:
            raise CLIError(
                f"the {what} (pid {pid}) did not stop within {STOP_TIMEOUT:.0f} s",
                code="PLATFORM_ERROR",
                details={"pid": pid},
                hint=f"kill -9 {pid}",
            )
        time.sleep(0.1)


@app.command("status")
def status(home: Path | None = HomeOption) -> None:
    """Show a home's server and worker, and every live process of the platform.

    The platform's processes and the runs each worker holds come from the database."""
    from osmosis.cli.output import output
    from osmosis.platform import platform_status, server_pid, worker_pid

    settings = _settings(home=home)
    pid = server_pid(settings)
    worker = worker_pid(settings)
    described = _describe(settings, pid=pid, running=pid is not None)
    described["worker"] = {"running": worker is not None, "pid": worker}
    output().detail(
        {**described, **_disk(settings), **_sandbox(settings), **platform_status(settings)},
        title="Platform server",
    )


@app.command("migrate")
def migrate(home: Path | None = HomeOption) -> None:
    """Apply the database migrations (once, before starting api/worker processes).

    API and worker processes refuse an older schema; `--role all` migrates by itself."""
    from osmosis.cli.output import CLIError, output
    from osmosis.platform import DatabaseUnavailable, SchemaMismatch, migrate_database

    settings = _settings(home=home)
    try:
        found, now = migrate_database(settings)
    except DatabaseUnavailable as error:
        raise CLIError(str(error), code="VALIDATION", hint="check OSMOSIS_DATABASE_URL") from None
    except SchemaMismatch as error:
        raise CLIError(
            str(error), code="CONFLICT", hint="upgrade osmosis on this machine"
        ) from None
    message = (
        f"The database is at revision {now} already."
        if found == now
        else f"Migrated the database from revision {found or 'none'} to {now}."
    )
    output().operation(
        "server.migrate",
        message=message,
        resource={"from_revision": found, "revision": now},
    )


@app.command("copy-store")
def copy_store(
    to: str = typer.Option(
        ..., "--to", help="The object store to copy into: s3://bucket/prefix (AWS_* settings)."
    ),
    home: Path | None = HomeOption,
) -> None:
    """Copy a directory blob store (dataset blobs, runs, its id) into an object store.

    Run it with the settings the platform had (OSMOSIS_BLOB_DIR or the home), processes
    stopped; then start every process with OSMOSIS_BLOB_URL set to the same URL. Idempotent:
    objects already copied (same size and MD5) are skipped, so it can be run again."""
    from osmosis.cli.output import CLIError, output
    from osmosis.platform import BlobStoreError
    from osmosis.platform import copy_store as copy

    out = output()

    def progress(key: str, done: int, total: int) -> None:
        if done == total or done % 100 == 0:
            out.info(f"{done}/{total} files checked ({key})")

    settings = _settings(home=home)
    try:
        result = copy(settings, to, progress=progress)
    except BlobStoreError as error:
        raise CLIError(str(error), code="VALIDATION") from None
    out.operation(
        "server.copy_store",
        message=(
            f"Copied {result['copied']} files ({result['bytes']:,} bytes) from {result['from']} "
            f"to {to}; {result['skipped']} were there already. Start every process with "
            f"OSMOSIS_BLOB_URL={to}."
        ),
        resource=result,
    )


# -- process bookkeeping -------------------------------------------------------------------
def _describe(settings: Settings, *, pid: int | None, running: bool) -> dict[str, Any]:
    state = _read_state(settings)
    worker = settings.role == "worker"
    return {
        "running": running,
        "pid": pid,
        "role": state.get("role", settings.role) if running else settings.role,
        "url": state.get("url", settings.url) if running and not worker else None,
        "home": str(settings.home),
        "log_file": str(settings.worker_log_file if worker else settings.log_file),
    }


def _worker_in_use(settings: Settings, pid: int) -> CLIError:
    from osmosis.cli.output import CLIError

    return CLIError(
        f"a worker is already running for {settings.home} (pid {pid})",
        code="CONFLICT",
        details={"home": str(settings.home), "pid": pid},
        hint="osmosis server status shows it; osmosis server stop stops it",
    )


def _read_state(settings: Settings) -> dict[str, Any]:
    import json

    try:
        data = json.loads(settings.state_file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _disk(settings: Settings) -> dict[str, Any]:
    from osmosis.platform import home_disk

    space = home_disk(settings)
    described: dict[str, Any] = {"low_disk": space.low, "disk_free_bytes": space.free_bytes}
    if space.low:
        described["disk_warning"] = f"{space.describe(settings.home)}: no run starts"
    return described


def _sandbox(settings: Settings) -> dict[str, Any]:
    from osmosis.eval.sites.sandbox.support import sandbox_report

    report = sandbox_report(settings.sandbox, settings.sandbox_bwrap, executor=settings.executor)
    described: dict[str, Any] = {"sandbox": report["sandbox"]}
    if report["warning"]:
        described["sandbox_warning"] = report["warning"]
    return described


def _home_in_use(error: HomeInUse) -> CLIError:
    from osmosis.cli.output import CLIError

    holder = error.holder
    return CLIError(
        str(error),
        code="CONFLICT",
        details={
            "home": str(error.home),
            "pid": holder.pid if holder else None,
            "port": holder.port if holder else None,
        },
        hint="osmosis server status shows it; osmosis server stop stops it",
    )


def _clear_stale(settings: Settings) -> None:
    settings.pid_file.unlink(missing_ok=True)
    settings.state_file.unlink(missing_ok=True)
    settings.worker_state_file.unlink(missing_ok=True)


def _port_in_use(settings: Settings) -> CLIError:
    from osmosis.cli.output import CLIError

    return CLIError(
        f"port {settings.port} on {settings.host} is already in use",
        code="CONFLICT",
        details={"host": settings.host, "port": settings.port},
        hint="choose another with --port",
    )


def _spawn(settings: Settings) -> int:
    """Start `osmosis server start` in a new session, and wait until it answers health."""
    from osmosis.cli.output import CLIError
    from osmosis.listen import port_taken
    from osmosis.platform import HomeInUse, lock_holder, worker_state_pid
    from osmosis.private_file import make_private_dir, open_private_append

    make_private_dir(settings.home)
    command = [
        sys.executable,
        "-c",
        "from osmosis.cli.main import run; run()",
        "server",
        "start",
        "--host",
        settings.host,
        "--port",
        str(settings.port),
        "--home",
        str(settings.home),
        "--role",
        settings.role,
    ]
    worker = settings.role == "worker"
    log_file = settings.worker_log_file if worker else settings.log_file
    with open(open_private_append(log_file), "ab") as log:
        child = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # survives the terminal that started it, and its Ctrl-C
        )
    deadline = time.monotonic() + START_TIMEOUT
    what = "worker" if worker else "server"
    while time.monotonic() < deadline:
        if child.poll() is not None:
            # Another start won the home's lock at the same moment: say which server runs.
            holder = lock_holder(settings, worker=worker)
            if holder is not None and holder.pid != child.pid:
                if worker:
                    raise _worker_in_use(settings, holder.pid)
                raise _home_in_use(HomeInUse(settings.home, holder))
            # Taken between the check before the spawn and the server's bind.
            if not worker and port_taken(settings.host, settings.port):
                raise _port_in_use(settings)
            raise CLIError(
                f"the {what} exited during start-up (exit code {child.returncode})",
                code="PLATFORM_ERROR",
                details={"log_file": str(log_file), "log_tail": _tail(log_file)},
                hint=f"see {log_file}",
            )
        if worker and worker_state_pid(settings) == child.pid:
            return child.pid
        if not worker and _read_state(settings).get("pid") == child.pid and _healthy(settings.url):
            return child.pid
        time.sleep(0.1)
    child.terminate()
    where = "start" if worker else f"answer at {settings.url}"
    raise CLIError(
        f"the {what} did not {where} within {START_TIMEOUT:.0f} s",
        code="PLATFORM_ERROR",
        details={"log_file": str(log_file)},
        hint=f"see {log_file}",
    )


def _healthy(url: str) -> bool:
    import httpx

    try:
        return httpx.get(f"{url}/api/health", timeout=1.0, trust_env=False).status_code == 200
    except httpx.HTTPError:
        return False


def _tail(path: Path, lines: int = 20) -> list[str]:
    try:
        return path.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:]
    except OSError:
        return []
