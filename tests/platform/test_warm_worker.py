"""A warm platform (issue 30.3): a worker process started ahead of the next claim (`run_worker
--warm`, its engine imported) takes the next run, and another spare is started behind it. Real
server processes, real workers, killed for real."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from osmosis.testing import FakeModelServer
from tests.e2e.workspace import row
from tests.platform.eval_world import (
    Repo,
    Server,
    finished,
    gone_within,
    make_repo,
    pids_of,
    recorded_at_least,
    submit,
    upload_dataset,
)

ROWS = 4


@pytest.fixture(scope="module")
def fake_model() -> Iterator[FakeModelServer]:
    with FakeModelServer() as server:
        yield server


def spares(home: Path) -> list[int]:
    """The live spare workers of the server on `home`."""
    found = []
    for pid in pids_of("osmosis.platform.worker.run_worker --warm"):
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"OSMOSIS_HOME={home}".encode() in environ:
            found.append(pid)
    return found


def a_spare(home: Path, *, other_than: int | None = None, timeout: float = 60) -> int:
    deadline = time.monotonic() + timeout
    while not (found := [pid for pid in spares(home) if pid != other_than]):
        assert time.monotonic() < deadline, "no spare worker was started"
        time.sleep(0.05)
    [pid] = found
    return pid


def worker_log(server: Server, run_id: str) -> str:
    return (server.home / "logs" / "workers" / f"{run_id}.log").read_text()


def slow_repo(root: Path) -> Repo:
    rows = [row("pass", a, 7, sleep=0.3) for a in range(2, 2 + ROWS)]
    return make_repo(root, rows, limit=ROWS, batch_size=1, env={"MAX_CONCURRENT": "1"})


@pytest.mark.slow
def test_each_run_goes_to_a_spare_started_before_it_and_a_new_spare_follows(tmp_path, fake_model):
    server = Server.start(tmp_path / "platform", fake_model)
    try:
        repo = slow_repo(tmp_path / "ws")
        upload_dataset(server, repo)
        with server.client() as client:
            seen, runs = [], []
            for _ in range(2):
                spare = a_spare(server.home, other_than=seen[-1] if seen else None)
                created = submit(client, repo)
                recorded_at_least(client, created.id, 1)
                # The spare took it: its command line now names the run, as `ps` shows it.
                assert pids_of(f"worker.run_worker {created.id}") == [spare]
                detail = finished(client, created.id)
                assert detail.eval_run.status == "finished"
                assert detail.summary.progress.completed == ROWS
                log = worker_log(server, created.id)
                assert log.startswith(f"warm worker {spare} (ready since "), log
                assert f"took eval run {created.id} (claim 1)" in log.splitlines()[0]
                seen.append(spare)
                runs.append(created.id)
            assert seen[0] != seen[1]  # a worker process of its own for each run
            assert gone_within(seen[0], seconds=10) and gone_within(seen[1], seconds=10)
            # Each log holds its own run's worker only.
            assert [worker_log(server, run).count("warm worker ") for run in runs] == [1, 1]
    finally:
        server.stop()


@pytest.mark.slow
def test_a_killed_spare_is_replaced_and_the_next_run_is_not_lost(tmp_path, fake_model):
    server = Server.start(tmp_path / "platform", fake_model)
    try:
        repo = slow_repo(tmp_path / "ws")
        upload_dataset(server, repo)
        killed = a_spare(server.home)
        os.kill(killed, signal.SIGKILL)
        assert gone_within(killed, seconds=10)
        replacement = a_spare(server.home, other_than=killed)
        with server.client() as client:
            created = submit(client, repo)
            detail = finished(client, created.id)
        assert detail.eval_run.status == "finished"
        assert detail.summary.progress.completed == ROWS
        assert worker_log(server, created.id).startswith(f"warm worker {replacement} ")
        said = (server.home / "server.log").read_text()
        assert f"the warm spare worker {killed} ended (killed by SIGKILL" in said
    finally:
        server.stop()


@pytest.mark.slow
def test_no_worker_outlives_the_server_stopped_or_killed(tmp_path, fake_model):
    server = Server.start(tmp_path / "platform", fake_model)
    repo = slow_repo(tmp_path / "ws")
    upload_dataset(server, repo)
    spare = a_spare(server.home)
    with server.client() as client:
        created = submit(client, repo)
        recorded_at_least(client, created.id, 1)
    next_spare = a_spare(server.home, other_than=spare)
    server.stop()
    assert gone_within(spare, seconds=15), "the run's worker outlived `server stop`"
    assert gone_within(next_spare, seconds=15), "the spare outlived `server stop`"
    assert not pids_of(f"worker.run_worker {created.id}") and not spares(server.home)

    # Killed outright, the server takes its spare with it (the parent-death signal).
    server.launch()
    try:
        spare = a_spare(server.home)
        server.kill()
        assert gone_within(spare, seconds=15), "the spare outlived a killed server"
        workers = pids_of(f"worker.run_worker {created.id}")  # resumed at the start, maybe
        assert all(gone_within(pid, seconds=15) for pid in workers)
    finally:
        server.stop()


@pytest.mark.slow
def test_with_the_warm_worker_off_each_run_starts_its_own_worker(tmp_path, fake_model):
    server = Server.start(tmp_path / "platform", fake_model, OSMOSIS_WORKER_WARM="0")
    try:
        repo = slow_repo(tmp_path / "ws")
        upload_dataset(server, repo)
        with server.client() as client:
            created = submit(client, repo)
            recorded_at_least(client, created.id, 1)
            assert not spares(server.home)
            detail = finished(client, created.id)
        assert detail.eval_run.status == "finished"
        assert "warm worker" not in worker_log(server, created.id)
        assert not spares(server.home)
    finally:
        server.stop()
