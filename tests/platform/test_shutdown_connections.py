"""A platform that stops leaves no database session behind, even when a query of its scheduler
was still running as it stopped (the CI flake: an idle psycopg connection of an earlier test,
collected unclosed during a later one)."""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Callable

import psycopg
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import make_url

from osmosis.platform import create_app
from tests.platform.databases import Databases


def within(seconds: float, check: Callable[[], bool]) -> bool:
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


@pytest.mark.databases("postgresql")
def test_a_platform_stopped_mid_query_closes_the_connection_that_query_gives_back(
    tmp_path, databases: Databases
):
    settings = databases.settings(tmp_path / "home")
    app = create_app(settings)
    assert settings.database_url is not None
    libpq = make_url(settings.database_url).set(drivername="postgresql")
    conninfo = libpq.render_as_string(hide_password=False)
    # Off while the platform stops: the collector would close what it leaves open, by chance.
    gc.disable()
    try:
        with (
            psycopg.connect(conninfo) as blocker,
            psycopg.connect(conninfo, autocommit=True) as watcher,
        ):
            ours = [blocker.info.backend_pid, watcher.info.backend_pid]

            def sessions(where: str = "true") -> int:
                row = watcher.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                    f"AND backend_type = 'client backend' AND pid <> ALL(%s) AND {where}",
                    (ours,),
                ).fetchone()
                return int(row[0]) if row else 0

            # The scheduler's first query (registering this process) waits on this lock.
            blocker.execute("LOCK TABLE platform_processes IN ACCESS EXCLUSIVE MODE")
            listening = "query LIKE 'LISTEN%%'"  # the notify listener's session
            with TestClient(app):
                try:
                    assert within(30, lambda: sessions("wait_event_type = 'Lock'") == 1)
                    assert within(30, lambda: sessions(listening) == 1)
                except BaseException:
                    blocker.commit()  # or the shutdown would wait for the query forever
                    raise

                def release_once_stopping() -> None:
                    # The listener closes first as the platform stops; the query finishes
                    # after that, while the rest of the shutdown goes on.
                    within(30, lambda: sessions(listening) == 0)
                    time.sleep(0.5)
                    blocker.commit()

                release = threading.Thread(target=release_once_stopping)
                release.start()
            release.join()
            assert within(10, lambda: sessions() == 0), "a stopped platform left a session open"
    finally:
        gc.enable()
        app.state.engine.dispose()
