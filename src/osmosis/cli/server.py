"""`osmosis server`: run the platform in the foreground or background, stop it, show its state.

A running server announces itself in `<home>/server.pid` and `<home>/server.json`; `stop` and
`status` read those. Typer only at module level: FastAPI loads when a server actually starts.
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
    from osmosis.platform.settings import Settings

app = typer.Typer(help="Run the self-hosted platform.", no_args_is_help=True)

HomeOption = typer.Option(
    None, "--home", help="Platform data directory (default: OSMOSIS_HOME or ~/.osmosis/platform)."
)
START_TIMEOUT = 60.0
STOP_TIMEOUT = 20.0


def _settings(**overrides: Any) -> Settings:
    from osmosis.cli.output import CLIError
    from osmosis.platform.settings import Settings, SettingsError

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
        False, "--detach", help="Run in the background; log to <home>/server.log."
    ),
) -> None:
    """Start the platform: database migrations, first admin user, then the HTTP API.

    First start writes the admin token to <home>/credentials.json (mode 0600).

    The local CLI reads that file, so no login is needed.
    """
    from osmosis.cli.main import output
    from osmosis.cli.output import CLIError
    from osmosis.client import is_loopback

    settings = _settings(host=host, port=port, home=home)
    if not is_loopback(settings.host) and not settings.allow_insecure_http:
        raise CLIError(
            f"refusing to serve plain http on {settings.host}: tokens would travel unencrypted",
            code="VALIDATION",
            hint="listen on 127.0.0.1 behind a TLS proxy, or set OSMOSIS_ALLOW_INSECURE_HTTP=1",
        )
    running = _running_pid(settings)
    if running is not None:
        raise CLIError(
            f"a server is already running for {settings.home} (pid {running})",
            code="CONFLICT",
            details={"pid": running, "home": str(settings.home)},
            hint="osmosis server stop",
        )
    if _port_answers(settings):
        raise CLIError(
            f"port {settings.port} on {settings.host} is already in use",
            code="CONFLICT",
            hint="choose another with --port",
        )
    if detach:
        pid = _spawn(settings)
        output().operation(
            "server.start",
            message=f"Platform running at {settings.url} (pid {pid}, log {settings.log_file})",
            resource=_describe(settings, pid=pid, running=True),
            next_steps=[{"command": "osmosis server stop"}],
        )
        return
    from osmosis.platform.crypto import SecretKeyError
    from osmosis.platform.db.engine import DatabaseUnavailable
    from osmosis.platform.server import serve

    output().info(f"Platform at {settings.url} (home {settings.home}); Ctrl-C stops it.")
    try:
        serve(settings)
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
    """Stop the background server of a home (SIGTERM, then wait for it to exit)."""
    from osmosis.cli.main import output
    from osmosis.cli.output import CLIError

    settings = _settings(home=home)
    pid = _running_pid(settings)
    if pid is None:
        _clear_stale(settings)
        output().operation(
            "server.stop",
            message=f"No server is running for {settings.home}.",
            resource=_describe(settings, pid=None, running=False),
        )
        return
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_TIMEOUT
    while _alive(pid):
        if time.monotonic() > deadline:
            raise CLIError(
                f"the server (pid {pid}) did not stop within {STOP_TIMEOUT:.0f} s",
                code="PLATFORM_ERROR",
                details={"pid": pid},
                hint=f"kill -9 {pid}",
            )
        time.sleep(0.1)
    _clear_stale(settings)
    output().operation(
        "server.stop",
        message=f"Stopped the server (pid {pid}).",
        resource=_describe(settings, pid=pid, running=False),
    )


@app.command("status")
def status(home: Path | None = HomeOption) -> None:
    """Show whether a server is running for a home, with its pid and URL."""
    from osmosis.cli.main import output

    settings = _settings(home=home)
    pid = _running_pid(settings)
    output().detail(_describe(settings, pid=pid, running=pid is not None), title="Platform server")


# -- process bookkeeping -------------------------------------------------------------------
def _describe(settings: Settings, *, pid: int | None, running: bool) -> dict[str, Any]:
    state = _read_state(settings)
    return {
        "running": running,
        "pid": pid,
        "url": state.get("url", settings.url) if running else None,
        "home": str(settings.home),
        "log_file": str(settings.log_file),
    }


def _read_state(settings: Settings) -> dict[str, Any]:
    import json

    try:
        data = json.loads(settings.state_file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _alive(pid: int) -> bool:
    """Whether `pid` runs; a zombie (exited, not yet reaped by its parent) counts as gone."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rpartition(")")[2].split()[0] != "Z"


def _running_pid(settings: Settings) -> int | None:
    """The pid in the pid file if that process is alive and is an osmosis process."""
    try:
        pid = int(settings.pid_file.read_text(encoding="utf-8").split()[0])
    except (OSError, ValueError, IndexError):
        return None
    if not _alive(pid):
        return None
    # A pid recycled by an unrelated program after a crash must not be signalled.
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return pid
    return pid if b"osmosis" in cmdline else None


def _clear_stale(settings: Settings) -> None:
    settings.pid_file.unlink(missing_ok=True)
    settings.state_file.unlink(missing_ok=True)


def _port_answers(settings: Settings) -> bool:
    import socket

    host = "127.0.0.1" if settings.host in {"0.0.0.0", ""} else settings.host
    try:
        with socket.create_connection((host, settings.port), timeout=0.5):
            return True
    except OSError:
        return False


def _spawn(settings: Settings) -> int:
    """Start `osmosis server start` in a new session, and wait until it answers health."""
    from osmosis.cli.output import CLIError

    settings.home.mkdir(parents=True, exist_ok=True)
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
    ]
    with open(settings.log_file, "ab") as log:
        child = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # survives the terminal that started it, and its Ctrl-C
        )
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if child.poll() is not None:
            raise CLIError(
                f"the server exited during start-up (exit code {child.returncode})",
                code="PLATFORM_ERROR",
                details={"log_file": str(settings.log_file), "log_tail": _tail(settings.log_file)},
                hint=f"see {settings.log_file}",
            )
        if _read_state(settings).get("pid") == child.pid and _healthy(settings.url):
            return child.pid
        time.sleep(0.1)
    child.terminate()
    raise CLIError(
        f"the server did not answer at {settings.url} within {START_TIMEOUT:.0f} s",
        code="PLATFORM_ERROR",
        details={"log_file": str(settings.log_file)},
        hint=f"see {settings.log_file}",
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
