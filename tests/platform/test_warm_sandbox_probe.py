"""A warm spare probes the sandbox before it takes a run (issue 30): the run's start uses that
answer, and only while the bwrap binary is the same file. Real server, real spare workers, a
real bwrap behind a wrapper script that notes who runs it."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from osmosis.eval.sites.sandbox.support import find_bwrap
from osmosis.testing import FakeModelServer
from tests.e2e.workspace import SCRIPTED_MAIN, row
from tests.platform.eval_world import Server, all_logs, finished, make_repo, submit, upload_dataset
from tests.platform.test_sandbox import NO_USERNS_BWRAP
from tests.platform.test_warm_worker import a_spare

pytestmark = pytest.mark.slow

ROWS = [row("pass", a, 3) for a in range(2, 6)]  # a dataset needs at least 4 rows


@pytest.fixture(scope="module")
def fake_model() -> Iterator[FakeModelServer]:
    with FakeModelServer() as server:
        yield server


def noting_bwrap(path: Path, calls: Path) -> None:
    """A bwrap that writes its caller's pid and its arguments to `calls`, then is the real
    one (exec: the same process, its descriptors and cgroup)."""
    real = find_bwrap()
    assert real is not None, "the tests need a bwrap binary"
    path.write_text(f'#!/bin/sh\necho "$PPID $*" >> {calls}\nexec {real} "$@"\n')
    path.chmod(0o755)


def probes_by(calls: Path, pid: int) -> int:
    """How many probes `pid` ran: each starts with `bwrap --version`."""
    if not calls.exists():
        return 0
    return calls.read_text().splitlines().count(f"{pid} --version")


def probed(calls: Path, pid: int, *, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while probes_by(calls, pid) == 0:
        assert time.monotonic() < deadline, f"the spare {pid} did not probe the sandbox"
        time.sleep(0.05)


def test_a_spare_probes_ahead_and_reprobes_a_replaced_bwrap(tmp_path, fake_model):
    """The spare probes once before its run, and its run starts the sandbox without probing
    again. Once the binary is replaced after the probe (here by one that cannot create
    namespaces), the run is not started on the old answer: it probes again and fails saying
    the sandbox is unavailable, and why."""
    bwrap, calls = tmp_path / "bwrap", tmp_path / "calls.txt"
    noting_bwrap(bwrap, calls)
    server = Server.start(tmp_path / "platform", fake_model, OSMOSIS_SANDBOX_BWRAP=str(bwrap))
    try:
        repo = make_repo(tmp_path / "ws", ROWS, limit=1, main=SCRIPTED_MAIN)
        upload_dataset(server, repo)
        with server.client() as client:
            spare = a_spare(server.home)
            probed(calls, spare)
            done = finished(client, submit(client, repo).id)
            assert done.eval_run.status == "finished", done.eval_run.error
            assert probes_by(calls, spare) == 1
            # Its sandbox was started with the same binary, by the same process.
            launches = [
                line
                for line in calls.read_text().splitlines()
                if line.startswith(f"{spare} ") and "--listen-fd" in line
            ]
            assert len(launches) == 1, calls.read_text()

            spare = a_spare(server.home, other_than=spare)
            probed(calls, spare)
            replaced = tmp_path / "bwrap.new"
            replaced.write_text(NO_USERNS_BWRAP)
            replaced.chmod(0o755)
            os.replace(replaced, bwrap)
            created = submit(client, repo)
            failed = finished(client, created.id)
            error = failed.eval_run.error or ""
            assert failed.eval_run.status == "failed", error
            assert "the rollout sandbox is unavailable" in error, error
            assert "non-privileged user namespaces" in error, error
            assert "the rollout sandbox is unavailable" in "\n".join(all_logs(client, created.id))
    finally:
        server.stop()
