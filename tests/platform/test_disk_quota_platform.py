"""Issue 25 acceptance: a rollout that writes past its disk quota on a real platform server.

The server's home is a small tmpfs (the tests run as root, as CI does) and its sandboxed
rollout servers have a disk quota of a few MB (`OSMOSIS_SANDBOX_DISK_BYTES`). User A's run
writes past it in the outbox's root, in `/tmp`, in `HOME` and through a forked child that
keeps writing after its attempt returned (`tests/integration/test_sandbox_disk.WRITER`):
each of those attempts fails `resource_limit`, the others pass, and the home's free space
comes back. Meanwhile user B's API calls and B's own run go on, without a single 5xx.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from osmosis.testing import FakeModelServer
from osmosis.vocabulary import TERMINAL_RUN_STATUSES as TERMINAL
from tests.e2e.workspace import row
from tests.integration.test_sandbox_disk import WRITER
from tests.platform.eval_world import Server, finished, make_repo, submit, upload_dataset
from tests.platform.test_hardening_ops import free_bytes, small_disk
from tests.platform.test_sandbox import attempts, logs

MB = 1024 * 1024
HOME_MB = 96
DISK_QUOTA = 6 * MB  # per rollout server; WRITER writes 16 MiB
OFFENDING = ["outbox_root", "tmp", "home", "child"]


@pytest.fixture
def fake_model() -> Iterator[FakeModelServer]:
    with FakeModelServer() as server:
        yield server


class Poller(threading.Thread):
    """User B's reads, over and over, every status code kept, until told to stop."""

    def __init__(self, server: Server, token: str, git: str) -> None:
        super().__init__(daemon=True)
        self.server, self.stop = server, threading.Event()
        self.headers = {"Authorization": f"Bearer {token}", "X-Osmosis-Git": git}
        self.statuses: list[tuple[str, int]] = []
        self.run_id: str | None = None
        self.failure: BaseException | None = None

    def run(self) -> None:
        try:
            with httpx.Client(base_url=self.server.url, headers=self.headers, timeout=30) as http:
                while not self.stop.is_set():
                    paths = ["/api/auth/whoami", "/api/datasets", "/api/eval-runs"]
                    if self.run_id is not None:
                        paths.append(f"/api/eval-runs/{self.run_id}")
                    for path in paths:
                        self.statuses.append((path, http.get(path).status_code))
                    time.sleep(0.1)
        except BaseException as error:  # a refused connection is a failure too
            self.failure = error


@pytest.mark.slow
def test_a_rollout_past_its_disk_quota_fails_resource_limit_and_another_user_goes_on(
    tmp_path, fake_model
):
    with small_disk(tmp_path / "disk", HOME_MB) as disk:
        server = Server.start(
            disk,
            fake_model,
            OSMOSIS_SANDBOX_DISK_BYTES=str(DISK_QUOTA),
            # Below the quota, as by default: the child may pass its attempt's artifact limit
            # first; its server must end then too, or its writes would be charged to the next,
            # honest attempt.
            OSMOSIS_SANDBOX_ARTIFACT_BYTES=str(4 * MB),
            OSMOSIS_SANDBOX_FILE_BYTES=str(32 * MB),  # bounds the child, whatever happens
            OSMOSIS_MIN_FREE_DISK_BYTES=str(8 * MB),  # the default (512 MiB) > this disk
            OSMOSIS_RUNS_PER_USER="2",
        )
        try:
            rows_a = [*map(row, OFFENDING), *(row("pass", a, 3) for a in range(2, 6))]
            repo_a = make_repo(tmp_path / "a", rows_a, limit=len(rows_a), main=WRITER)
            upload_dataset(server, repo_a)
            repo_b = make_repo(tmp_path / "b", [row("pass", a, 5) for a in range(2, 6)], limit=4)
            upload_dataset(server, repo_b)  # the admin makes B's workspace
            with server.client() as admin:
                bea = admin.admin.create_user(name="bea", email="bea@example.com")
                admin.workspaces.add_member(git=repo_b.git, email="bea@example.com")
            token_b = bea.token.token
            before = free_bytes(disk)

            poller = Poller(server, token_b, repo_b.git)
            lowest = before
            with server.client() as ada, server.client(token_b) as b:
                run_a = submit(ada, repo_a)
                poller.start()
                run_b = submit(b, repo_b)
                poller.run_id = run_b.id
                done_b = finished(b, run_b.id, timeout=120)
                deadline = time.monotonic() + 120
                while (detail := ada.runs.get(run_a.id)).eval_run.status not in TERMINAL:
                    assert time.monotonic() < deadline, detail.summary.progress
                    lowest = min(lowest, free_bytes(disk))
                    time.sleep(0.1)
                done_a = finished(ada, run_a.id)
            poller.stop.set()
            poller.join(timeout=60)

            said = "\n".join(logs(server, run_a.id))
            assert done_a.eval_run.status == "finished", said
            outcome = attempts(server, run_a.id)
            limits = [line for line in said.splitlines() if "resource_limit" in line]
            offending = {i for i, r in enumerate(rows_a) if r["metadata"]["kind"] != "pass"}
            assert {i: outcome[i] for i in offending} == dict.fromkeys(
                offending, ("failed", "resource_limit")
            ), (outcome, limits)
            assert {i: o for i, o in outcome.items() if i not in offending} == {
                i: ("success", None) for i in range(len(rows_a)) if i not in offending
            }, (outcome, limits)
            # Each over the quota, whichever way it wrote (the child may reach the artifact
            # limit first: it writes into its own attempt's outputs).
            assert said.count("exceeded its disk quota (6 MiB per rollout server") >= 3, said

            # B: their run finished and passed; not one of their calls answered 5xx.
            assert done_b.eval_run.status == "finished", done_b.eval_run.error
            assert done_b.summary.passed == 4
            assert poller.failure is None, poller.failure
            assert len(poller.statuses) > 20, poller.statuses
            assert [s for s in poller.statuses if s[1] >= 500] == [], poller.statuses
            assert {code for _, code in poller.statuses} == {200}, set(poller.statuses)

            # The space comes back: the home holds no more than a few MB more than before.
            after = free_bytes(disk)
            assert after > before - 4 * MB, (before / MB, lowest / MB, after / MB)
        finally:
            server.stop()
