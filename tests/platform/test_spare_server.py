"""A warm platform's spare rollout server (issue 30.3, `OSMOSIS_SPARE_SERVER`): once a run has
ended, the next warm worker starts that run's sandboxed server ahead, and the next claim adopts
it only when its launch is exactly the same. Real server, real workers, real bwrap, real git."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import select

from osmosis.platform.core.db import make_engine, make_session_factory
from osmosis.platform.core.db.models import Workspace
from osmosis.platform.services.workspaces import set_sandbox_network
from osmosis.testing import FakeModelServer
from osmosis.workspace import canonical_identity
from tests.e2e.workspace import row
from tests.platform.eval_world import (
    Repo,
    Server,
    all_logs,
    finished,
    gone_within,
    make_repo,
    pids_of,
    submit,
    upload_dataset,
)
from tests.platform.test_warm_worker import a_spare, worker_log

pytestmark = pytest.mark.slow

ROWS = 4


@pytest.fixture(scope="module")
def fake_model() -> Iterator[FakeModelServer]:
    with FakeModelServer() as server:
        yield server


def repo_in(root: Path) -> Repo:
    rows = [row("pass", a, 7) for a in range(2, 2 + ROWS)]
    return make_repo(root, rows, limit=ROWS, secrets=["API_TOKEN"])


def spare_ready(home: Path, worker: int, *, timeout: float = 60) -> None:
    """Wait until the spare worker `worker` holds a started server (its checkout is there, and
    a bwrap it started runs)."""
    deadline = time.monotonic() + timeout
    while not (
        (home / "checkouts" / f".spare-{worker}").is_dir()
        and any(_parent(pid) == worker for pid in pids_of("bwrap"))
    ):
        assert time.monotonic() < deadline, "the spare worker started no server"
        time.sleep(0.05)
    time.sleep(0.5)  # and it answers


def _parent(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def set_network(server: Server, repo: Repo, network: str) -> None:
    engine = make_engine(f"sqlite:///{server.home / 'platform.db'}")
    try:
        with make_session_factory(engine)() as db:
            identity = canonical_identity(repo.git)
            workspace = db.scalar(select(Workspace).where(Workspace.identity == identity))
            assert workspace is not None
            set_sandbox_network(db, workspace=workspace, network=network)
            db.commit()
    finally:
        engine.dispose()


def cgroups_of(pid: int) -> list[Path]:
    """The sandbox's own cgroup directories that hold `pid` (v1: one per controller)."""
    found = []
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "osmosis-sandbox-spare-" in path:
            root = Path("/sys/fs/cgroup") / controllers if controllers else Path("/sys/fs/cgroup")
            found.append(root / path.lstrip("/"))
    return found


def outcome(client, run: str) -> tuple[object, ...]:  # type: ignore[no-untyped-def]
    """What a run's results say, for comparing a run with a spare and one without."""
    detail = finished(client, run)
    summary = detail.summary
    return (
        detail.eval_run.status,
        summary.progress.completed,
        summary.pass_rate,
        summary.avg_reward,
        summary.passed,
        summary.failed,
    )


def log_of(client, run: str) -> str:  # type: ignore[no-untyped-def]
    return "\n".join(all_logs(client, run))


def test_the_same_commit_again_adopts_the_spare_and_anything_else_says_why(tmp_path, fake_model):
    server = Server.start(tmp_path / "platform", fake_model)
    try:
        repo = repo_in(tmp_path / "ws")
        upload_dataset(server, repo)
        with server.client() as client:
            client.secrets.set(git=repo.git, name="API_TOKEN", value="one", scope="workspace")
            first = submit(client, repo)
            baseline = outcome(client, first.id)
            assert baseline == ("finished", ROWS, 1.0, 1.0, ROWS, 0)
            assert "the spare" not in log_of(client, first.id)

            # The same commit again: the spare started after the first run adopts.
            spare_ready(server.home, a_spare(server.home))
            again = submit(client, repo)
            assert outcome(client, again.id) == baseline
            said = log_of(client, again.id)
            assert "adopted the spare started" in said, said
            assert "starting rollout server" in said  # the engine's own line, unchanged

            # A changed secret: the server's environment differs, by name only.
            spare_ready(server.home, a_spare(server.home))
            client.secrets.set(
                git=repo.git, name="API_TOKEN", value="second-token-value", scope="workspace"
            )
            changed = submit(client, repo)
            assert outcome(client, changed.id) == baseline
            said = log_of(client, changed.id)
            assert "the spare was not adopted: it differs in environment (API_TOKEN)" in said
            assert "adopted the spare" not in said and "second-token-value" not in said

            # Another commit: not even checked out twice.
            spare_ready(server.home, a_spare(server.home))
            repo.push("another commit")
            other = submit(client, repo)
            assert outcome(client, other.id) == baseline
            assert "the spare was not adopted: it differs in commit" in log_of(client, other.id)

            # The workspace's sandbox network changed: another sandbox policy.
            spare_ready(server.home, a_spare(server.home))
            set_network(server, repo, "full")
            wider = submit(client, repo)
            assert outcome(client, wider.id) == baseline
            said = log_of(client, wider.id)
            assert "the spare was not adopted: it differs in sandbox policy and limits" in said
        # Nothing of an adopted or a killed spare is left but the next one's.
        spare = a_spare(server.home)
        spare_ready(server.home, spare)
        assert {p.name for p in (server.home / "checkouts").glob(".spare-*")} == {f".spare-{spare}"}
        slirps = [pid for pid in pids_of("slirp4netns") if _parent(pid) == spare]
        assert slirps  # the last spare mirrors the run with the full network
    finally:
        server.stop()
    # Stopped, the server killed its spare and removed what it held.
    assert all(gone_within(pid, seconds=10) for pid in slirps)
    assert not [*server.home.glob("checkouts/.spare-*"), *server.home.glob("runs/.spare-*")]


def test_a_killed_spare_worker_leaves_no_server_and_the_next_one_sweeps_its_files(
    tmp_path, fake_model
):
    server = Server.start(tmp_path / "platform", fake_model)
    try:
        repo = repo_in(tmp_path / "ws")
        upload_dataset(server, repo)
        with server.client() as client:
            client.secrets.set(git=repo.git, name="API_TOKEN", value="one", scope="workspace")
            assert outcome(client, submit(client, repo).id)[0] == "finished"
        killed = a_spare(server.home)
        spare_ready(server.home, killed)
        sandboxes = [pid for pid in pids_of("bwrap") if _parent(pid) == killed]
        groups = [group for pid in sandboxes for group in cgroups_of(pid)]
        assert groups and all(group.is_dir() for group in groups)
        os.kill(killed, signal.SIGKILL)
        assert all(gone_within(pid, seconds=10) for pid in [killed, *sandboxes])
        replacement = a_spare(server.home, other_than=killed)
        spare_ready(server.home, replacement)  # its own start swept what the killed one held
        assert not (server.home / "checkouts" / f".spare-{killed}").exists()
        assert not (server.home / "runs" / f".spare-{killed}").exists()
        assert not [group for group in groups if group.exists()]
        with server.client() as client:
            run = submit(client, repo)
            assert outcome(client, run.id)[0] == "finished"
            assert "adopted the spare started" in log_of(client, run.id)
    finally:
        server.stop()
    assert not [*server.home.glob("checkouts/.spare-*"), *server.home.glob("runs/.spare-*")]


# A rollout whose environment never finishes building: its in-tree backend sleeps.
STALLING_PYPROJECT = """\
[project]
name = "scripted"
version = "0.1"
requires-python = ">=3.11"
dynamic = ["dependencies"]

[build-system]
requires = []
build-backend = "backend"
backend-path = ["."]
"""
STALLING_BACKEND = """\
import time


def _stall(*args, **kwargs):
    time.sleep(600)


get_requires_for_build_wheel = lambda config_settings=None: []
prepare_metadata_for_build_wheel = _stall
build_wheel = _stall
"""


def building(client, run: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + 120
    while "building in the sandbox" not in log_of(client, run):
        assert time.monotonic() < deadline, log_of(client, run)
        time.sleep(0.2)


def waits_on_a_build_lock(pid: int, envs: Path, *, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            held = [os.readlink(fd) for fd in Path(f"/proc/{pid}/fd").iterdir()]
        except OSError:
            held = []
        if any(link.startswith(str(envs)) and link.endswith(".lock") for link in held):
            return
        assert time.monotonic() < deadline, f"spare {pid} never waited for the build"
        time.sleep(0.1)


def test_a_spare_never_builds_an_environment_and_stops_waiting_for_one_when_a_claim_comes(
    tmp_path, fake_model
):
    """A build is the run's, shown in its log: the spare mirroring a run whose build was
    stopped builds nothing, and one waiting for a run's build takes the next claim at once."""
    server = Server.start(tmp_path / "platform", fake_model, OSMOSIS_RUNS_PER_USER="2")
    envs = server.home / "envs"
    try:
        stuck, quick = repo_in(tmp_path / "stuck"), repo_in(tmp_path / "quick")
        rollout = stuck.tree / "rollouts" / "scripted"
        (rollout / "pyproject.toml").write_text(STALLING_PYPROJECT)
        (rollout / "backend.py").write_text(STALLING_BACKEND)
        stuck.push("a build that never ends")
        with server.client() as client:
            for repo in (stuck, quick):
                upload_dataset(server, repo)
                client.secrets.set(git=repo.git, name="API_TOKEN", value="one", scope="workspace")

            # Stopped while it builds: the spare that mirrors it builds nothing in its place.
            first = submit(client, stuck)
            building(client, first.id)
            client.runs.stop(first.id)
            assert finished(client, first.id).eval_run.status == "stopped"
            spare_log = server.home / "logs" / "workers" / "spare.log"
            deadline = time.monotonic() + 60
            while "is not built" not in (spare_log.read_text() if spare_log.exists() else ""):
                assert time.monotonic() < deadline, "the spare said nothing of the build"
                time.sleep(0.2)
            said = spare_log.read_text()
            assert "no spare rollout server: rollout 'scripted': reusing its environment" in said
            assert "is not built (a run of this rollout builds it, in its own log)" in said
            assert not list(envs.glob(".build-*"))  # and nothing half-built is there

            # Building again: the next spare mirrors it and waits for its build, until the
            # quick run comes, which it takes at once instead of after the build.
            again = submit(client, stuck)
            building(client, again.id)
            waiting = a_spare(server.home)
            waits_on_a_build_lock(waiting, envs)
            started = time.monotonic()
            other = submit(client, quick)
            assert finished(client, other.id).eval_run.status == "finished"
            assert time.monotonic() - started < 60  # the build would take 600 s
            assert f"warm worker {waiting} " in worker_log(server, other.id)
            said = spare_log.read_text()
            assert "no spare rollout server: rollout 'scripted': waiting for another build" in said
            assert client.runs.get(again.id).eval_run.status == "running"
            client.runs.stop(again.id)
            assert finished(client, again.id).eval_run.status == "stopped"
        assert not list(envs.glob(".build-*"))
    finally:
        server.stop()
