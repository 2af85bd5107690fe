"""Crashes resume (issue 25.8): a run worker killed by a signal (SIGKILL, as the OOM killer
sends) is resumed from the run's journal, every attempt recorded once, up to
`OSMOSIS_RUN_CRASH_RESUMES` times; the next such death fails the run, naming the signal. A real
server process and real worker processes, killed for real, on SQLite and on PostgreSQL."""

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
    Server,
    all_logs,
    finished,
    gone_within,
    make_repo,
    pids_of,
    read_jsonl,
    recorded_at_least,
    run_dir,
    submit,
    upload_dataset,
)

pytestmark = pytest.mark.slow

ROWS = 30


@pytest.fixture(scope="module")
def fake_model() -> Iterator[FakeModelServer]:
    with FakeModelServer() as server:
        yield server


def _workers(run_id: str) -> list[int]:
    """The run's worker processes. A child the worker is forking (a rollout server, git) has
    the worker's command line until it execs: it is not counted."""
    found = pids_of(f"worker.run_worker {run_id}")
    return [pid for pid in found if _parent(pid) not in found]


def _parent(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def kill_worker(run_id: str, *, not_pid: int | None = None) -> int:
    """SIGKILL the run's worker process (one other than `not_pid`); returns its pid."""
    deadline = time.monotonic() + 60
    while not (workers := [p for p in _workers(run_id) if p != not_pid]):
        assert time.monotonic() < deadline, "no worker process for the run"
        time.sleep(0.05)
    [pid] = workers
    os.kill(pid, signal.SIGKILL)
    assert gone_within(pid, seconds=10)
    return pid


def test_a_killed_run_worker_is_resumed_from_the_journal_until_the_resumes_run_out(
    tmp_path, fake_model, databases
):
    server = Server.start(
        tmp_path / "platform", fake_model, databases=databases, OSMOSIS_RUN_CRASH_RESUMES="1"
    )
    try:
        rows = [row("pass", a, 7, sleep=0.3) for a in range(2, 2 + ROWS)]
        repo = make_repo(
            tmp_path / "ws", rows, limit=ROWS, batch_size=2, env={"MAX_CONCURRENT": "2"}
        )
        upload_dataset(server, repo)
        with server.client() as client:
            # Killed once mid-run: resumed, and finished with every attempt once.
            created = submit(client, repo)
            recorded_at_least(client, created.id, 6)
            killed = kill_worker(created.id)
            detail = finished(client, created.id)
            logs = "\n".join(all_logs(client, created.id))
            assert detail.eval_run.status == "finished", logs
            assert detail.eval_run.crash_resumes == 1
            assert (detail.summary.passed, detail.summary.progress.completed) == (ROWS, ROWS)
            assert "was killed by SIGKILL (signal 9" in logs
            assert "resuming the run from its journal (resume 1 of 1" in logs
            journal = read_jsonl(run_dir(server, created.id) / "events.jsonl")
            keys = sorted((e["row_index"], e["run_index"]) for e in journal)
            assert keys == [(r, 0) for r in range(ROWS)]  # no duplicates, no losses
            attempts = client.runs.attempts(created.id, limit=200)
            assert sorted((a.row_index, a.run_index) for a in attempts.attempts) == keys
            assert detail.summary.resumed_count >= 6
            workers = pids_of(f"worker.run_worker {created.id}")
            assert all(gone_within(pid, seconds=10) for pid in workers)

            # Killed again after its one resume: failed, naming the signal; what was
            # recorded is kept, once.
            again = submit(client, repo)
            before = recorded_at_least(client, again.id, 4).summary.progress.completed
            first = kill_worker(again.id)
            recorded_at_least(client, again.id, before + 2)
            assert first != killed
            kill_worker(again.id, not_pid=first)
            failed = finished(client, again.id)
            assert failed.eval_run.status == "failed"
            assert failed.eval_run.crash_resumes == 1
            error = failed.eval_run.error or ""
            assert "killed by SIGKILL (signal 9" in error, error
            assert "after 1 resume(s) from its journal (OSMOSIS_RUN_CRASH_RESUMES=1)" in error
            journal = read_jsonl(run_dir(server, again.id) / "events.jsonl")
            keys = [(e["row_index"], e["run_index"]) for e in journal]
            assert len(keys) == len(set(keys)) and len(keys) < ROWS
    finally:
        server.stop()
