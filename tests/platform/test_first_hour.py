"""The first hour against a platform: a workspace from `osmosis init`, pushed to a bare
`origin`, its dataset uploaded, and what the commands then say. A real server process, real
git repositories, the real CLI; the model is the scripted one where a run needs one."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import time
from collections.abc import Iterator, Mapping
from datetime import datetime
from pathlib import Path

import httpx
import pytest

from osmosis.testing import FakeModelServer
from osmosis.workspace import normalise_identity
from tests.e2e.conftest import model_env
from tests.platform.conftest import CLI, RunningPlatform, clean_env

pytestmark = pytest.mark.slow

CONFIG = "configs/eval/add.toml"


def cli(*args: str, env: Mapping[str, str], cwd: Path, timeout: float = 120):
    return subprocess.run(
        [*CLI, *args], env=dict(env), cwd=cwd, capture_output=True, text=True, timeout=timeout
    )


def cli_json(*args: str, env: Mapping[str, str], cwd: Path, timeout: float = 120) -> dict:
    done = cli("--json", *args, env=env, cwd=cwd, timeout=timeout)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def cli_error(*args: str, env: Mapping[str, str], cwd: Path) -> dict:
    done = cli("--json", *args, env=env, cwd=cwd)
    assert done.returncode != 0, done.stdout
    return json.loads(done.stderr.strip().splitlines()[-1])["error"]


def git(*args: str, cwd: Path) -> str:
    done = subprocess.run(
        ["git", "-c", "user.name=Ada", "-c", "user.email=ada@example.com", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.strip()


@pytest.fixture(scope="module")
def pushed(running_platform: RunningPlatform, tmp_path_factory) -> Path:
    """`osmosis init ws`, committed and pushed to a bare `origin` (no origin/HEAD in the
    clone, as after `git remote add` + `git push`), with `data/add.jsonl` uploaded."""
    root = tmp_path_factory.mktemp("first-hour")
    env = running_platform.env
    cli_json("init", "ws", env=env, cwd=root)
    ws, origin = root / "ws", root / "origin.git"
    git("init", "-q", "--bare", "-b", "main", str(origin), cwd=root)
    git("remote", "add", "origin", str(origin), cwd=ws)
    git("add", "-A", cwd=ws)
    git("commit", "-q", "-m", "workspace", cwd=ws)
    git("push", "-q", "-u", "origin", "main", cwd=ws)
    cli_json("dataset", "upload", "data/add.jsonl", "-y", env=env, cwd=ws)
    return ws


def clone(pushed: Path, where: Path) -> Path:
    origin = git("remote", "get-url", "origin", cwd=pushed)
    git("clone", "-q", origin, str(where), cwd=pushed.parent)
    return where


@pytest.fixture(scope="module")
def fake_model() -> Iterator[FakeModelServer]:
    with FakeModelServer() as server:
        yield server


def local_model_config(tree: Path, model: str = "openai/fake-model") -> None:
    """The committed config points at the local model; a local edit points it elsewhere
    (config values come from the local file)."""
    config = tree / CONFIG
    config.write_text(config.read_text().replace("local/smollm2-135m", model))


# -- 17.3: the default branch ------------------------------------------------------------------
def test_submit_from_a_feature_branch_runs_origins_default_branch(
    running_platform, pushed, tmp_path
):
    tree = clone(pushed, tmp_path / "clone")
    main = git("rev-parse", "HEAD", cwd=tree)
    git("checkout", "-q", "-b", "feature", cwd=tree)
    git("commit", "-q", "--allow-empty", "-m", "wip", cwd=tree)
    git("push", "-q", "-u", "origin", "feature", cwd=tree)
    asked = cli_error("eval", "submit", CONFIG, env=running_platform.env, cwd=tree)
    assert asked["code"] == "INTERACTIVE_REQUIRED"  # what it would submit, without -y
    summary = asked["details"]["summary"]
    assert (summary["Branch"], summary["Commit"]) == ("main", main[:7])


# -- 17.6: messages that tell the truth ---------------------------------------------------------
def test_download_to_a_directory_path_puts_the_file_inside_it(running_platform, pushed, tmp_path):
    done = cli_json(
        "dataset", "download", "add", "-o", f"{tmp_path}/out/", env=running_platform.env, cwd=pushed
    )
    written = tmp_path / "out" / "add.jsonl"
    assert done["resource"]["path"] == str(written)
    assert written.read_bytes() == (pushed / "data" / "add.jsonl").read_bytes()


def test_an_identical_overwrite_is_unchanged_and_makes_no_version(
    running_platform, pushed, tmp_path
):
    env = running_platform.env
    before = cli_json("dataset", "info", "add", env=env, cwd=pushed)["data"]
    again = cli_json(
        "dataset", "upload", "data/add.jsonl", "--overwrite", "-y", env=env, cwd=pushed
    )
    assert again["resource"]["unchanged"] is True and again["resource"]["version"] == 1
    assert "unchanged" in again["message"] and "no new version" in again["message"]

    # A client that sends the bytes anyway (not our CLI) gets the same version back.
    data = (pushed / "data" / "add.jsonl").read_bytes()
    identity = normalise_identity(git("remote", "get-url", "origin", cwd=pushed))
    sent = httpx.post(
        f"{running_platform.url}/api/datasets",
        params={
            "file_name": "add.jsonl",
            "size": len(data),
            "sha256": hashlib.sha256(data).hexdigest(),
            "overwrite": "true",
        },
        headers={
            "Authorization": f"Bearer {running_platform.admin_token}",
            "X-Osmosis-Git": identity,
            "Content-Type": "application/octet-stream",
        },
        content=data,
        timeout=60,
    )
    assert sent.status_code < 300, sent.text
    assert sent.json()["version"] == 1
    after = cli_json("dataset", "info", "add", env=env, cwd=pushed)["data"]
    assert after["version_count"] == before["version_count"] == 1


def wait_for(env: Mapping[str, str], cwd: Path, name: str, timeout: float = 120) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        data = cli_json("eval", "info", name, env=env, cwd=cwd)["data"]
        if data["eval_run"]["status"] in ("finished", "failed", "stopped"):
            return data
        assert time.monotonic() < deadline, data["eval_run"]
        time.sleep(0.5)


def test_logs_json_never_passes_a_page_off_as_the_total(running_platform, pushed, tmp_path):
    env = running_platform.env
    tree = clone(pushed, tmp_path / "clone")
    # No such provider on the server: the run fails at its model pre-flight, with log lines.
    local_model_config(tree, "openai/not-served-here")
    submitted = cli_json("eval", "submit", CONFIG, "-y", env=env, cwd=tree)
    name = submitted["resource"]["name"]
    wait_for(env, tree, name)
    page = cli_json("eval", "logs", name, "--limit", "1", env=env, cwd=tree)
    assert len(page["items"]) == 1 and page["has_more"] is True
    assert page["total_count"] is None
    datasets = cli_json("dataset", "logs", "add", "--limit", "1", env=env, cwd=tree)
    assert datasets["has_more"] is True and datasets["total_count"] is None


def test_logs_follow_prints_every_entry_once_and_ends_with_the_run(
    running_platform, pushed, tmp_path
):
    env = running_platform.env
    tree = clone(pushed, tmp_path / "clone")
    local_model_config(tree, "openai/not-served-here")
    name = cli_json("eval", "submit", CONFIG, "-y", env=env, cwd=tree)["resource"]["name"]
    # Started while the run is queued or running; it returns by itself once the run ended.
    followed = cli("--json", "eval", "logs", name, "--follow", env=env, cwd=tree, timeout=120)
    assert followed.returncode == 0, followed.stderr
    assert wait_for(env, tree, name)["eval_run"]["status"] == "failed"
    streamed = [json.loads(line)["message"] for line in followed.stdout.splitlines()]
    paged, cursor = [], None
    while True:
        extra = ["--cursor", cursor] if cursor else []
        page = cli_json("eval", "logs", name, "--limit", "2", *extra, env=env, cwd=tree)
        paged += [item["message"] for item in page["items"]]
        cursor = page["next_cursor"]
        if not cursor:
            break
    assert streamed == paged and len(paged) >= 3
    assert any("pre-flight failed" in message for message in streamed)


def test_a_retried_run_keeps_its_first_start_and_counts_active_time(
    running_platform, pushed, tmp_path
):
    env = running_platform.env
    tree = clone(pushed, tmp_path / "clone")
    local_model_config(tree, "openai/not-served-here")
    name = cli_json("eval", "submit", CONFIG, "-y", env=env, cwd=tree)["resource"]["name"]
    first = wait_for(env, tree, name)["eval_run"]
    time.sleep(3)  # the gap between the two sessions is not active time
    cli_json("eval", "retry", name, "-y", env=env, cwd=tree)
    second = wait_for(env, tree, name)["eval_run"]
    assert second["started_at"] == first["started_at"]
    wall_ms = (
        datetime.fromisoformat(second["completed_at"]) - datetime.fromisoformat(first["started_at"])
    ).total_seconds() * 1000
    assert first["duration_ms"] < second["duration_ms"] < wall_ms - 2500


# -- 17.4: eval run fetches the platform dataset by name, and caches it ------------------------
def test_eval_run_without_a_local_file_uses_the_platform_dataset_and_caches_it(
    running_platform, pushed, fake_model, tmp_path
):
    tree = clone(pushed, tmp_path / "clone")
    (tree / "data" / "add.jsonl").unlink()
    local_model_config(tree)
    env = model_env(fake_model, **running_platform.env, XDG_CACHE_HOME=str(tmp_path / "cache"))

    def run(name: str) -> dict:
        done = cli_json(
            "eval", "run", CONFIG, "--rows", "0-1", "--name", name, "-y", env=env, cwd=tree
        )
        return done["resource"]

    first = run("first")
    assert first["dataset_source"] == "download"
    assert first["metrics"]["total_samples"] == 8 and first["metrics"]["pass_rate"] == 1.0
    (cached,) = (tmp_path / "cache" / "osmosis" / "datasets").rglob("add.jsonl")
    assert cached.read_bytes() == (pushed / "data" / "add.jsonl").read_bytes()
    assert run("second")["dataset_source"] == "cache"

    cached.write_text('{"user_prompt": "What is 1 + 1?", "ground_truth": "3"}\n')  # damaged
    assert run("third")["dataset_source"] == "download"
    assert cached.read_bytes() == (pushed / "data" / "add.jsonl").read_bytes()


def test_eval_run_without_a_local_file_or_a_platform_says_both_ways_out(
    pushed, fake_model, tmp_path
):
    tree = tmp_path / "copy"
    shutil.copytree(pushed, tree)
    (tree / "data" / "add.jsonl").unlink()
    env = clean_env(HOME=str(tmp_path), OSMOSIS_HOME=str(tmp_path / "none"))
    error = cli_error("eval", "run", CONFIG, "-y", env=env, cwd=tree)
    assert "dataset 'add' not found" in error["message"]
    assert error["details"]["dataset"] == "add"
    human = cli("eval", "run", CONFIG, "-y", env=env, cwd=tree)
    assert "--dataset-file" in human.stderr and "log in" in human.stderr


def test_without_limit_the_platform_keeps_its_ten_percent_sample(
    running_platform, pushed, tmp_path
):
    env = running_platform.env
    tree = clone(pushed, tmp_path / "clone")
    local_model_config(tree, "openai/not-served-here")  # it only needs to plan the rows
    config = tree / CONFIG
    config.write_text(config.read_text().replace("limit = 24", "# no limit"))
    name = cli_json("eval", "submit", CONFIG, "-y", env=env, cwd=tree)["resource"]["name"]
    data = wait_for(env, tree, name)
    assert data["summary"]["progress"]["total"] == 3 * 4  # ceil(24 rows * 10 %) x n = 4
    assert data["dataset_df_stats"]["rows"] == 24
