"""Issue 13's server-operation findings, each reproduced against a real server process on
loopback: load that locked the server up, two servers on one home, a full disk that looped,
and a home that every local user could read."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import stat
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import httpx
import pytest

from osmosis.testing import FakeModelServer
from tests.e2e.conftest import model_env
from tests.e2e.workspace import row
from tests.platform.conftest import CLI, clean_env, free_port, osmosis, osmosis_json
from tests.platform.eval_world import (
    Repo,
    Server,
    all_logs,
    finished,
    make_repo,
    pids_of,
    submit,
    upload_dataset,
)

pytestmark = pytest.mark.slow

FOUR_PASSING = [row("pass", a, 3) for a in range(2, 6)]  # datasets need at least 4 rows
MB = 1024 * 1024
T = TypeVar("T")


@pytest.fixture(scope="module")
def fake_model() -> Iterator[FakeModelServer]:
    with FakeModelServer() as server:
        yield server


# -- 13.2: load queues instead of locking up --------------------------------------------------
@dataclass
class Load:
    statuses: list[int] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)  # transport errors, timeouts
    health_during_load: int = 0


async def _clients(server: Server, repo: Repo, *, clients: int, each: int) -> Load:
    """`clients` connections, each making `each` API requests back to back, while a probe asks
    for health every 0.2 s; the probe may wait 20 s (the lock-up made it wait 30)."""
    load = Load()
    paths = ["/api/datasets", "/api/datasets/scripted", "/api/eval-runs", "/api/auth/whoami"]
    headers = {"Authorization": f"Bearer {server.admin_token}", "X-Osmosis-Git": repo.git}
    running = True

    async def client(index: int) -> None:
        async with httpx.AsyncClient(base_url=server.url, headers=headers, timeout=60) as http:
            for step in range(each):
                try:
                    response = await http.get(paths[(index + step) % len(paths)])
                except httpx.HTTPError as error:
                    load.failures.append(f"{type(error).__name__}: {error}")
                    continue
                load.statuses.append(response.status_code)

    async def probe() -> None:
        async with httpx.AsyncClient(base_url=server.url, timeout=20) as http:
            while running:
                try:
                    response = await http.get("/api/health")
                except httpx.HTTPError as error:
                    load.failures.append(f"health: {type(error).__name__}: {error}")
                    return
                if running and response.status_code == 200:
                    load.health_during_load += 1
                await asyncio.sleep(0.2)

    prober = asyncio.create_task(probe())
    everyone = asyncio.gather(*(client(index) for index in range(clients)))
    await asyncio.wait({prober, everyone}, return_when=asyncio.FIRST_COMPLETED)
    if prober.done():  # health went unanswered: the server is locked up, stop waiting
        everyone.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await everyone
    running = False
    await prober
    return load


def test_fifty_concurrent_clients_are_queued_without_errors_and_health_answers(tmp_path):
    root = tmp_path
    env = clean_env(OSMOSIS_HOME=str(root / "home"), OSMOSIS_CONFIG_DIR=str(root / "config"))
    server = Server(home=root / "home", env=env)
    server.launch()
    try:
        repo = make_repo(root / "ws", FOUR_PASSING)
        upload_dataset(server, repo)
        load = asyncio.run(_clients(server, repo, clients=50, each=10))
    finally:
        server.stop()
    assert load.failures == [], load.failures[:5]
    server_errors = [status for status in load.statuses if status >= 500]
    assert server_errors == [], f"{len(server_errors)} of {len(load.statuses)} answers were 5xx"
    assert set(load.statuses) == {200} and len(load.statuses) == 500
    assert load.health_during_load >= 1


# -- 13.4: one server per home ------------------------------------------------------------------
def _start(env: dict[str, str], port: int, *, detach: bool = True) -> subprocess.Popen[str]:
    args = ["--json", "server", "start", *(["--detach"] if detach else []), "--port", str(port)]
    return subprocess.Popen(
        [*CLI, *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def test_two_starts_at_the_same_moment_leave_one_server_and_the_other_names_it(tmp_path):
    home = tmp_path / "home"
    env = clean_env(OSMOSIS_HOME=str(home), OSMOSIS_CONFIG_DIR=str(tmp_path / "config"))
    ports = [free_port(), free_port()]
    starts = [_start(env, port) for port in ports]
    try:
        results = [(start.wait(timeout=90), *start.communicate()) for start in starts]
        codes = sorted(code for code, _, _ in results)
        assert codes == [0, 1], results
        (winner,) = [json.loads(out) for code, out, _ in results if code == 0]
        (refused,) = [json.loads(err)["error"] for code, _, err in results if code == 1]
        pid, url = winner["resource"]["pid"], winner["resource"]["url"]
        port = int(url.rsplit(":", 1)[1])
        assert refused["code"] == "CONFLICT"
        assert f"pid {pid}, port {port}" in refused["message"], refused
        assert (refused["details"]["pid"], refused["details"]["port"]) == (pid, port)
        # Exactly one server process serves the home; the other port never answered.
        assert pids_of(f"--home {home}") == [pid]
        loser = next(p for p in ports if p != port)
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"http://127.0.0.1:{loser}/api/health")

        # The lock decides, not the pid file: without it a foreground start is refused too,
        # before it touches the home (no migration, no second scheduler).
        (home / "server.pid").unlink()
        (home / "server.json").unlink()
        again = _start(env, free_port(), detach=False)
        code, _, err = again.wait(timeout=90), *again.communicate()
        assert code == 1, err
        error = json.loads(err)["error"]
        assert error["code"] == "CONFLICT" and f"pid {pid}, port {port}" in error["message"]
        assert httpx.get(f"{url}/api/health").status_code == 200
        status = osmosis_json("server", "status", env=env)["data"]
        assert (status["running"], status["pid"]) == (True, pid)  # found through the lock
    finally:
        for start in starts:
            if start.poll() is None:
                start.kill()
        # Every server of this home, whether or not the pid file still names it.
        for pid in pids_of(f"--home {home}"):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)


# -- 13.5: a full disk is a clear failure, not a silent loop ------------------------------------
@contextlib.contextmanager
def small_disk(path: Path, size_mb: int) -> Iterator[Path]:
    """A real file system of `size_mb` MB at `path` (tmpfs; the tests run as root)."""
    path.mkdir(parents=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_mb}m,mode=0700", "tmpfs", str(path)],
        capture_output=True,
        text=True,
    )
    assert mounted.returncode == 0, f"these tests mount a tmpfs (needs root): {mounted.stderr}"
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def free_bytes(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def fill(disk: Path, *, leave: int) -> Path:
    """Take all but `leave` bytes of `disk` (all of it when it cannot be that exact)."""
    filler = disk / "filler"
    # ENOSPC ends it when asked to leave nothing.
    with filler.open("wb") as handle, contextlib.suppress(OSError):
        while (room := free_bytes(disk) - leave) > 0:
            handle.write(b"\0" * min(room, 4 * MB))
            handle.flush()
    return filler


def workers_of(run_id: str) -> list[int]:
    return pids_of(f"osmosis.platform.worker.run_worker {run_id}")


def server_log(server: Server) -> str:
    return (server.home / "server.log").read_text()


def eventually(check: Callable[[], T], *, what: str, timeout: float = 60) -> T:
    """`check()` once it is truthy; the waits are for start-up, not for speed."""
    deadline = time.monotonic() + timeout
    while not (value := check()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)
    return value


def test_a_run_waits_visibly_for_disk_space_and_starts_once_it_is_freed(tmp_path, fake_model):
    with small_disk(tmp_path / "disk", 64) as disk:
        server = Server.start(disk, fake_model, OSMOSIS_MIN_FREE_DISK_BYTES=str(24 * MB))
        try:
            repo = make_repo(tmp_path / "ws", FOUR_PASSING)
            upload_dataset(server, repo)
            health = httpx.get(f"{server.url}/api/health").json()
            assert health["low_disk"] is False and health["disk"]["free_bytes"] > 24 * MB

            filler = fill(disk, leave=8 * MB)
            health = httpx.get(f"{server.url}/api/health").json()
            assert health["low_disk"] is True
            assert health["disk"]["free_bytes"] < health["disk"]["min_free_bytes"] == 24 * MB
            status = json.loads(osmosis("--json", "server", "status", env=server.env).stdout)
            assert status["data"]["low_disk"] is True
            assert (
                "MiB free, below the 24.0 MiB of OSMOSIS_MIN_FREE_DISK_BYTES"
                in (status["data"]["disk_warning"])
            )

            with server.client() as client:
                created = submit(client, repo)
                eventually(
                    lambda: any(
                        "waiting for disk space" in line for line in all_logs(client, created.id)
                    ),
                    what="the run's log to say it waits for disk space",
                )
                time.sleep(3)  # six scheduler rounds
                assert f"for eval run {created.id}" not in server_log(server)  # no worker
                assert workers_of(created.id) == []
                assert client.runs.get(created.id).eval_run.status == "pending"
                assert "MiB free, below the 24.0 MiB" in server_log(server)

                filler.unlink()
                detail = finished(client, created.id)
                assert detail.eval_run.status == "finished", list(all_logs(client, created.id))
                assert httpx.get(f"{server.url}/api/health").json()["low_disk"] is False
        finally:
            server.stop()


def test_a_database_that_cannot_record_backs_the_scheduler_off_instead_of_respawning(
    tmp_path, fake_model
):
    # The database on its own small disk: the home has room (so runs may start), but nothing
    # can be written to the database, not even a worker's claim on the run (issue 14: the
    # scheduler claims a run in the database before it starts its worker).
    with (
        small_disk(tmp_path / "home_disk", 64) as home_disk,
        small_disk(tmp_path / "db_disk", 16) as db_disk,
    ):
        server = Server.start(
            home_disk,
            fake_model,
            OSMOSIS_DATABASE_URL=f"sqlite:///{db_disk / 'platform.db'}",
            OSMOSIS_MIN_FREE_DISK_BYTES=str(24 * MB),
        )
        try:
            repo = make_repo(tmp_path / "ws", FOUR_PASSING)
            upload_dataset(server, repo)
            # Held back by a low home disk while the database's disk is filled to the brim.
            home_filler = fill(home_disk, leave=8 * MB)
            with server.client() as client:
                created = submit(client, repo)
                db_filler = fill(db_disk, leave=0)
                home_filler.unlink()  # the run may start now; it cannot be claimed

                eventually(
                    lambda: "cannot claim eval runs" in server_log(server),
                    what="the scheduler to find it cannot claim the run",
                )
                time.sleep(4)  # eight scheduler rounds
                # Before: a new worker every half second (4 pids in 10 s in the report). Now
                # none starts, and the claims back off rather than fail every round.
                log = server_log(server)
                assert f"for eval run {created.id}" not in log and workers_of(created.id) == []
                refusals = [line for line in log.splitlines() if "cannot claim eval runs" in line]
                assert 1 <= len(refusals) <= 4, refusals
                assert "database or disk is full" in refusals[0]
                assert "trying again in" in refusals[-1]
                assert client.runs.get(created.id).eval_run.status == "pending"

                db_filler.unlink()  # once it can be written, the run is claimed and runs
                detail = finished(client, created.id, timeout=120)
                assert detail.eval_run.status == "finished", list(all_logs(client, created.id))
                progress = detail.summary.progress
                assert progress.completed == progress.total >= 1
                eventually(lambda: not workers_of(created.id), what="its worker to exit")
        finally:
            server.stop()


# -- 13.6: private whatever the umask -------------------------------------------------------------
def loose_entries(home: Path) -> list[str]:
    """Files and directories under `home` (itself included) that group or other can use."""
    found = []
    for path in [home, *home.rglob("*")]:
        mode = path.lstat().st_mode
        if not stat.S_ISLNK(mode) and mode & 0o077:
            found.append(f"{oct(mode & 0o777)} {path.relative_to(home)}")
    return found


def test_everything_the_server_writes_is_owner_only_with_umask_022(tmp_path, fake_model):
    home = tmp_path / "home"
    env = model_env(fake_model, OSMOSIS_HOME=str(home), OSMOSIS_CONFIG_DIR=str(tmp_path / "c"))
    server = Server(home=home, env=env)

    def start() -> None:
        started = subprocess.run(
            [*CLI, "server", "start", "--detach", "--port", str(server.port)],
            env=env,
            capture_output=True,
            text=True,
            timeout=90,
            umask=0o022,  # what most users have: files 0644, directories 0755
        )
        assert started.returncode == 0, started.stderr

    start()
    try:
        repo = make_repo(tmp_path / "ws", FOUR_PASSING)
        upload_dataset(server, repo)
        with server.client() as client:
            created = submit(client, repo)
            detail = finished(client, created.id)
            assert detail.eval_run.status == "finished", list(all_logs(client, created.id))
    finally:
        server.stop()
    written = {str(path.relative_to(home)) for path in home.rglob("*")}
    for expected in ("platform.db", "secret.key", "credentials.json", "server.log", "blobs"):
        assert expected in written
    assert any(name.startswith(f"runs/{created.id}/trajectories/") for name in written)
    assert any(name.startswith("git/") for name in written)  # the workspace's mirror
    assert loose_entries(home) == []

    # A home an earlier version left readable is tightened at the next start, and logged.
    for path in [home, *home.rglob("*")]:
        if not path.is_symlink():
            path.chmod(path.stat().st_mode | 0o044 | (0o011 if path.is_dir() else 0))
    (home / ".private").unlink()  # that version did not mark the home as checked
    start()
    server.stop()
    assert loose_entries(home) == []
    assert "removed group/other permissions from" in (home / "server.log").read_text()
