"""Issue 12 acceptance: sandboxed rollouts on a real platform server (the default: on).

A hostile rollout (`test_sandbox_world.HOSTILE_MAIN`) tries what a workspace member's code
could do on the platform and prints what it found to its run's log; each test reads that
through the API. Every "Security model" line in docs/platform.md names the test that backs it.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from cryptography.fernet import Fernet
from sqlalchemy import select

from osmosis.eval.sites.sandbox.layout import interpreter_dirs
from osmosis.platform.core.db import make_engine, make_session_factory
from osmosis.platform.core.db.models import Workspace
from osmosis.platform.services.workspaces import set_sandbox_network
from osmosis.testing import FakeModelServer
from osmosis.workspace import canonical_identity
from tests.e2e.conftest import osmosis as osmosis_in
from tests.e2e.workspace import OSMOSIS_AI_MAIN, OSMOSIS_AI_PYPROJECT, SCRIPTED_MAIN, row
from tests.platform.conftest import clean_env, free_port, osmosis
from tests.platform.eval_world import (
    Repo,
    Server,
    all_logs,
    finished,
    git,
    make_repo,
    submit,
    upload_dataset,
    wait_for,
)
from tests.platform.test_sandbox_world import (
    HOSTILE_MAIN,
    findings,
    hostile_env,
    hostile_row,
)

pytestmark = pytest.mark.slow

OPERATOR = {
    "GITHUB_TOKEN": "ghp_operator0token0that0must0not0leak",
    "HF_TOKEN": "hf_operator0token0that0must0not0leak",
    "PGPASSWORD": "pg-operator-password-that-must-not-leak",
}
FILLER = [row("pass", a, 3) for a in range(2, 6)]  # a dataset needs at least 4 rows
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "workspace"


@pytest.fixture(scope="module")
def fake_model() -> Iterator[FakeModelServer]:
    with FakeModelServer() as server:
        yield server


@pytest.fixture(scope="module")
def key() -> str:
    return Fernet.generate_key().decode()


@pytest.fixture(scope="module")
def server(tmp_path_factory, fake_model, key) -> Iterator[Server]:
    """A platform started with the operator's tokens and the secret key in its environment."""
    platform = Server.start(
        tmp_path_factory.mktemp("sandboxed"), fake_model, OSMOSIS_SECRET_KEY=key, **OPERATOR
    )
    yield platform
    platform.stop()


def run_repo(
    tmp_path: Path, server: Server, rows: list[dict], *, main: str = HOSTILE_MAIN, **options
) -> Repo:
    repo = make_repo(tmp_path, rows, limit=len(rows), main=main, **options)
    upload_dataset(server, repo)
    return repo


def logs(server: Server, run_id: str) -> list[str]:
    with server.client() as client:
        return list(all_logs(client, run_id))


def attempts(server: Server, run_id: str) -> dict[int, tuple[str, str | None]]:
    with server.client() as client:
        page = client.runs.attempts(run_id, limit=200)
    return {a.row_index: (a.status, a.error_type) for a in page.attempts}


# -- what it can reach -------------------------------------------------------------------------
def test_a_hostile_rollout_reaches_nothing_of_the_platform(tmp_path, server, key):
    """Platform home (database, key, credentials), another run's checkout and outputs, other
    processes' environ, the API port, host sockets, mounts, capabilities: all out of reach;
    and none of the operator's variables is in its environment."""
    victim_secret = "victim-run-secret-0123456789"
    victim = run_repo(
        tmp_path / "victim",
        server,
        [hostile_row("sleep", seconds=20), *FILLER[:3]],
        secrets=["VICTIM_TOKEN"],
    )
    with server.client() as client:
        victim_run = submit(client, victim, provided={"VICTIM_TOKEN": victim_secret})
        wait_for(client, victim_run.id, lambda d: d.eval_run.status == "running", what="running")
    home = server.home
    victim_files = [home / "checkouts" / victim_run.id, home / "runs" / victim_run.id]
    wait_until_exists(victim_files)
    targets = [
        home / "platform.db",
        home / "credentials.json",
        home / "server.json",
        home / "server.log",
        home / "blobs",
        home / "envs",
        *victim_files,
        home / "runs" / victim_run.id / "events.jsonl",
        Path("/etc/shadow"),
        Path("/root/.ssh"),
    ]
    hostile = run_repo(
        tmp_path / "hostile",
        server,
        [hostile_row("probe"), *FILLER[:3]],
        env=hostile_env(
            targets=[str(t) for t in targets],
            ports=[server.port],
            pids=[server.pid],
            look_for=[key, victim_secret, *OPERATOR.values()],
        ),
    )
    with server.client() as client:
        created = submit(client, hostile)
        run = finished(client, created.id, timeout=180)
    lines = logs(server, created.id)
    assert run.eval_run.status == "finished", "\n".join(lines)
    found = findings(lines)
    # Files: nothing of the home, nothing of the victim run; only its own run's paths exist.
    assert all(v.startswith("denied") for v in found["targets"].values()), found["targets"]
    assert set(found["root_listing"]) <= {
        "bin",
        "dev",
        "etc",
        "home",
        "lib",
        "lib32",
        "lib64",
        "libx32",
        "proc",
        "root",
        "run",
        "sbin",
        "tmp",
        "usr",
        *(Path(str(home)).parts[1:2]),
        # The run's own at fixed paths: its checkout, its outbox (and a venv if it had one).
        "workspace",
        "outbox",
        # The interpreter and our SDK are bound read-only where they live (a checkout's venv
        # under /work here, under /check on CI): their top directory shows, nothing else.
        *(path.parts[1] for path in interpreter_dirs(Path(sys.executable), None)),
    }
    assert found["home_listing"] == [] and found["sys_visible"] is False
    # Processes: its own PID namespace; no other environ, no host pid to signal.
    assert max(found["pids"]) < 10, found["pids"]
    assert found["environ_leaks"] == []
    assert all(v.startswith("denied: ProcessLookupError") for v in found["host_pids"].values())
    # Network: the API port is not reachable, the only socket is the bridge's hand-over one
    # (it takes connected stream sockets only: tests/integration/test_sandbox_handoff.py).
    assert all(v.startswith("denied") for v in found["tcp"].values()), found["tcp"]
    assert found["sockets"] == {"/run/osmosis/bridge/handoff.sock": "ok: connected"}
    assert found["routes"] == []  # `bridge`: no interface but loopback
    # Environment: the operator's variables and the platform's settings are absent.
    env = found["env"]
    assert not set(OPERATOR) & set(env) and "OSMOSIS_SECRET_KEY" not in env
    assert not [name for name in env if name.startswith("OSMOSIS_")]
    assert env["HOME"] == "/home/rollout" and found["uid"] == 1000
    # Mounts and privileges: read-only workspace and interpreter, no mount, no capabilities.
    assert "Read-only file system" in found["write_workspace"]
    assert "Read-only file system" in found["write_interpreter"]
    assert found["mount"].startswith("denied") and found["unshare_user"].startswith("denied")
    assert found["cap_eff"] == "0000000000000000"
    # Its uid is the server's outside (root here): /proc files that check only ownership stay
    # closed (kernel.core_pattern would run a program of its choice as root).
    assert all(v.startswith("denied") for v in found["sysctl_write"].values()), found
    assert not [fd for fd in found["fds"] if str(home) in fd and created.id not in fd]
    with server.client() as client:
        client.runs.stop(victim_run.id)
        finished(client, victim_run.id)


def wait_until_exists(paths: list[Path], seconds: float = 60) -> None:
    import time

    deadline = time.monotonic() + seconds
    while not all(p.exists() for p in paths):
        assert time.monotonic() < deadline, f"never appeared: {paths}"
        time.sleep(0.1)


def test_a_link_planted_in_the_trial_directory_is_never_written_through(tmp_path, server):
    """A rollout plants `.trajectory.json.tmp -> credentials.json` (the name the worker's
    redaction writes through) and `artifacts/key.txt -> credentials.json`: the file keeps its
    bytes, no artifact or trajectory served holds them."""
    credentials = server.home / "credentials.json"
    before = credentials.read_bytes()
    repo = run_repo(
        tmp_path,
        server,
        [hostile_row("link_key"), *FILLER[:3]],
        secrets=["RUN_TOKEN"],
        env={"HOSTILE_KEY_PATH": str(credentials)},
    )
    with server.client() as client:
        created = submit(client, repo, provided={"RUN_TOKEN": "run-token-to-be-redacted-42"})
        run = finished(client, created.id)
        assert run.eval_run.status == "finished", "\n".join(logs(server, created.id))
        files = client.runs.files(created.id, types=["all"])
        for item in files.files:
            dest = tmp_path / "fetched" / item.path
            client.runs.download_file(created.id, item.path, dest)
    assert credentials.read_bytes() == before
    token = json.loads(before)["token"].encode()
    fetched = [p for p in (tmp_path / "fetched").rglob("*") if p.is_file()]
    assert any(p.name == "notes.txt" for p in fetched)
    assert all(token not in p.read_bytes() for p in fetched)
    assert not any(p.name == "key.txt" for p in fetched)


# -- limits ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def limited(tmp_path_factory, fake_model) -> Iterator[Server]:
    """A platform with small sandbox limits (the defaults are 4 GiB, 512, 1 GiB)."""
    platform = Server.start(
        tmp_path_factory.mktemp("limited"),
        fake_model,
        OSMOSIS_SANDBOX_MEMORY_BYTES=str(512 * 1024**2),
        OSMOSIS_SANDBOX_PROCESSES="64",
        OSMOSIS_SANDBOX_FILE_BYTES=str(32 * 1024**2),
    )
    yield platform
    platform.stop()


def test_limits_fail_only_the_offending_attempt_while_the_server_and_another_run_go_on(
    tmp_path, limited
):
    """A fork bomb, a 4 GiB allocation and a 2 GiB artifact each end as that attempt's
    `resource_limit` failure; the attempts beside them, a concurrent run and the server go on."""
    hostile_rows = [hostile_row("fork_bomb"), hostile_row("alloc_4g"), hostile_row("artifact_2g")]
    hostile = run_repo(
        tmp_path / "hostile",
        limited,
        [*hostile_rows, *[hostile_row("ok", a, 5) for a in range(5)]],
        batch_size=4,
    )
    neighbour = run_repo(
        tmp_path / "neighbour",
        limited,
        [row("pass", a, 7) for a in range(8)],
        main=SCRIPTED_MAIN,
        batch_size=4,
    )
    with limited.client() as client:
        bad = submit(client, hostile)
        good = submit(client, neighbour)
        bad_run = finished(client, bad.id, timeout=300)
        good_run = finished(client, good.id, timeout=300)
    said = "\n".join(logs(limited, bad.id))
    assert bad_run.eval_run.status == "finished", said
    outcome = attempts(limited, bad.id)
    # The platform runs its rows in a sampled order: count them, and read who hit what.
    failed = [o for o in outcome.values() if o[0] == "failed"]
    assert failed == [("failed", "resource_limit")] * 3, outcome
    assert [o for o in outcome.values() if o[0] == "success"] == [("success", None)] * 5
    assert "exceeded its process limit (64 processes" in said  # the fork bomb
    assert "exceeded its memory limit (512 MiB)" in said  # the 4 GiB allocation
    assert "OSError: [Errno 27] File too large" in said  # the 2 GiB artifact, stopped at 32 MiB
    assert said.count("fails resource_limit") == 2  # the two that killed their server
    assert good_run.eval_run.status == "finished"
    assert good_run.summary.progress.completed == 8 and good_run.summary.pass_rate == 1.0
    assert httpx.get(f"{limited.url}/api/health", timeout=5).status_code == 200


# -- runs unchanged ----------------------------------------------------------------------------
def test_the_example_workspace_passes_in_the_sandbox(tmp_path, server):
    """`examples/workspace` (`add`, n = 4), pushed and submitted as a user would, against the
    scripted model: pass rate 1.0."""
    tree, origin = tmp_path / "tree", tmp_path / "origin.git"
    shutil.copytree(EXAMPLE, tree, ignore=shutil.ignore_patterns(".osmosis"))
    config = tree / "configs" / "eval" / "add.toml"
    config.write_text(config.read_text().replace("local/smollm2-135m", "openai/fake-model"))
    subprocess.run(["git", "init", "-q", "--bare", str(origin)], check=True)
    git("init", "-q", "-b", "main", cwd=tree)
    git("remote", "add", "origin", str(origin), cwd=tree)
    repo = Repo(tree=tree, origin=origin, commit_sha="")
    repo.push("example")
    done = osmosis_in("--json", "dataset", "upload", "data/add.jsonl", env=server.env, cwd=tree)
    assert done.returncode == 0, done.stderr + done.stdout
    done = osmosis_in(
        "--json", "eval", "submit", "configs/eval/add.toml", "--yes", env=server.env, cwd=tree
    )
    assert done.returncode == 0, done.stderr + done.stdout
    run_id = json.loads(done.stdout)["resource"]["id"]
    with server.client() as client:
        run = finished(client, run_id, timeout=240)
    said = "\n".join(logs(server, run_id))
    assert run.eval_run.status == "finished", said
    assert "sandbox: bubblewrap" in said
    assert run.metrics["summary"]["total_samples"] == 24 * 4 and run.summary.pass_rate == 1.0


@pytest.mark.interop
def test_an_osmosis_ai_rollout_runs_unchanged_in_the_sandbox(tmp_path, server):
    """The osmosis-ai 0.3.8 rollout of the interop tests, in its own venv (Python 3.12),
    reaches the bridge through the sandbox's loopback as it always does."""
    rows = [row("pass", a, 4) for a in range(2, 6)]
    repo = make_repo(tmp_path, rows, limit=4, main=OSMOSIS_AI_MAIN)
    (repo.tree / "rollouts" / "scripted" / "pyproject.toml").write_text(OSMOSIS_AI_PYPROJECT)
    repo.push("osmosis-ai")
    upload_dataset(server, repo)
    with server.client() as client:
        created = submit(client, repo)
        run = finished(client, created.id, timeout=600)
    said = "\n".join(logs(server, created.id))
    assert run.eval_run.status == "finished", said
    assert "sandbox: bubblewrap" in said and run.summary.pass_rate == 1.0
    # Its venv was built in the sandbox too, from the index alone, into the workspace's cache.
    assert "building in the sandbox: the checkout read-only, packages only from" in said
    assert list((server.home / "envs" / ".uv-cache").iterdir())


# -- network `full` ----------------------------------------------------------------------------
def test_a_workspace_with_full_network_gets_a_route_out_but_never_the_host_loopback(
    tmp_path, server
):
    """The per-workspace override: slirp4netns gives the sandbox a default route; the host's
    loopback (the API port, through 10.0.2.2 too) stays unreachable. No packet leaves the
    machine: the probe only connects to the API port."""
    if shutil.which("slirp4netns") is None:
        pytest.fail("slirp4netns is missing: scripts/install-system-deps.sh installs it")
    repo = run_repo(
        tmp_path,
        server,
        [hostile_row("probe"), *FILLER[:3]],
        env=hostile_env(ports=[server.port]),
    )
    engine = make_engine(f"sqlite:///{server.home / 'platform.db'}")
    try:
        with make_session_factory(engine)() as db:
            identity = canonical_identity(repo.git)
            workspace = db.scalar(select(Workspace).where(Workspace.identity == identity))
            assert workspace is not None
            set_sandbox_network(db, workspace=workspace, network="full")
            db.commit()
    finally:
        engine.dispose()
    with server.client() as client:
        created = submit(client, repo)
        run = finished(client, created.id, timeout=180)
    lines = logs(server, created.id)
    assert run.eval_run.status == "finished", "\n".join(lines)
    found = findings(lines)
    assert "network full" in "\n".join(lines)
    assert any(route.split()[0] == "tap0" for route in found["routes"]), found["routes"]
    assert all(v.startswith("denied") for v in found["tcp"].values()), found["tcp"]


# -- policy ------------------------------------------------------------------------------------
NO_USERNS_BWRAP = """#!/bin/sh
echo "bwrap: No permissions to create new namespace, likely because the kernel does not \
allow non-privileged user namespaces." >&2
exit 1
"""


def test_without_user_namespaces_the_server_refuses_unless_the_sandbox_is_off(tmp_path):
    """A bwrap that cannot create namespaces (as on a kernel without unprivileged user
    namespaces): `server start` refuses naming the fix. With OSMOSIS_SANDBOX=off it starts,
    and the start, `server status`, `osmosis doctor` and the dashboard say the sandbox is off."""
    fake = tmp_path / "bwrap"
    fake.write_text(NO_USERNS_BWRAP)
    fake.chmod(0o755)
    env = clean_env(
        OSMOSIS_HOME=str(tmp_path / "home"),
        OSMOSIS_CONFIG_DIR=str(tmp_path / "config"),
        OSMOSIS_SANDBOX_BWRAP=str(fake),
    )
    port = str(free_port())
    refused = osmosis("--json", "server", "start", "--detach", "--port", port, env=env)
    assert refused.returncode != 0
    error = json.loads(refused.stdout or refused.stderr)["error"]
    assert "refusing to start: the rollout sandbox is unavailable" in error["message"]
    assert "non-privileged user namespaces" in error["message"]
    fix = error["details"]["sandbox"]["fix"]
    assert "unprivileged_userns_clone" in fix and "OSMOSIS_SANDBOX=off" in fix
    said = osmosis("server", "start", "--detach", "--port", port, env=env)
    assert said.returncode != 0 and f"hint: {fix}"[:60] in " ".join(said.stderr.split())
    assert not (tmp_path / "home" / "server.json").exists()

    off = {**env, "OSMOSIS_SANDBOX": "off"}
    started = osmosis("server", "start", "--detach", "--port", port, env=off)
    try:
        assert started.returncode == 0, started.stderr + started.stdout
        assert "the rollout sandbox is off" in started.stderr + started.stdout
        status = json.loads(osmosis("--json", "server", "status", env=off).stdout)["data"]
        assert (
            status["sandbox"] == "off"
            and "runs with the server's own user" in (status["sandbox_warning"])
        )
        tree = tmp_path / "tree"
        tree.mkdir()
        git("init", "-q", cwd=tree)
        doctor = osmosis_in("--json", "doctor", str(tree), env=off, cwd=tree)
        assert "the rollout sandbox is off (OSMOSIS_SANDBOX=off)" in doctor.stdout + doctor.stderr
        page = httpx.get(f"http://127.0.0.1:{port}/login", timeout=10)
        assert page.status_code == 200 and 'id="sandbox-off"' in page.text
    finally:
        osmosis("server", "stop", env=off)


def test_the_dashboard_says_nothing_of_the_sandbox_while_it_is_on(server):
    page = httpx.get(f"{server.url}/login", timeout=10)
    assert page.status_code == 200 and 'id="sandbox-off"' not in page.text


def test_each_run_log_says_how_it_is_sandboxed(tmp_path, server):
    repo = run_repo(tmp_path, server, FILLER, main=SCRIPTED_MAIN)
    with server.client() as client:
        created = submit(client, repo)
        finished(client, created.id)
    said = "\n".join(logs(server, created.id))
    assert "network bridge: the rollout reaches the model bridge and nothing else" in said
    # The mechanism depends on the machine (cgroup v2, v1 or rlimits); it is always said.
    assert re.search(r"sandbox limits via (cgroup v2|cgroup v1|rlimits).*: memory 4 GiB, 512", said)


def test_on_the_ray_executor_the_server_says_rollouts_are_not_sandboxed(tmp_path):
    """Ray runs rollouts on the cluster's nodes, outside our bubblewrap: whether bwrap works
    here does not matter to start, and start, status and the dashboard say the code is not
    sandboxed rather than claiming a sandbox that is never used."""
    fake = tmp_path / "bwrap"
    fake.write_text(NO_USERNS_BWRAP)
    fake.chmod(0o755)
    env = clean_env(
        OSMOSIS_HOME=str(tmp_path / "home"),
        OSMOSIS_CONFIG_DIR=str(tmp_path / "config"),
        OSMOSIS_SANDBOX_BWRAP=str(fake),
        OSMOSIS_EXECUTOR="ray",
    )
    port = str(free_port())
    started = osmosis("server", "start", "--detach", "--port", port, env=env)
    try:
        assert started.returncode == 0, started.stderr + started.stdout
        assert "not used with OSMOSIS_EXECUTOR=ray" in started.stderr + started.stdout
        status = json.loads(osmosis("--json", "server", "status", env=env).stdout)["data"]
        assert status["sandbox"] == "not used (OSMOSIS_EXECUTOR=ray)"
        assert "Ray workers' own user" in status["sandbox_warning"]
        page = httpx.get(f"http://127.0.0.1:{port}/login", timeout=10)
        assert page.status_code == 200 and "not used with <code>OSMOSIS_EXECUTOR=ray" in page.text
    finally:
        osmosis("server", "stop", env=env)
