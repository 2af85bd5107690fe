"""The official `osmosis` CLI (osmosis-ai, in .venv-interop) drives our server unchanged.

Each test runs the real official CLI as a process against a real server on loopback, as a
user would (`OSMOSIS_PLATFORM_URL`, `OSMOSIS_TOKEN`, `OSMOSIS_TOKEN_PLATFORM_URL`, HOME in a
temporary directory), from a workspace directory whose origin is on github.com, and checks
what it shows against what our own API holds.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest

from osmosis.testing import FakeModelServer
from osmosis.wire.official import REVIEWED_CLI_RANGE, in_reviewed_range, parse_cli_version
from osmosis.wire.runs import EvalRunDetail
from tests.e2e.workspace import make_workspace, row
from tests.platform.conftest import LocalPlatform, RunningPlatform, clean_env
from tests.platform.eval_world import Server, finished

pytestmark = [pytest.mark.interop, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
OFFICIAL = REPO / ".venv-interop" / "bin" / "osmosis"
IDENTITY = "probe/ws"
DATASET = REPO / "examples" / "workspace" / "data" / "add.jsonl"


@dataclass
class OfficialCli:
    """The official CLI, signed in by `OSMOSIS_TOKEN`, run from a workspace directory."""

    workspace: Path
    env: dict[str, str]
    platform: RunningPlatform

    def run(
        self, *args: str, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(OFFICIAL), *args],
            cwd=self.workspace,
            env=env or self.env,
            capture_output=True,
            text=True,
            timeout=120,
        )

    def json(self, *args: str, env: dict[str, str] | None = None) -> dict:
        done = self.run("--json", *args, env=env)
        assert done.returncode == 0, done.stderr + done.stdout
        return json.loads(done.stdout)

    def ours(self, method: str, path: str, **kwargs: object) -> httpx.Response:
        """Our own API, as the admin, in the same workspace."""
        headers = {
            "Authorization": f"Bearer {self.platform.admin_token}",
            "X-Osmosis-Git": IDENTITY,
        }
        return httpx.request(
            method, self.platform.url + path, headers=headers, timeout=30, **kwargs
        )


def interop_rollout_env(rollout: Path) -> str:
    """Give the rollout at `rollout` a project with no dependencies of its own and a venv that
    sees the interop venv's packages (osmosis-ai and all it needs): the official `eval run`'s
    `uv sync` then resolves nothing, offline, whatever the machine's uv cache holds. Returns
    the interop interpreter (for `UV_PYTHON`)."""
    (rollout / "pyproject.toml").write_text(
        '[project]\nname = "scripted"\nversion = "0.1.0"\nrequires-python = ">=3.12"\n'
        "dependencies = []\n"
    )
    python = str(OFFICIAL.parent / "python")
    subprocess.run([python, "-m", "venv", str(rollout / ".venv")], check=True, timeout=120)
    site = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        capture_output=True, text=True, check=True, timeout=60,
    ).stdout.strip()  # fmt: skip
    (rollout / ".venv" / "lib" / "python3.12" / "site-packages" / "interop.pth").write_text(
        site + "\n"
    )
    return python


def _workspace(root: Path) -> Path:
    """A git repository with a github.com origin and the official scaffold's directories."""
    root.mkdir()
    for folder in ("rollouts", "configs/training", "configs/eval", "data"):
        (root / folder).mkdir(parents=True)
    for args in (
        ["init", "-q", "-b", "main"],
        ["remote", "add", "origin", f"https://github.com/{IDENTITY}.git"],
    ):
        subprocess.run(["git", *args], cwd=root, check=True, capture_output=True)
    return root


@pytest.fixture(scope="module")
def official(
    running_platform: RunningPlatform, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[OfficialCli]:
    if not OFFICIAL.exists():
        pytest.skip("no .venv-interop (make install builds it when osmosis-ai installs here)")
    root = tmp_path_factory.mktemp("official")
    env = clean_env(
        HOME=str(root / "home"),
        OSMOSIS_PLATFORM_URL=running_platform.url,
        OSMOSIS_TOKEN=running_platform.admin_token,
        OSMOSIS_TOKEN_PLATFORM_URL=running_platform.url,
        OSMOSIS_TOKEN_STORE="file",
        NO_COLOR="1",
    )
    env.pop("XDG_CONFIG_HOME", None)
    cli = OfficialCli(workspace=_workspace(root / "ws"), env=env, platform=running_platform)
    assert cli.ours("GET", "/api/workspace").status_code == 200  # the admin's first use makes it
    yield cli


# -- the version under test --------------------------------------------------------------------
def test_the_official_cli_is_a_reviewed_version():
    if not OFFICIAL.exists():
        pytest.skip("no .venv-interop (make install builds it when osmosis-ai installs here)")
    python = OFFICIAL.parent / "python"
    done = subprocess.run(
        [str(python), "-c", "import importlib.metadata as m; print(m.version('osmosis-ai'))"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    version = parse_cli_version(done.stdout.strip())
    low, high = REVIEWED_CLI_RANGE
    assert version is not None and in_reviewed_range(version), (
        f"osmosis-ai {done.stdout.strip()} in .venv-interop is outside the reviewed range "
        f"{low} <= v < {high}: review its client against /api/cli, then widen the range in "
        "osmosis.wire.official"
    )


# -- auth ------------------------------------------------------------------------------------
def test_auth_whoami_names_the_token_user_and_the_workspace(official):
    whoami = official.json("auth", "whoami")["data"]
    ours = official.ours("GET", "/api/auth/whoami").json()
    assert whoami["name"] == ours["user"]["name"] == "admin"
    assert whoami["email"] == "admin@osmosis.invalid"  # the first admin has no email
    assert whoami["source"] == "environment"
    assert whoami["workspace"]["name"] == IDENTITY
    assert whoami["workspace"]["role"] == "owner"


def test_auth_login_with_a_token_saves_it_and_logout_revokes_it(official, tmp_path):
    created = official.ours("POST", "/api/auth/tokens", json={"name": "official-cli"})
    assert created.status_code == 201, created.text
    token = created.json()
    env = {k: v for k, v in official.env.items() if k != "OSMOSIS_TOKEN"}
    env["HOME"] = str(tmp_path)
    login = official.json("auth", "login", "--token", token["token"], env=env)
    assert login["status"] == "success", login
    whoami = official.json("auth", "whoami", env=env)["data"]
    assert whoami["source"] == "credentials" and whoami["account"]["token_id"] == token["id"]
    logout = official.run("auth", "logout", "-y", env=env)
    assert logout.returncode == 0, logout.stderr
    mine = official.ours("GET", "/api/auth/tokens").json()["tokens"]
    assert next(t for t in mine if t["id"] == token["id"])["revoked_at"] is not None


# -- secrets ---------------------------------------------------------------------------------
def test_secret_set_list_delete_match_our_api(official):
    done = official.run("secret", "set", "OFFICIAL_KEY", "--env", "OFFICIAL_KEY",
                        env={**official.env, "OFFICIAL_KEY": "s3cret"})  # fmt: skip
    assert done.returncode == 0, done.stderr + done.stdout
    ours = official.ours("GET", "/api/secrets").json()
    assert [s["name"] for s in ours["secrets"]] == ["OFFICIAL_KEY"]
    listed = official.json("secret", "list")
    names = [item["name"] for item in listed["items"]]
    assert names == ["OFFICIAL_KEY"] and listed["total_count"] == ours["total_count"] == 1
    assert "s3cret" not in json.dumps(listed)
    deleted = official.run("secret", "delete", "OFFICIAL_KEY", "-y")
    assert deleted.returncode == 0, deleted.stderr + deleted.stdout
    assert official.ours("GET", "/api/secrets").json()["secrets"] == []


# -- datasets --------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def uploaded(official: OfficialCli) -> dict:
    """`dataset upload data/add.jsonl` by the official CLI, once."""
    shutil.copy(DATASET, official.workspace / "data" / "add.jsonl")
    done = official.json("dataset", "upload", "data/add.jsonl", "--yes")
    return done


def test_dataset_upload_stores_and_validates_the_file(official, uploaded):
    assert uploaded["status"] == "success", uploaded
    ours = official.ours("GET", "/api/datasets/add").json()
    assert ours["status"] == "uploaded"
    assert ours["sha256"] == hashlib.sha256(DATASET.read_bytes()).hexdigest()
    assert ours["rows"] == len(DATASET.read_text().splitlines())
    again = official.run("--json", "dataset", "upload", "data/add.jsonl", "--yes")
    assert again.returncode != 0
    assert "already exists" in again.stderr  # our 409 carried `existing_dataset_id`


def test_dataset_list_and_info_match_our_api(official, uploaded):
    ours = official.ours("GET", "/api/datasets").json()
    listed = official.json("dataset", "list")
    assert [d["file_name"] for d in listed["items"]] == [d["name"] for d in ours["datasets"]]
    assert listed["total_count"] == ours["total_count"] == 1
    info = official.json("dataset", "info", "add")["data"]
    assert info["file_name"] == "add" and info["status"] == "uploaded"
    assert info["row_count"] == ours["datasets"][0]["rows"]
    assert info["file_size"] == DATASET.stat().st_size


def test_dataset_preview_download_and_logs(official, uploaded, tmp_path):
    preview = official.json("dataset", "preview", "add", "--rows", "2")["data"]
    first = json.loads(DATASET.read_text().splitlines()[0])
    assert (
        preview["available"] is True and preview["rows"][0]["user_prompt"] == first["user_prompt"]
    )
    target = tmp_path / "copy.jsonl"
    done = official.json("dataset", "download", "add", "-o", str(target))
    assert done["status"] == "success"
    assert target.read_bytes() == DATASET.read_bytes()
    logs = official.json("dataset", "logs", "add")
    ours = official.ours("GET", "/api/datasets/add/logs").json()["logs"]
    assert [line["message"] for line in logs["items"]] == [line["message"] for line in ours]


def test_validation_runs_at_complete_and_its_reasons_reach_the_logs(official):
    # The official CLI checks a file before sending it; send one it would refuse by hand.
    bad = b'{"user_prompt": "1 + 1?"}\n' * 4
    url = _announce(official, "bad", size=len(bad))
    assert httpx.put(url, content=bad, timeout=30).status_code == 200
    upload_id = urlsplit(url).path.rsplit("/", 1)[1]
    done = _cli_api(official, "POST", f"/api/cli/datasets/{upload_id}/complete", json={})
    assert done.status_code == 422 and done.json()["code"] == "VALIDATION", done.text
    assert "ground_truth" in done.json()["message"]
    ours = official.ours("GET", "/api/datasets/bad").json()
    assert ours["status"] == "error"
    logs = official.json("dataset", "logs", "bad")["items"]
    assert any(line["level"] == "error" for line in logs)


# -- capability URLs -------------------------------------------------------------------------
def _cli_api(official: OfficialCli, method: str, path: str, **kwargs: object) -> httpx.Response:
    headers = {
        "Authorization": f"Bearer {official.platform.admin_token}",
        "X-Osmosis-Git": IDENTITY,
        "X-Osmosis-CLI-Version": "0.3.8",
    }
    return httpx.request(method, official.platform.url + path, headers=headers, timeout=30,
                         **kwargs)  # fmt: skip


def _announce(official: OfficialCli, name: str, *, size: int = 4) -> str:
    body = {"file_name": name, "file_size": size, "extension": "jsonl"}
    response = _cli_api(official, "POST", "/api/cli/datasets", json=body)
    assert response.status_code == 200, response.text
    return str(response.json()["upload"]["presigned_url"])


def test_a_capability_url_serves_one_object_one_method_and_no_token(official):
    url = _announce(official, "probe")
    parts = urlsplit(url)
    assert parts.hostname == "127.0.0.1" and "/api/cli/transfer/dataset-upload/" in parts.path
    assert httpx.get(url, timeout=30).status_code == 403  # another method
    other = url.replace(parts.path.rsplit("/", 1)[1], "0" * 32)
    assert httpx.put(other, content=b"abcd", timeout=30).status_code == 403  # another object
    query = parse_qs(parts.query)
    later = url.replace(f"expires={query['expires'][0]}", f"expires={int(time.time()) + 99999}")
    assert httpx.put(later, content=b"abcd", timeout=30).status_code == 403  # a forged expiry
    answer = httpx.put(url, content=b"abcd", timeout=30)  # no Authorization header
    assert answer.status_code == 200, answer.text


def test_an_expired_capability_url_is_refused(local_platform: LocalPlatform):
    from fastapi.testclient import TestClient

    signer = local_platform.app.state.capability_signer
    url = signer.url("http://127.0.0.1", method="GET", purpose="dataset", object_id="v1",
                     now=time.time() - 3600)  # fmt: skip
    with TestClient(local_platform.app, base_url="http://127.0.0.1") as client:
        answer = client.get(url.removeprefix("http://127.0.0.1"))
    assert answer.status_code == 403
    assert answer.json()["code"] == "URL_REFUSED" and "expired" in answer.json()["message"]


def test_capability_urls_need_https_off_loopback(local_platform: LocalPlatform):
    from fastapi.testclient import TestClient

    headers = {"Authorization": f"Bearer {local_platform.admin_token}", "X-Osmosis-Git": IDENTITY}
    body = {"file_name": "remote", "file_size": 4, "extension": "jsonl"}
    with TestClient(local_platform.app, base_url="http://platform.example") as client:
        answer = client.post("/api/cli/datasets", headers=headers, json=body)
    assert answer.status_code == 400 and answer.json()["code"] == "HTTPS_REQUIRED"


# -- what this server does not offer ---------------------------------------------------------
@pytest.mark.parametrize("args", [("train", "list"), ("model", "list")])
def test_unoffered_commands_say_so(official, args):
    done = official.run("--json", *args)
    assert done.returncode != 0
    assert "not offered by this server" in done.stderr, done.stderr


# -- eval runs -------------------------------------------------------------------------------
SEEDED = "seeded-run"


@pytest.fixture(scope="module")
def seeded_runs(official: OfficialCli) -> list[str]:
    """Two finished runs written into the live server's database and run directories, as the
    worker leaves them (tests/web/seed.py): one with a failure and a skip, one all passed."""
    from sqlalchemy import select

    from osmosis.platform.core.db import make_engine, make_session_factory
    from osmosis.platform.core.db.models import User, Workspace
    from tests.web.seed import Attempt, RunSpec, seed_run

    platform = official.platform
    engine = make_engine(platform.database_url, pool_size=1)
    try:
        with make_session_factory(engine)() as db:
            admin = db.scalar(select(User).where(User.name == "admin"))
            ws = db.scalar(select(Workspace).where(Workspace.identity == IDENTITY))
            assert admin is not None and ws is not None
            mixed = [
                Attempt(0, 0),
                Attempt(0, 1, reward=0.0),
                Attempt(1, 0, status="failed", reward=None, error_type="timeout"),
                Attempt(1, 1, status="skipped", reward=None),
            ]
            logs = "".join(
                f"2026-11-01T12:00:0{i}.000+00:00 [platform] line {i}\n" for i in range(5)
            )
            trajectories = {a.name: {"steps": [{"message": a.name}]} for a in mixed}
            seed_run(db, platform.home, ws=ws, user=admin,
                     spec=RunSpec(name=SEEDED, attempts=mixed, n=2, logs=logs,
                                  trajectories=trajectories))  # fmt: skip
            passed = RunSpec(name="all-passed", attempts=[Attempt(0, 0)], minutes=1)
            seed_run(db, platform.home, ws=ws, user=admin, spec=passed)
            db.commit()
    finally:
        engine.dispose()
    return [SEEDED, "all-passed"]


def test_eval_list_matches_our_api(official, seeded_runs):
    ours = official.ours("GET", "/api/eval-runs").json()
    listed = official.json("eval", "list")
    assert [r["name"] for r in listed["items"]] == [r["name"] for r in ours["eval_runs"]]
    assert listed["total_count"] == ours["total_count"] == 2
    mine = next(r for r in listed["items"] if r["name"] == SEEDED)
    assert mine["rollout"] == "alpha" and mine["status"] == "finished"


def test_eval_info_shows_our_results_and_metrics(official, seeded_runs):
    ours = official.ours("GET", f"/api/eval-runs/{SEEDED}").json()
    info = official.json("eval", "info", SEEDED)["data"]
    results = info["results"]
    assert results["pass_rate"] == ours["summary"]["pass_rate"]
    for key in ("graded", "passed", "failed", "skipped"):
        assert results[key] == ours["summary"][key], key
    assert results["score"] == ours["summary"]["avg_reward"]
    assert info["metrics_available"] is True, info.get("metrics_error")
    summary = ours["metrics"]["summary"]
    assert info["metrics"]["summary"]["pass_at_k"] == summary["pass_at_k"]
    assert info["metrics"]["summary"]["pass_rate"] == summary["pass_rate"]
    stats = results["reward_stats"]
    assert stats["pass_at_k"] == {str(p["k"]): p["value"] for p in summary["pass_at_k"]}
    assert info["rollout"] == {"name": "alpha"} and info["commit_sha"] == ours["commit_sha"]


def test_eval_logs_match_our_api(official, seeded_runs):
    logs = official.json("eval", "logs", SEEDED)
    ours = official.ours("GET", f"/api/eval-runs/{SEEDED}/logs").json()["logs"]
    assert [e["message"] for e in logs["items"]] == [e["message"] for e in ours]
    assert len(ours) == 5


def test_eval_download_fetches_every_file_through_capability_urls(official, seeded_runs, tmp_path):
    done = official.run("--json", "eval", "download", SEEDED, "-o", str(tmp_path), "-y")
    assert done.returncode == 0, done.stderr + done.stdout
    manifest = official.ours("GET", f"/api/eval-runs/{SEEDED}/files").json()
    fetched = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file())
    assert fetched == sorted(f["path"] for f in manifest["files"]) and len(fetched) >= 5


def test_eval_stop_of_a_finished_run_says_why_not(official, seeded_runs):
    done = official.run("--json", "eval", "stop", "all-passed", "-y")
    assert done.returncode != 0
    error = json.loads(done.stderr.strip().splitlines()[-1])["error"]
    assert "all-passed" in error["message"] and "finished" in error["message"], error
    assert error["details"]["status_code"] == 409 and "no route" not in error["message"]


def test_eval_retry_of_a_run_with_nothing_to_retry_says_so(official, seeded_runs):
    done = official.run("--json", "eval", "retry", "all-passed", "-y")
    assert done.returncode != 0
    error = json.loads(done.stderr.strip().splitlines()[-1])["error"]
    assert error["details"]["status_code"] == 409 and "no route" not in error["message"], error
    assert "API error" not in error["message"]


def test_a_dataset_larger_than_a_request_body_uploads_whole(official):
    """The transfer PUT streams to disk under the upload limit, not the 1 MiB body limit."""
    rows = [{"user_prompt": f"{i} + {i}?", "ground_truth": str(2 * i)} for i in range(40_000)]
    big = official.workspace / "data" / "big.jsonl"
    big.write_text("".join(json.dumps(row) + "\n" for row in rows))
    assert big.stat().st_size > 1024 * 1024
    done = official.json("dataset", "upload", "data/big.jsonl", "--yes")
    assert done["status"] == "success", done
    ours = official.ours("GET", "/api/datasets/big").json()
    assert ours["rows"] == 40_000 and ours["sha256"] == hashlib.sha256(big.read_bytes()).hexdigest()


# -- eval submit: a GitHub-shaped workspace served from a local mirror --------------------------
SUBMIT_IDENTITY = "probe/evals"
SUBMIT_ROWS = [row("ok", 2, 7), row("ok", 3, 7), row("ok", 4, 7), row("wrong", 5, 7)]


@dataclass
class SubmitWorld:
    """A server that runs evaluations on the scripted model, with `OSMOSIS_GIT_URL_REWRITE`
    mapping `https://github.com/probe/` to a directory of bare mirrors, and a workspace whose
    origin is `https://github.com/probe/evals.git` (pushed, through `pushInsteadOf`, to the
    mirror), driven by the official CLI."""

    server: Server
    cli: OfficialCli
    mirror: Path
    commit_sha: str

    def config(self, name: str, **changes: str) -> str:
        """`configs/eval/<name>.toml`: the scripted config with `old=new` text replacements."""
        text = (self.cli.workspace / "configs" / "eval" / "scripted.toml").read_text()
        for old, new in changes.items():
            text = text.replace(old, new)
        (self.cli.workspace / "configs" / "eval" / f"{name}.toml").write_text(text)
        return f"configs/eval/{name}.toml"

    def submit(self, config: str, env: dict[str, str] | None = None) -> dict:
        return self.cli.json("eval", "submit", config, "--yes", env=env)

    def finished(self, run: str) -> EvalRunDetail:
        with self.server.client() as client:
            detail = finished(client, run, timeout=180)
        assert detail.eval_run.status == "finished", detail.eval_run.error
        return detail


def _git_in(tree: Path, *args: str) -> str:
    done = subprocess.run(["git", "-c", "user.name=T", "-c", "user.email=t@example.com", *args],
                          cwd=tree, capture_output=True, text=True, check=True)  # fmt: skip
    return done.stdout.strip()


@pytest.fixture(scope="module")
def submit_world(
    tmp_path_factory: pytest.TempPathFactory, module_databases
) -> Iterator[SubmitWorld]:
    if not OFFICIAL.exists():
        pytest.skip("no .venv-interop (make install builds it when osmosis-ai installs here)")
    root = tmp_path_factory.mktemp("official-submit")
    mirrors = root / "mirrors"
    mirror = mirrors / "evals.git"
    subprocess.run(["git", "init", "-q", "--bare", str(mirror)], check=True)
    tree = root / "ws"
    tree.mkdir()
    make_workspace(tree, SUBMIT_ROWS, limit=4, secrets=[])
    (tree / "configs" / "training").mkdir()
    github = f"https://github.com/{SUBMIT_IDENTITY}.git"
    _git_in(tree, "init", "-q", "-b", "main")
    _git_in(tree, "remote", "add", "origin", github)
    _git_in(tree, "config", f"url.{mirror}.pushInsteadOf", github)
    _git_in(tree, "add", "-A")
    _git_in(tree, "commit", "-q", "-m", "workspace")
    _git_in(tree, "push", "-q", "origin", "HEAD:main")
    with FakeModelServer(script={"[wrong]": "0"}) as model:
        server = Server.start(
            root / "server",
            model,
            databases=module_databases,
            OSMOSIS_GIT_URL_REWRITE=f"https://github.com/probe/={mirrors}/",
            # The operator admits the mirrors as well as the GitHub names they stand for.
            OSMOSIS_CLONE_ALLOW=f"github.com/probe/*, {mirrors}",
        )
        try:
            env = clean_env(
                HOME=str(root / "home"),
                OSMOSIS_PLATFORM_URL=server.url,
                OSMOSIS_TOKEN=server.admin_token,
                OSMOSIS_TOKEN_PLATFORM_URL=server.url,
                OSMOSIS_TOKEN_STORE="file",
                NO_COLOR="1",
            )
            env.pop("XDG_CONFIG_HOME", None)
            platform = RunningPlatform(url=server.url, home=server.home, config_dir=root,
                                       env=server.env, databases=module_databases)  # fmt: skip
            cli = OfficialCli(workspace=tree, env=env, platform=platform)
            headers = {
                "Authorization": f"Bearer {server.admin_token}",
                "X-Osmosis-Git": SUBMIT_IDENTITY,
            }
            made = httpx.get(f"{server.url}/api/workspace", headers=headers, timeout=30)
            assert made.status_code == 200, made.text  # the admin's first use makes it
            uploaded = cli.json("dataset", "upload", "data/scripted.jsonl", "--yes")
            assert uploaded["status"] == "success", uploaded
            yield SubmitWorld(server=server, cli=cli, mirror=mirror,
                              commit_sha=_git_in(tree, "rev-parse", "HEAD"))  # fmt: skip
        finally:
            server.stop()


def _ours(world: SubmitWorld, method: str, path: str, **kwargs: object) -> httpx.Response:
    headers = {"Authorization": f"Bearer {world.server.admin_token}",
               "X-Osmosis-Git": SUBMIT_IDENTITY, "X-Osmosis-CLI-Version": "0.3.8"}  # fmt: skip
    return httpx.request(method, world.server.url + path, headers=headers, timeout=60, **kwargs)


def test_eval_submit_queues_a_run_that_finishes_and_info_agrees(submit_world):
    done = submit_world.submit("configs/eval/scripted.toml")
    assert done["status"] == "success", done
    created = done["resource"]
    assert created["name"].startswith("scripted-"), created  # named after the rollout
    detail = submit_world.finished(created["id"])
    assert detail.commit_sha == submit_world.commit_sha and detail.branch == "main"
    ours = _ours(submit_world, "GET", f"/api/eval-runs/{created['id']}").json()
    assert ours["summary"]["pass_rate"] == 0.75 and ours["summary"]["graded"] == 4
    info = submit_world.cli.json("eval", "info", created["name"])["data"]
    assert info["results"]["pass_rate"] == ours["summary"]["pass_rate"]
    assert info["results"]["passed"] == 3 and info["commit_sha"] == submit_world.commit_sha
    listed = submit_world.cli.json("eval", "list")
    assert created["name"] in [item["name"] for item in listed["items"]]
    # The code came from the mirror the rewrite names, never from github.com.
    logs = _ours(submit_world, "GET", f"/api/eval-runs/{created['id']}/logs?limit=200").json()
    assert any(str(submit_world.mirror) in line["message"] for line in logs["logs"]), logs


def test_eval_submit_uses_a_stored_secret(submit_world):
    env = {**submit_world.cli.env, "SHOUT_SECRET": "hush"}
    stored = submit_world.cli.run("secret", "set", "SHOUT_SECRET", "--env", "SHOUT_SECRET", env=env)
    assert stored.returncode == 0, stored.stderr + stored.stdout
    config = submit_world.config("shout", **{"required = []": 'required = ["SHOUT_SECRET"]'})
    done = submit_world.submit(config)  # not in the environment: the stored one is used
    detail = submit_world.finished(done["resource"]["id"])
    assert detail.resolved_secret_scopes == {"SHOUT_SECRET": "user"}
    assert detail.summary.pass_rate == 0.75


def test_eval_submit_sends_a_secret_from_the_environment_for_that_run_only(submit_world):
    env = {**submit_world.cli.env, "RUN_ONLY_SECRET": "whisper"}
    config = submit_world.config("envsecret", **{"required = []": 'required = ["RUN_ONLY_SECRET"]'})
    done = submit_world.submit(config, env=env)  # never stored: the environment provides it
    detail = submit_world.finished(done["resource"]["id"])
    assert detail.resolved_secret_scopes == {"RUN_ONLY_SECRET": "run"}
    assert detail.summary.pass_rate == 0.75
    listed = submit_world.cli.json("secret", "list")["items"]
    assert "RUN_ONLY_SECRET" not in [item["name"] for item in listed]  # used, not kept


def test_a_missing_required_secret_is_refused_in_the_official_shape(submit_world):
    config = submit_world.config("missing", **{"required = []": 'required = ["MISSING_KEY"]'})
    done = submit_world.cli.run("--json", "eval", "submit", config, "--yes")
    assert done.returncode != 0 and "MISSING_KEY" in done.stderr, done.stderr
    # The client checks before it sends; a body that names it anyway gets the server's answer.
    body = {
        "experiment_config": {"rollout": "scripted", "entrypoint": "main.py",
                              "model_path": "openai/fake-model", "dataset": "scripted"},
        "secrets": {"required": ["MISSING_KEY"]},
    }  # fmt: skip
    answer = _ours(submit_world, "POST", "/api/cli/eval-runs", json=body)
    assert answer.status_code == 404, answer.text
    assert answer.json()["message"] == "Secret(s) not found: MISSING_KEY"
    assert answer.json()["missing"] == ["MISSING_KEY"] and "error" not in answer.json()


def test_eval_submit_of_a_branch_never_pushed_says_so(submit_world):
    config = submit_world.config(
        "branch", **{'dataset = "scripted"': 'dataset = "scripted"\nbranch = "nope"'}
    )
    done = submit_world.cli.run("--json", "eval", "submit", config, "--yes")
    assert done.returncode != 0
    error = json.loads(done.stderr.strip().splitlines()[-1])["error"]
    assert "branch 'nope' is not on the workspace's origin" in error["message"], error


def test_an_entrypoint_only_in_an_unpushed_commit_fails_with_the_push_advice(submit_world):
    # The official client does not look at what was pushed: the server is what can say why.
    later = submit_world.cli.workspace / "rollouts" / "scripted" / "later.py"
    later.write_text((later.parent / "main.py").read_text())
    try:
        config = submit_world.config(
            "later", **{'entrypoint = "main.py"': 'entrypoint = "later.py"'}
        )
        run = submit_world.submit(config)["resource"]
        with submit_world.server.client() as client:
            detail = finished(client, run["id"], timeout=120)
    finally:
        later.unlink()
    error = detail.eval_run.error or ""
    assert detail.eval_run.status == "failed", error
    assert "rollouts/scripted/later.py does not exist" in error
    assert f"in commit {submit_world.commit_sha[:12]}" in error and "git push" in error
    assert "create it" not in error


def test_a_rewrite_never_admits_what_the_allowlist_does_not(tmp_path, databases):
    """The rewritten URL is what the server clones: `OSMOSIS_CLONE_ALLOW` must admit it too."""
    from fastapi.testclient import TestClient

    from osmosis.platform import create_app

    mirrors = tmp_path / "mirrors"
    subprocess.run(["git", "init", "-q", "--bare", str(mirrors / "evals.git")], check=True)
    rewrite = f"https://github.com/probe/={mirrors}/"
    settings = databases.settings(
        tmp_path / "home", clone_allow="github.com/probe/*", git_url_rewrite=rewrite
    )
    app = create_app(settings)
    try:
        token = json.loads(settings.credentials_file.read_text())["token"]
        headers = {"Authorization": f"Bearer {token}", "X-Osmosis-Git": SUBMIT_IDENTITY}
        body = {"experiment_config": {"rollout": "r", "entrypoint": "main.py",
                                      "model_path": "openai/m", "dataset": "d"}}  # fmt: skip
        with TestClient(app, base_url="http://127.0.0.1") as client:
            answer = client.post("/api/cli/eval-runs", headers=headers, json=body)
        assert answer.status_code == 403, answer.text
        assert answer.json()["code"] == "ORIGIN_NOT_ALLOWED"
        assert str(mirrors) in answer.json()["message"]
    finally:
        app.state.engine.dispose()
    # Admitted, but no mirror there: git's reason, under a code the official CLI passes on.
    admitted = settings.replace(clone_allow=f"github.com/probe/*, {mirrors}")
    app = create_app(admitted)
    try:
        headers["X-Osmosis-Git"] = "probe/absent"
        with TestClient(app, base_url="http://127.0.0.1") as client:
            answer = client.post("/api/cli/eval-runs", headers=headers, json=body)
        assert answer.status_code == 502, answer.text
        assert answer.json()["code"] == "GIT_REMOTE_UNREACHABLE"
        assert "absent.git" in answer.json()["message"] and "fatal" in answer.json()["message"]
    finally:
        app.state.engine.dispose()


def _status(world: SubmitWorld, run: str) -> str:
    return str(_ours(world, "GET", f"/api/eval-runs/{run}").json()["eval_run"]["status"])


def _wait_status(world: SubmitWorld, run: str, wanted: set[str], timeout: float = 120) -> str:
    deadline = time.monotonic() + timeout
    while (status := _status(world, run)) not in wanted:
        assert time.monotonic() < deadline, f"{run} is {status}, not {sorted(wanted)}"
        time.sleep(0.3)
    return status


def test_eval_stop_and_retry_of_a_running_run(submit_world):
    """A run whose rollout hangs: the official CLI stops it while it runs, retries it (it runs
    again), and stops it again."""
    hang = submit_world.cli.workspace / "data" / "hang.jsonl"
    hang.write_text("".join(json.dumps(row("hang", a, 7)) + "\n" for a in range(2, 6)))
    uploaded = submit_world.cli.json("dataset", "upload", "data/hang.jsonl", "--yes")
    assert uploaded["status"] == "success", uploaded
    config = submit_world.config("hang", **{'dataset = "scripted"': 'dataset = "hang"'})
    run = submit_world.submit(config)["resource"]["name"]
    _wait_status(submit_world, run, {"running"})
    stopped = submit_world.cli.run("--json", "eval", "stop", run, "-y")
    assert stopped.returncode == 0, stopped.stderr + stopped.stdout
    assert _wait_status(submit_world, run, {"stopped", "failed", "finished"}) == "stopped"
    retried = submit_world.cli.json("eval", "retry", run, "-y")
    assert retried["status"] == "success", retried
    assert _wait_status(submit_world, run, {"pending", "running"}) in {"pending", "running"}
    _wait_status(submit_world, run, {"running"})
    again = submit_world.cli.run("--json", "eval", "stop", run, "-y")
    assert again.returncode == 0, again.stderr + again.stdout
    assert _wait_status(submit_world, run, {"stopped", "failed", "finished"}) == "stopped"


def test_rewrite_rules_and_the_written_config():
    import tomllib

    from osmosis.platform.core.settings import Settings, SettingsError
    from osmosis.platform.services.submit_source import config_text
    from osmosis.platform.services.url_rewrite import clone_url, parse_url_rewrite

    rules = parse_url_rewrite("https://github.com/=/srv/all/, https://github.com/acme/=/srv/acme/")
    assert clone_url("acme/evals", rules) == "/srv/acme/evals.git"  # the longest FROM wins
    assert clone_url("bea/ws", rules) == "/srv/all/bea/ws.git"
    assert clone_url("git.example.com/team/ws", rules) == "https://git.example.com/team/ws.git"
    with pytest.raises(SettingsError, match="FROM=TO"):
        Settings(git_url_rewrite="https://github.com/acme/")
    text = config_text(
        experiment={"rollout": "r", "entrypoint": "main.py", "model_path": "openai/m",
                    "dataset": "d", "branch": 'we"ird'},
        evaluation={"n": 2, "pass_threshold": 0.5, "agent_workflow_timeout_s": float("inf")},
        advanced={"nested": {"k": [1, "v\x7f"]}},
        env={"A KEY": "ünï"},
        required=["API_KEY"],
    )  # fmt: skip
    assert tomllib.loads(text) == {
        "experiment": {"rollout": "r", "entrypoint": "main.py", "model_path": "openai/m",
                       "dataset": "d", "branch": 'we"ird'},
        "evaluation": {"n": 2, "pass_threshold": 0.5, "agent_workflow_timeout_s": float("inf")},
        "advanced": {"nested": {"k": [1, "v\x7f"]}},
        "env": {"A KEY": "ünï"},
        "secrets": {"required": ["API_KEY"]},
    }  # fmt: skip


# -- root --workspace NAME -------------------------------------------------------------------
def test_our_cli_and_the_official_name_a_workspace_with_root_workspace(
    official, uploaded, seeded_runs, tmp_path
):
    """`--workspace NAME` from outside any checkout: both CLIs send `X-Osmosis-Workspace`
    and see that workspace's datasets and runs, as from inside it."""
    from tests.platform.conftest import CLI

    outside = tmp_path / "not-a-checkout"
    outside.mkdir()
    url = official.platform.url
    env = clean_env(HOME=str(tmp_path / "home"), OSMOSIS_CONFIG_DIR=str(tmp_path / "config"),
                    OSMOSIS_PLATFORM_URL=url, OSMOSIS_TOKEN=official.platform.admin_token,
                    OSMOSIS_TOKEN_PLATFORM_URL=url)  # fmt: skip

    def ours(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*CLI, "--json", *args], cwd=outside, env=env,
                              capture_output=True, text=True, timeout=120)  # fmt: skip

    unscoped = ours("dataset", "list")
    assert unscoped.returncode != 0 and "WORKSPACE_REQUIRED" in unscoped.stderr, unscoped.stderr
    datasets = ours("dataset", "list", "--workspace", IDENTITY)  # after the command, too
    assert datasets.returncode == 0, datasets.stderr
    assert '"add"' in datasets.stdout
    runs = ours("--workspace", IDENTITY, "eval", "list")
    assert runs.returncode == 0, runs.stderr
    for name in seeded_runs:
        assert f'"{name}"' in runs.stdout
    other = ours("--workspace", "probe/empty", "eval", "list")
    assert other.returncode == 0, other.stderr
    assert SEEDED not in other.stdout  # the header, not the directory, chose the workspace

    done = subprocess.run([str(OFFICIAL), "--json", "--workspace", IDENTITY, "dataset", "list"],
                          cwd=outside, env=official.env, capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr + done.stdout
    names = [d["file_name"] for d in json.loads(done.stdout)["items"]]
    ours_names = [d["name"] for d in official.ours("GET", "/api/datasets").json()["datasets"]]
    assert "add" in names and names == ours_names


# -- eval download, twice ----------------------------------------------------------------------
def test_eval_download_all_twice_transfers_nothing_the_second_time(official, seeded_runs, tmp_path):
    def download() -> dict:
        done = official.run("--json", "eval", "download", SEEDED, "--type", "all",
                            "-o", str(tmp_path), "-y")  # fmt: skip
        assert done.returncode == 0, done.stderr + done.stdout
        return dict(json.loads(done.stdout)["resource"])

    first = download()
    every = {"types": "metrics,trajectories,artifacts,logs"}  # what the official `all` asks
    manifest = official.ours("GET", f"/api/eval-runs/{SEEDED}/files", params=every).json()
    assert first["files_downloaded"] == first["total_files"] == len(manifest["files"])
    assert first["bytes_downloaded"] == sum(f["size"] for f in manifest["files"]) > 0
    stamps = {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*") if p.is_file()}

    second = download()
    assert second["files_downloaded"] == 0 and second["bytes_downloaded"] == 0, second
    assert second["files_skipped"] == second["total_files"] == first["total_files"]
    assert {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*") if p.is_file()} == stamps


# -- eval run on a platform dataset --------------------------------------------------------------
def test_the_official_eval_run_reads_a_platform_dataset(official, tmp_path):
    """The official `eval run` with no `--dataset-file` fetches the config's dataset from the
    platform (`/api/cli/datasets/{name}/download`), runs every row against the scripted model
    and reports as many rows as the platform holds."""
    from tests.e2e.conftest import model_env
    from tests.e2e.workspace import OSMOSIS_AI_MAIN

    # A workspace of its own, so the dataset does not join the other tests' lists.
    identity = "probe/run-ws"
    # Four rows: the official client refuses to upload fewer.
    rows = [row("ok", 2, 7), row("ok", 3, 7), row("ok", 4, 7), row("wrong", 5, 7)]
    tree = tmp_path / "ws"
    make_workspace(tree, rows, n=1, limit=len(rows), main=OSMOSIS_AI_MAIN)
    # Not `osmosis-ai[server]==0.3.8` resolved from the uv cache: offline, that passed only
    # when an earlier test had left osmosis-ai's dependencies there.
    python = interop_rollout_env(tree / "rollouts" / "scripted")
    (tree / "configs" / "training").mkdir()
    for args in (["init", "-q", "-b", "main"],
                 ["remote", "add", "origin", f"https://github.com/{identity}.git"]):  # fmt: skip
        subprocess.run(["git", *args], cwd=tree, check=True, capture_output=True)
    uploaded = subprocess.run([str(OFFICIAL), "--json", "dataset", "upload",
                               "data/scripted.jsonl", "--yes"], cwd=tree, env=official.env,
                              capture_output=True, text=True, timeout=120)  # fmt: skip
    assert uploaded.returncode == 0, uploaded.stderr + uploaded.stdout
    (tree / "data" / "scripted.jsonl").unlink()  # only the platform has it now

    with FakeModelServer(script={"[wrong]": "0"}) as model:
        uv_cache = Path(os.environ.get("UV_CACHE_DIR") or Path.home() / ".cache" / "uv")
        env = model_env(model, LITELLM_LOCAL_MODEL_COST_MAP="True", UV_OFFLINE="1",
                        UV_CACHE_DIR=str(uv_cache), UV_PYTHON=python,
                        UV_PYTHON_DOWNLOADS="never", NO_COLOR="1",
                        **{k: v for k, v in official.env.items()
                           if k.startswith("OSMOSIS_") or k == "HOME"})  # fmt: skip
        done = subprocess.run([str(OFFICIAL), "--json", "eval", "run",
                               "configs/eval/scripted.toml", "--name", "from-platform", "-y"],
                              cwd=tree, env=env, capture_output=True, text=True,
                              timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:] + done.stdout[-3000:]
    resource = json.loads(done.stdout)["resource"]
    headers = {"Authorization": f"Bearer {official.platform.admin_token}",
               "X-Osmosis-Git": identity}  # fmt: skip
    ours = httpx.get(official.platform.url + "/api/datasets/scripted", headers=headers,
                     timeout=30).json()  # fmt: skip
    assert ours["rows"] == len(rows)
    assert resource["dataset_source"] == "download", resource  # not a local file
    assert resource["total_work_items"] == resource["metrics"]["total_samples"] == ours["rows"]
    assert (resource["metrics"]["passed"], resource["metrics"]["graded"]) == (3, 4)
