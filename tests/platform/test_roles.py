"""A platform a team shares (issue 14 acceptance): `osmosis server start --role api|worker`
processes on one database and one blob directory, driven through the CLI and HTTP as users
drive them; real worker, rollout and PostgreSQL processes, the scripted model.

Each process gets a home of its own, as it would on its own machine; what they share is what
a team shares: the database URL, the blob directory (`OSMOSIS_BLOB_DIR` +
`OSMOSIS_BLOB_SHARED`) and the secret key. The rollout sandbox is off here: these tests are
about processes and leases, and ten sandboxed runs would only add start-up time on two cores
(tests/platform/test_sandbox.py covers the sandbox under the platform).
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import httpx
import pytest
from cryptography.fernet import Fernet

from osmosis.client import PlatformClient
from osmosis.testing import FakeModelServer
from tests.e2e.conftest import model_env
from tests.e2e.conftest import osmosis as osmosis_in
from tests.e2e.workspace import row
from tests.platform.conftest import free_port, osmosis
from tests.platform.eval_world import (
    Repo,
    all_logs,
    finished,
    gone_within,
    make_repo,
    pids_of,
    read_jsonl,
    recorded_at_least,
    submit,
    upload_dataset,
    wait_for,
)

pytestmark = pytest.mark.slow
T = TypeVar("T")

LONG_ROWS = 30
SHORT_LIMIT = 4


@pytest.fixture(scope="module")
def fake_model() -> Iterator[FakeModelServer]:
    with FakeModelServer() as server:
        yield server


@dataclass
class Process:
    """One `osmosis server start --detach --role ROLE` on its own home."""

    role: str
    home: Path
    env: dict[str, str]
    port: int = field(default_factory=free_port)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        state = "worker.json" if self.role == "worker" else "server.json"
        return int(json.loads((self.home / state).read_text())["pid"])

    def start(self) -> None:
        started = osmosis(
            "server", "start", "--detach", "--role", self.role, "--port", str(self.port),
            env=self.env,
        )  # fmt: skip
        assert started.returncode == 0, started.stderr + started.stdout

    def stop(self) -> None:
        osmosis("server", "stop", env=self.env)

    def status(self) -> dict:
        result = osmosis("--json", "server", "status", env=self.env)
        assert result.returncode == 0, result.stderr
        return dict(json.loads(result.stdout)["data"])


def team(root: Path, model: FakeModelServer, **shared: str) -> Callable[[str, str], Process]:
    """`process(name, role)`: a process of one platform whose settings are `shared`."""

    def process(name: str, role: str) -> Process:
        home = root / name
        env = model_env(model, OSMOSIS_HOME=str(home), OSMOSIS_CONFIG_DIR=str(root / "config"))
        env.update(shared)
        return Process(role=role, home=home, env=env)

    return process


def eventually(check: Callable[[], T], *, what: str, timeout: float = 120) -> T:
    deadline = time.monotonic() + timeout
    while not (value := check()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)
    return value


def with_limit(repo: Repo, limit: int) -> str:
    """The committed config with another `limit` (what a user edits before a submit)."""
    text = repo.config.read_text()
    assert f"limit = {LONG_ROWS}" in text
    return text.replace(f"limit = {LONG_ROWS}", f"limit = {limit}")


def claim_lines(client: PlatformClient, run_id: str) -> list[str]:
    return [
        line
        for line in all_logs(client, run_id)
        if "claimed by a worker" in line or "resumed by a worker" in line
    ]


def info(api: Process, token: str, name: str, cwd: Path) -> dict:
    """`osmosis eval info NAME --json` against one API process."""
    env = {**api.env, "OSMOSIS_PLATFORM_URL": api.url, "OSMOSIS_TOKEN": token}
    result = osmosis_in("--json", "eval", "info", name, cwd=cwd, env=env)
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)["data"]
    return {k: v for k, v in data.items() if "url" not in k}  # each API names itself


@pytest.fixture
def team_database(postgres) -> Iterator[str]:
    """An empty PostgreSQL database that every process of the test's platform uses."""
    url = postgres.create_database(migrated=False)
    yield url
    postgres.drop_database(url)


@pytest.mark.timeout(600)  # four platform processes, ten runs, a kill and a resume
def test_two_apis_and_two_workers_on_one_postgresql_run_each_run_once_and_survive_a_kill(
    tmp_path, fake_model, team_database
):
    shared = tmp_path / "shared-blobs"  # a network mount on a real team's machines
    shared.mkdir()
    process = team(
        tmp_path,
        fake_model,
        OSMOSIS_DATABASE_URL=team_database,
        OSMOSIS_BLOB_DIR=str(shared),
        OSMOSIS_BLOB_SHARED="1",
        OSMOSIS_SECRET_KEY=Fernet.generate_key().decode(),
        OSMOSIS_SANDBOX="off",
        OSMOSIS_MAX_CONCURRENT_RUNS="4",
        OSMOSIS_WORKER_MAX_RUNS="2",
        OSMOSIS_LEASE_S="6",
    )
    api1, api2 = process("api-1", "api"), process("api-2", "api")
    workers = [process("worker-1", "worker"), process("worker-2", "worker")]
    everyone = [api1, api2, *workers]

    # An empty database: API and worker processes wait for an explicit migration.
    refused = osmosis(
        "--json", "server", "start", "--role", "api", "--port", str(api1.port), env=api1.env
    )
    assert refused.returncode == 1, refused.stdout
    error = json.loads(refused.stderr.splitlines()[-1])["error"]  # after the server's log
    assert "revision none" in error["message"] and "osmosis server migrate" in error["message"]
    migrated = json.loads(osmosis("--json", "server", "migrate", env=api1.env).stdout)
    assert migrated["resource"]["from_revision"] is None and migrated["resource"]["revision"]
    again = json.loads(osmosis("--json", "server", "migrate", env=api2.env).stdout)
    assert "already" in again["message"]

    clients: list[PlatformClient] = []
    try:
        for member in everyone:
            member.start()
        token = json.loads((api1.home / "credentials.json").read_text())["token"]
        status = api2.status()  # any process's home sees the whole platform
        roles = Counter(p["role"] for p in status["processes"])
        assert roles == {"api": 2, "worker": 2}, status["processes"]
        worker_pids = {p["pid"] for p in status["processes"] if p["role"] == "worker"}
        assert worker_pids == {w.pid for w in workers}
        health = httpx.get(f"{api2.url}/api/health").json()
        assert (health["role"], health["database"]["ok"], health["blob_store"]["ok"]) == (
            "api",
            True,
            True,
        )
        assert health["blob_store"]["detail"] == {"mode": "shared", "root": str(shared)}

        # Slow rows: the long run lasts ~15 s, long enough to be caught mid-run under load.
        rows = [row("pass", a, 3, sleep=1.0) for a in range(2, 2 + LONG_ROWS)]
        repo = make_repo(tmp_path / "ws", rows, limit=LONG_ROWS, batch_size=2)
        upload_dataset(api1, repo, token=token)  # type: ignore[arg-type]
        clients += [PlatformClient(api.url, token=token, timeout=60) for api in (api1, api2)]
        # The long run first, then nine short ones, through both APIs in turn.
        long_run = submit(clients[0], repo)
        runs = [long_run] + [
            submit(clients[i % 2], repo, config_text=with_limit(repo, SHORT_LIMIT))
            for i in range(1, 10)
        ]

        # SIGKILL the worker executing the long run, mid-run.
        recorded_at_least(clients[1], long_run.id, 6)
        holder = eventually(
            lambda: next(
                (
                    p
                    for p in api1.status()["processes"]
                    if long_run.id in [r["id"] for r in p.get("runs", [])]
                ),
                None,
            ),
            what="the worker holding the long run in `server status`",
        )
        run_workers = pids_of(f"run_worker {long_run.id}")
        assert run_workers
        os.kill(holder["pid"], signal.SIGKILL)
        assert gone_within(holder["pid"], seconds=10)
        assert all(gone_within(pid, seconds=10) for pid in run_workers), "its worker outlived it"
        survivor = next(w for w in workers if w.pid != holder["pid"])

        details = {run.id: finished(clients[1], run.id, timeout=300) for run in runs}
        assert {d.eval_run.status for d in details.values()} == {"finished"}, {
            i: (d.eval_run.status, d.eval_run.error) for i, d in details.items()
        }
        for i, run in enumerate(runs):
            if run is not long_run:
                assert details[run.id].summary.progress.completed == SHORT_LIMIT
            lines = claim_lines(clients[i % 2], run.id)
            # Dispatched once; resumed at most once, by the survivor, when the killed worker
            # held it too (it ran up to two runs).
            assert len(lines) in (1, 2) and "claimed by a worker" in lines[0], lines
            assert all(f"process {survivor.pid}" in line for line in lines[1:]), lines
            assert all("resumed by a worker" in line for line in lines[1:]), lines

        # The long run: resumed once, by the surviving worker, every attempt recorded once.
        lines = claim_lines(clients[0], long_run.id)
        assert len(lines) == 2, lines
        assert "claimed by a worker" in lines[0] and f"process {holder['pid']}" in lines[0]
        assert "resumed by a worker" in lines[1] and f"process {survivor.pid}" in lines[1]
        journal = read_jsonl(shared / "runs" / long_run.id / "events.jsonl")
        keys = sorted((e["row_index"], e["run_index"]) for e in journal)
        assert keys == [(r, 0) for r in range(LONG_ROWS)]  # no duplicates, no losses
        detail = details[long_run.id]
        assert (detail.summary.passed, detail.summary.progress.completed) == (30, 30)
        assert detail.summary.resumed_count >= 6
        for client in clients:
            attempts = client.runs.attempts(long_run.id, limit=200)
            assert sorted((a.row_index, a.run_index) for a in attempts.attempts) == keys

        # Both workers took runs; `eval info` is the same whichever API answers.
        claimers = Counter(
            pid
            for run in runs
            for line in claim_lines(clients[0], run.id)
            for pid in worker_pids
            if f"process {pid}" in line
        )
        assert set(claimers) == worker_pids, claimers
        for run in (long_run, runs[1]):
            assert info(api1, token, run.name, tmp_path) == info(api2, token, run.name, tmp_path)
        status = api1.status()
        assert [p["pid"] for p in status["processes"] if p["role"] == "worker"] == [survivor.pid]
        assert all(p.get("runs", []) == [] for p in status["processes"])
    finally:
        for client in clients:
            client.close()
        for member in everyone:
            member.stop()


def test_an_api_and_a_worker_process_share_one_sqlite_home(tmp_path, fake_model):
    home = tmp_path / "home"
    env = model_env(
        fake_model,
        OSMOSIS_HOME=str(home),
        OSMOSIS_CONFIG_DIR=str(tmp_path / "config"),
        OSMOSIS_SANDBOX="off",
    )
    api, worker = Process("api", home, env), Process("worker", home, env)
    assert osmosis("server", "migrate", env=env).returncode == 0
    try:
        api.start()
        token = json.loads((home / "credentials.json").read_text())["token"]
        rows = [row("pass", a, 3, sleep=1.0) for a in range(2, 6)]
        repo = make_repo(tmp_path / "ws", rows, limit=4, batch_size=1)
        upload_dataset(api, repo, token=token)  # type: ignore[arg-type]
        with PlatformClient(api.url, token=token, timeout=60) as client:
            created = submit(client, repo)
            time.sleep(3)  # six scheduler rounds: an API process runs nothing
            assert client.runs.get(created.id).eval_run.status == "pending"

            worker.start()
            status = api.status()
            assert (status["running"], status["role"]) == (True, "api")
            assert status["worker"] == {"running": True, "pid": worker.pid}
            assert sorted(p["role"] for p in status["processes"]) == ["api", "worker"]
            second = osmosis("--json", "server", "start", "--role", "worker", env=env)
            assert second.returncode == 1
            conflict = json.loads(second.stderr.splitlines()[-1])["error"]
            assert conflict["code"] == "CONFLICT"
            assert (
                f"a worker is already running for {home} (pid {worker.pid})"
                in (conflict["message"])
            )

            detail = finished(client, created.id)
            assert detail.eval_run.status == "finished"
            assert detail.summary.progress.completed == 4
            # Stop requests reach the worker through the database: the API knows no pid.
            stopped_run = submit(client, repo)
            recorded_at_least(client, stopped_run.id, 1)
            client.runs.stop(stopped_run.id)
            stopped = finished(client, stopped_run.id)
            assert (stopped.eval_run.status, stopped.eval_run.error) == (
                "stopped",
                "stopped on request",
            )
            assert 1 <= stopped.summary.progress.completed < 4
        pids = (api.pid, worker.pid)
        stopped = json.loads(osmosis("--json", "server", "stop", env=env).stdout)
        assert "the server" in stopped["message"] and "the worker" in stopped["message"]
        assert all(gone_within(pid, seconds=10) for pid in pids)
    finally:
        api.stop()


@pytest.mark.timeout(300)  # a lease must run out while a run goes on
def freeze_between_writes(pid: int, database: Path) -> None:
    """SIGSTOP `pid` at a moment it holds no write lock of the SQLite file `database`.

    A process frozen inside a write (a heartbeat takes a few milliseconds) stops every
    writer until it goes on: SQLite's one limit, which the docs name, not what a test of
    leases is about. Frozen while another connection waits for the lock, it holds none.
    """
    for _ in range(50):
        os.kill(pid, signal.SIGSTOP)
        probe = sqlite3.connect(database, timeout=0.5, isolation_level=None)
        try:
            probe.execute("BEGIN IMMEDIATE")
            probe.execute("ROLLBACK")
            return
        except sqlite3.OperationalError:  # frozen inside a write: let it finish first
            os.kill(pid, signal.SIGCONT)
            time.sleep(0.05)
        finally:
            probe.close()
    raise AssertionError(f"process {pid} held the database's write lock 50 times in a row")


def test_a_frozen_worker_loses_its_run_and_cannot_end_it_after_another_took_over(
    tmp_path, fake_model
):
    # Three homes (three machines) on one SQLite file and one blob directory. The worker
    # holding the run is frozen (SIGSTOP): its process lives, so only the lease running out
    # frees the run, while the run's own worker process goes on and still holds the run
    # directory. The other worker may claim the run but not write its journal until that
    # process is gone; the frozen one's process, done, finds its claim taken and ends nothing.
    shared = tmp_path / "shared"
    shared.mkdir()
    process = team(
        tmp_path,
        fake_model,
        OSMOSIS_DATABASE_URL=f"sqlite:///{tmp_path / 'platform.db'}",
        OSMOSIS_BLOB_DIR=str(shared),
        OSMOSIS_BLOB_SHARED="1",
        OSMOSIS_SECRET_KEY=Fernet.generate_key().decode(),
        OSMOSIS_SANDBOX="off",
        OSMOSIS_LEASE_S="4",
    )
    api, workers = process("api", "api"), [process("w1", "worker"), process("w2", "worker")]
    assert osmosis("server", "migrate", env=api.env).returncode == 0
    frozen: int | None = None
    try:
        for member in (api, *workers):
            member.start()
        token = json.loads((api.home / "credentials.json").read_text())["token"]
        rows = [row("pass", a, 3, sleep=0.5) for a in range(2, 32)]
        repo = make_repo(tmp_path / "ws", rows, limit=30, batch_size=1)
        upload_dataset(api, repo, token=token)  # type: ignore[arg-type]
        with PlatformClient(api.url, token=token, timeout=60) as client:
            created = submit(client, repo)
            recorded_at_least(client, created.id, 2)
            holder = next(
                p for p in api.status()["processes"] if p.get("runs") and p["role"] == "worker"
            )
            frozen = holder["pid"]
            second = next(w for w in workers if w.pid != frozen)
            freeze_between_writes(frozen, tmp_path / "platform.db")

            detail = finished(client, created.id, timeout=180)
            assert detail.eval_run.status == "finished", detail.eval_run.error
            assert detail.summary.progress.completed == 30
            logs = list(all_logs(client, created.id))
            taken = [line for line in logs if "claim on the run was taken over" in line]
            assert len(taken) == 1, logs  # the frozen worker's run process ended nothing
            resumed = [line for line in claim_lines(client, created.id)[1:]]
            assert resumed and all(f"process {second.pid}" in line for line in resumed)
            journal = read_jsonl(shared / "runs" / created.id / "events.jsonl")
            keys = sorted((e["row_index"], e["run_index"]) for e in journal)
            assert keys == [(r, 0) for r in range(30)]  # one writer at a time: none twice

            os.kill(frozen, signal.SIGCONT)
            frozen = None
            # Thawed, it learns the run is no longer its own and keeps out of it.
            time.sleep(3)
            assert client.runs.get(created.id).eval_run.status == "finished"
    finally:
        if frozen is not None:
            os.kill(frozen, signal.SIGCONT)
        for member in (api, *workers):
            member.stop()


def test_a_stop_reaches_a_running_run_whose_scheduler_is_frozen(tmp_path, fake_model):
    # The worker process holding the run is frozen (SIGSTOP) once its run's worker dispatches
    # rows that hang: its scheduler can send no SIGTERM. The run's worker reads the stop
    # flag itself and ends the run `stopped` long before the lease or the agents' deadline.
    process = team(
        tmp_path,
        fake_model,
        OSMOSIS_DATABASE_URL=f"sqlite:///{tmp_path / 'platform.db'}",
        OSMOSIS_BLOB_DIR=str(tmp_path / "shared"),
        OSMOSIS_BLOB_SHARED="1",
        OSMOSIS_SECRET_KEY=Fernet.generate_key().decode(),
        OSMOSIS_SANDBOX="off",
        OSMOSIS_LEASE_S="120",
    )
    (tmp_path / "shared").mkdir()
    api, worker = process("api", "api"), process("w1", "worker")
    assert osmosis("server", "migrate", env=api.env).returncode == 0
    frozen: int | None = None
    try:
        for member in (api, worker):
            member.start()
        token = json.loads((api.home / "credentials.json").read_text())["token"]
        repo = make_repo(tmp_path / "ws", [row("hang", a, 3) for a in range(2, 6)], limit=4)
        upload_dataset(api, repo, token=token)  # type: ignore[arg-type]
        with PlatformClient(api.url, token=token, timeout=60) as client:
            created = submit(client, repo)
            wait_for(
                client,
                created.id,
                lambda d: any("dispatching" in line for line in all_logs(client, d.eval_run.id)),
                what="the run's dispatch",
            )
            freeze_between_writes(worker.pid, tmp_path / "platform.db")
            frozen = worker.pid
            began = time.monotonic()
            client.runs.stop(created.id)
            detail = finished(client, created.id, timeout=25)  # the agents' deadline is 30 s
            assert detail.eval_run.status == "stopped", detail.eval_run.error
            assert time.monotonic() - began < 15
    finally:
        if frozen is not None:
            os.kill(frozen, signal.SIGCONT)
        for member in (api, worker):
            member.stop()
