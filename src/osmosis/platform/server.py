"""Run the platform under uvicorn, announcing itself through a pid file and a state file.

serve(Settings.from_env())  # blocks until SIGINT/SIGTERM
"""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
from datetime import UTC, datetime
from types import FrameType
from typing import Any

from osmosis.platform.settings import Settings

logger = logging.getLogger("osmosis.platform")


def serve(settings: Settings) -> None:
    """Build the app and serve it in the foreground; clean up the pid file on the way out."""
    import uvicorn

    from osmosis.platform.app import create_app

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    app = create_app(settings)
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level="info",
        # Our handler logs unexpected errors; uvicorn's access log has no secrets (no headers).
        server_header=False,
        timeout_graceful_shutdown=10,
    )
    server = uvicorn.Server(config)
    _write_state(settings)
    # uvicorn shuts down gracefully on SIGTERM, then re-raises the signal to the handler it
    # found; the default one would kill us before the pid file is removed, so exit cleanly.
    previous = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        server.run()
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
        _clear_state(settings)


def _exit_on_sigterm(_signum: int, _frame: FrameType | None) -> None:
    raise SystemExit(0)


def _write_state(settings: Settings) -> None:
    state: dict[str, Any] = {
        "pid": os.getpid(),
        "url": settings.url,
        "home": str(settings.home),
        "host": settings.host,
        "port": settings.port,
        "started_at": datetime.now(UTC).isoformat(),
    }
    settings.pid_file.write_text(f"{os.getpid()}\n", encoding="utf-8")
    settings.state_file.write_text(json.dumps(state, indent=2) + "\n", encoding="utf-8")


def _clear_state(settings: Settings) -> None:
    # Only the process named in the pid file removes it: a second server that failed to bind
    # must not erase the record of the one that is running.
    try:
        if int(settings.pid_file.read_text(encoding="utf-8").split()[0]) != os.getpid():
            return
    except (OSError, ValueError, IndexError):
        return
    settings.pid_file.unlink(missing_ok=True)
    settings.state_file.unlink(missing_ok=True)
