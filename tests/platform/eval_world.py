"""The world of platform eval-run tests: a real server process on a temporary home whose runs
reach a scripted model, a git workspace pushed to a local bare `origin`, its dataset uploaded
over HTTP, and helpers that drive runs through the typed client and look at processes."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from osmosis.client import PlatformClient
from osmosis.eval.inputs.config import parse_eval_config
from osmosis.testing import FakeModelServer
from osmosis.vocabulary import TERMINAL_RUN_STATUSES as TERMINAL
from osmosis.wire.runs import (
    EvalRunCreate,
    EvalRunCreated,
    EvalRunDetail,
    ExperimentConfigIn,
    RepositoryRef,
    RunSecrets,
)
from osmosis.workspace import normalise_identity
from tests.e2e.conftest import model_env
from tests.e2e.workspace import make_workspace
from tests.platform.conftest import free_port, osmosis
from tests.platform.databases import Databases

CONFIG_PATH = "configs/eval/scripted.toml"


# -- the server -------------------------------------------------------------------------------
@dataclass
class Server:
    """A platform server process (`osmosis server start --detach`) on its own home."""

    home: Path
    env: dict[str, str]
    port: int = field(default_factory=free_port)

    @classmethod
    def start(
        cls,
        root: Path,
        model: FakeModelServer,
        *,
        databases: Databases | None = None,
        **settings: str,
    ) -> Server:
        """A server on `root/home`: on SQLite, or on `databases` (tests/platform/databases.py:
        pass the test's `databases` fixture so the world runs on both)."""
        env = model_env(
            model, OSMOSIS_HOME=str(root / "home"), OSMOSIS_CONFIG_DIR=str(root / "config")
        )
        if databases is not None:
            env.update(databases.env(root / "home"))
        env.update(settings)
        server = cls(home=root / "home", env=env)
        server.launch()
        return server

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        return int(json.loads((self.home / "server.json").read_text())["pid"])

    @property
    def admin_token(self) -> str:
        return str(json.loads((self.home / "credentials.json").read_text())["token"])

    def launch(self) -> None:
        started = osmosis("server", "start", "--detach", "--port", str(self.port), env=self.env)
        assert started.returncode == 0, started.stderr + started.stdout

    def stop(self) -> None:
        osmosis("server", "stop", env=self.env)

    def kill(self) -> int:
        """SIGKILL the server process; returns its pid."""
        pid = self.pid
        os.kill(pid, signal.SIGKILL)
        assert gone_within(pid, seconds=10)
        return pid

    def client(self, token: str | None = None) -> PlatformClient:
        return PlatformClient(self.url, token=token or self.admin_token, timeout=60)


# -- the workspace ----------------------------------------------------------------------------
def git(*args: str, cwd: Path) -> str:
    done = subprocess.run(
        ["git", "-c", "user.name=Test", "-c", "user.email=test@example.com", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.strip()


@dataclass
class Repo:
    """A workspace checkout whose `origin` is a local bare repository it was pushed to."""

    tree: Path
    origin: Path
    commit_sha: str

    @property
    def git(self) -> str:
        return normalise_identity(str(self.origin))

    @property
    def config(self) -> Path:
        return self.tree / CONFIG_PATH

    def push(self, message: str = "change") -> str:
        git("add", "-A", cwd=self.tree)
        git("commit", "-q", "--allow-empty", "-m", message, cwd=self.tree)
        git("push", "-q", "origin", "HEAD:main", cwd=self.tree)
        self.commit_sha = git("rev-parse", "HEAD", cwd=self.tree)
        return self.commit_sha


def make_repo(root: Path, rows: list[dict], **workspace: object) -> Repo:
    """`tests.e2e.workspace.make_workspace` (the scripted rollout), committed and pushed."""
    tree, origin = root / "tree", root / "origin.git"
    tree.mkdir(parents=True)
    make_workspace(tree, rows, **workspace)  # type: ignore[arg-type]
    subprocess.run(["git", "init", "-q", "--bare", str(origin)], check=True)
    git("init", "-q", "-b", "main", cwd=tree)
    git("remote", "add", "origin", str(origin), cwd=tree)
    repo = Repo(tree=tree, origin=origin, commit_sha="")
    repo.push("workspace")
    return repo


def upload_dataset(server: Server, repo: Repo, token: str | None = None) -> None:
    """The workspace's `data/scripted.jsonl`, uploaded over HTTP as the CLI would."""
    data = (repo.tree / "data" / "scripted.jsonl").read_bytes()
    response = httpx.post(
        f"{server.url}/api/datasets",
        params={
            "file_name": "scripted.jsonl",
            "size": len(data),
            "sha256": hashlib.sha256(data).hexdigest(),
            "overwrite": "true",
        },
        headers={
            "Authorization": f"Bearer {token or server.admin_token}",
            "X-Osmosis-Git": repo.git,
        },
        content=data,
        timeout=60,
    )
    assert response.status_code in (200, 201), response.text


def run_body(
    repo: Repo, *, provided: dict[str, str] | None = None, config_text: str | None = None
) -> EvalRunCreate:
    """The submit payload the CLI builds from the config file and the pushed commit."""
    # The fields come from the committed file; `config_text` (maybe broken) is what is sent.
    config = parse_eval_config(repo.config.read_text())
    text = config_text if config_text is not None else repo.config.read_text()
    experiment = config.experiment
    return EvalRunCreate(
        experiment_config=ExperimentConfigIn(
            rollout=experiment.rollout,
            entrypoint=experiment.entrypoint,
            model_path=experiment.model_path,
            dataset=experiment.dataset,
        ),
        evaluation_config=config.evaluation.model_dump(include=config.evaluation.model_fields_set),
        env_config=config.env,
        secrets=RunSecrets(required=list(config.secrets.required), provided=provided or {}),
        config_path=CONFIG_PATH,
        config_toml=text,
        repository=RepositoryRef(
            origin_url=str(repo.origin), commit_sha=repo.commit_sha, branch="main"
        ),
    )


def submit(client: PlatformClient, repo: Repo, **body: object) -> EvalRunCreated:
    return client.runs.submit(git=repo.git, body=run_body(repo, **body))  # type: ignore[arg-type]


# -- waiting and looking ------------------------------------------------------------------------
def wait_for(
    client: PlatformClient,
    run: str,
    until: Callable[[EvalRunDetail], bool],
    *,
    timeout: float = 120,
    what: str = "the run to get there",
) -> EvalRunDetail:
    deadline = time.monotonic() + timeout
    while True:
        detail = client.runs.get(run)
        if until(detail):
            return detail
        if time.monotonic() > deadline:
            logs = "\n".join(entry.message for entry in client.runs.logs(run, limit=200).logs)
            raise AssertionError(
                f"timed out waiting for {what}: {detail.eval_run.status}, "
                f"{detail.summary.progress}\n{logs}"
            )
        time.sleep(0.2)


def finished(client: PlatformClient, run: str, *, timeout: float = 120) -> EvalRunDetail:
    return wait_for(
        client,
        run,
        lambda d: d.eval_run.status in TERMINAL,
        timeout=timeout,
        what="a final status",
    )


def recorded_at_least(client: PlatformClient, run: str, count: int) -> EvalRunDetail:
    return wait_for(
        client,
        run,
        lambda d: d.summary.progress.completed >= count or d.eval_run.status in TERMINAL,
        what=f"{count} recorded attempts",
    )


def run_dir(server: Server, run_id: str) -> Path:
    return server.home / "runs" / run_id


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def pids_of(fragment: str) -> list[int]:
    """Live processes whose command line contains `fragment` (zombies count as dead)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if fragment in cmdline and state != "Z":
            found.append(int(entry.name))
    return found


def gone_within(pid: int, *, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return True
        if state == "Z":
            return True  # dead, waiting for its parent to reap it
        time.sleep(0.05)
    return False


def all_logs(client: PlatformClient, run: str) -> Iterator[str]:
    cursor = None
    while True:
        page = client.runs.logs(run, limit=200, cursor=cursor)
        for entry in page.logs:
            yield f"[{entry.step}/{entry.level}] {entry.message}"
        if page.next_cursor is None:
            return
        cursor = page.next_cursor
