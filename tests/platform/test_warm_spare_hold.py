"""The next warm spare waits for the run the last one took (issue 30: submit → first attempt
recorded): its imports (~1 s of CPU on 2 cores) no longer compete with that run's start, and
it starts once the run is dispatching (the worker says so on a pipe). A real server process,
real workers, a rollout server that takes a few seconds to start."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from osmosis.testing import FakeModelServer
from tests.e2e.workspace import SCRIPTED_MAIN, row
from tests.platform.eval_world import (
    Server,
    finished,
    make_repo,
    pids_of,
    recorded_at_least,
    submit,
    upload_dataset,
)
from tests.platform.test_warm_worker import a_spare, spares

START_S = 3.0  # the rollout server's start: well inside the scheduler's 5 s hold
SLOW_START = f"import time\ntime.sleep({START_S})\n" + SCRIPTED_MAIN


@pytest.fixture(scope="module")
def fake_model() -> Iterator[FakeModelServer]:
    with FakeModelServer() as server:
        yield server


@pytest.mark.slow
def test_the_next_spare_starts_once_the_run_is_dispatching_not_while_it_starts(
    tmp_path, fake_model
):
    server = Server.start(tmp_path / "platform", fake_model)
    try:
        rows = [row("pass", a, 7) for a in range(2, 6)]  # the dataset minimum
        repo = make_repo(tmp_path / "ws", rows, limit=1, main=SLOW_START)
        upload_dataset(server, repo)
        spare = a_spare(server.home)
        with server.client() as client:
            created = submit(client, repo)
            deadline = time.monotonic() + 60
            while pids_of(f"worker.run_worker {created.id}") != [spare]:
                assert time.monotonic() < deadline, "the spare never took the run"
                time.sleep(0.02)
            # The run's rollout server is starting: no other spare meanwhile (before this
            # change one started at the hand-off, within milliseconds).
            watch_until = time.monotonic() + START_S / 2
            while time.monotonic() < watch_until:
                assert spares(server.home) == [], "a spare started while the run started"
                time.sleep(0.02)
            recorded_at_least(client, created.id, 1)
            follower = a_spare(server.home, other_than=spare)
            detail = finished(client, created.id)
        assert detail.eval_run.status == "finished"
        assert follower != spare
    finally:
        server.stop()
