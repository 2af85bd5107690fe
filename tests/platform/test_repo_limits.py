"""Repository limits (issue 25.9): an oversized push fails its run naming the limit, and no
mirror of it is kept; mirrors of deleted workspaces are removed. Real git repositories, a
bare origin on disk, a real database, and one real platform server for the run's error."""

from __future__ import annotations

import asyncio
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import delete

from osmosis.platform.core.db.models import Workspace
from osmosis.platform.worker.checkout import (
    CheckoutError,
    RepoLimits,
    checkout,
    mirror_path,
    remove_stale_mirrors,
)
from osmosis.platform.worker.scheduler import Scheduler
from osmosis.testing import FakeModelServer
from tests.e2e.workspace import row
from tests.platform.eval_world import (
    Server,
    all_logs,
    finished,
    make_repo,
    submit,
    upload_dataset,
)
from tests.platform.test_roles_leases import World
from tests.platform.test_roles_leases import world as world  # the fixture

WORKSPACE = "ab" * 16


def git(*args: str, cwd: Path) -> str:
    done = subprocess.run(
        ["git", "-c", "user.name=T", "-c", "user.email=t@example.com", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.strip()


def origin_with(root: Path, files: dict[str, bytes]) -> tuple[str, str]:
    """A bare origin on disk holding one commit of `files`: its URL and the commit."""
    tree, origin = root / "tree", root / "origin.git"
    tree.mkdir(parents=True)
    subprocess.run(["git", "init", "-q", "--bare", str(origin)], check=True)
    git("init", "-q", "-b", "main", cwd=tree)
    for name, data in files.items():
        (tree / name).parent.mkdir(parents=True, exist_ok=True)
        (tree / name).write_bytes(data)
    git("add", "-A", cwd=tree)
    git("commit", "-q", "-m", "push", cwd=tree)
    git("push", "-q", str(origin), "HEAD:main", cwd=tree)
    return str(origin), git("rev-parse", "HEAD", cwd=tree)


def check_out(home: Path, origin: str, commit: str, limits: RepoLimits) -> Path:
    return checkout(
        home,
        workspace_id=WORKSPACE,
        origin_url=origin,
        commit_sha=commit,
        run_id="run1",
        log=lambda line: None,
        limits=limits,
    )


@pytest.mark.parametrize(
    ("files", "limits", "said"),
    [
        pytest.param(
            {"blob.bin": os.urandom(400_000), "main.py": b"print(1)\n"},
            RepoLimits(max_bytes=200_000, max_files=100),
            [
                "after the fetch, over the limit of 200000 bytes",
                "OSMOSIS_REPO_MAX_BYTES=200000",
            ],
            id="oversized pack",
        ),
        pytest.param(
            # Zeros pack to almost nothing: the commit's files are what a checkout would take.
            {"zeros.bin": bytes(3_000_000)},
            RepoLimits(max_bytes=1_000_000, max_files=100),
            ["are at least 2.9 MiB (3,000,000 bytes)", "OSMOSIS_REPO_MAX_BYTES=1000000"],
            id="files that unpack past the limit",
        ),
        pytest.param(
            {f"many/{n}.txt": f"{n}\n".encode() for n in range(30)},
            RepoLimits(max_bytes=10**9, max_files=20),
            ["holds more than 20 files", "OSMOSIS_REPO_MAX_FILES=20"],
            id="too many files",
        ),
    ],
)
def test_an_oversized_repository_is_refused_and_its_mirror_removed(
    tmp_path: Path, files: dict[str, bytes], limits: RepoLimits, said: list[str]
) -> None:
    origin, commit = origin_with(tmp_path / "ws", files)
    home = tmp_path / "home"
    with pytest.raises(CheckoutError) as refused:
        check_out(home, origin, commit, limits)
    for words in said:
        assert words in str(refused.value)
    assert "its mirror was removed" in str(refused.value)
    assert not mirror_path(home, workspace_id=WORKSPACE, origin_url=origin).exists()
    assert not (home / "checkouts" / "run1" / ".git").exists()
    # Within the limits (0: none), the same commit checks out.
    tree = check_out(home, origin, commit, RepoLimits(max_bytes=0, max_files=0))
    assert sorted(p.name for p in tree.iterdir() if p.name != ".git")


def test_a_repository_within_the_limits_checks_out(tmp_path: Path) -> None:
    origin, commit = origin_with(tmp_path / "ws", {"main.py": b"print(1)\n"})
    tree = check_out(tmp_path / "home", origin, commit, RepoLimits())
    assert (tree / "main.py").read_bytes() == b"print(1)\n"
    assert (mirror_path(tmp_path / "home", workspace_id=WORKSPACE, origin_url=origin)).is_dir()


def test_the_limits_come_from_the_workers_environment() -> None:
    env = {"OSMOSIS_REPO_MAX_BYTES": "5", "OSMOSIS_REPO_MAX_FILES": "7"}
    assert RepoLimits.from_env(env) == RepoLimits(max_bytes=5, max_files=7)
    assert RepoLimits.from_env({}) == RepoLimits(max_bytes=1024**3, max_files=100_000)


def test_only_the_mirrors_of_deleted_workspaces_are_removed(tmp_path: Path) -> None:
    for workspace in ("kept", "gone"):
        (tmp_path / "git" / workspace / "0123.git").mkdir(parents=True)
    assert remove_stale_mirrors(tmp_path, workspace_ids=lambda: {"kept"}) == 1
    assert sorted(p.name for p in (tmp_path / "git").iterdir()) == ["kept"]
    assert remove_stale_mirrors(tmp_path / "nowhere", workspace_ids=set) == 0


async def test_the_scheduler_removes_the_mirror_of_a_deleted_workspace(
    world: World, tmp_path: Path
) -> None:
    origin, commit = origin_with(tmp_path / "ws", {"main.py": b"print(1)\n"})
    with world.sessions() as db:
        doomed = Workspace(identity="example.com/team/doomed")
        db.add(doomed)
        db.commit()
        doomed_id = doomed.id
    home = world.settings.home
    mirrors = {}
    for workspace_id in (world.workspace_id, doomed_id):
        checkout(
            home,
            workspace_id=workspace_id,
            origin_url=origin,
            commit_sha=commit,
            run_id=f"run-{workspace_id}",
            log=lambda line: None,
            limits=RepoLimits(),
        )
        mirrors[workspace_id] = mirror_path(home, workspace_id=workspace_id, origin_url=origin)
        assert mirrors[workspace_id].is_dir()
    with world.sessions() as db:
        db.execute(delete(Workspace).where(Workspace.id == doomed_id))
        db.commit()
    scheduler = Scheduler(world.sessions, world.settings)
    await scheduler.start()
    try:
        for _ in range(100):  # its first round sweeps
            if not mirrors[doomed_id].parent.exists():
                break
            await asyncio.sleep(0.1)
    finally:
        await scheduler.close()
    assert not mirrors[doomed_id].parent.exists()
    assert mirrors[world.workspace_id].is_dir()


# -- on a real platform -----------------------------------------------------------------------
@pytest.fixture(scope="module")
def fake_model() -> Iterator[FakeModelServer]:
    with FakeModelServer() as server:
        yield server


@pytest.mark.slow
def test_an_oversized_push_fails_its_run_naming_the_limit(
    tmp_path: Path, fake_model: FakeModelServer, databases
) -> None:
    server = Server.start(
        tmp_path / "platform",
        fake_model,
        databases=databases,
        OSMOSIS_REPO_MAX_BYTES="300000",
    )
    try:
        repo = make_repo(tmp_path / "ws", [row("pass", a, 3) for a in range(2, 6)], limit=4)
        upload_dataset(server, repo)
        (repo.tree / "blob.bin").write_bytes(os.urandom(600_000))
        repo.push("a large blob")
        with server.client() as client:
            run = submit(client, repo)
            detail = finished(client, run.id)
            assert detail.eval_run.status == "failed"
            error = detail.eval_run.error or ""
            assert "OSMOSIS_REPO_MAX_BYTES=300000" in error, error
            assert "over the limit of" in error and "its mirror was removed" in error
            assert any("OSMOSIS_REPO_MAX_BYTES" in line for line in all_logs(client, run.id))
            assert client.runs.attempts(run.id).total_count == 0
        assert not list((server.home / "git").glob("*/*.git"))
    finally:
        server.stop()
