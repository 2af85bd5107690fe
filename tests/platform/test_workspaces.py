"""Workspaces: created on first use, visible to members only, checked and fixed by doctor.

A real server process and a real git repository, driven through the CLI and over HTTP.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Mapping
from pathlib import Path

import httpx
import pytest

from tests.platform.conftest import CLI, clean_env, osmosis_json

pytestmark = pytest.mark.slow


def cli(*args: str, env: Mapping[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, *args], env=dict(env), cwd=cwd, capture_output=True, text=True, timeout=90
    )


def cli_json(*args: str, env: Mapping[str, str], cwd: Path) -> dict:
    result = cli("--json", *args, env=env, cwd=cwd)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def cli_error(*args: str, env: Mapping[str, str], cwd: Path) -> dict:
    result = cli("--json", *args, env=env, cwd=cwd)
    assert result.returncode == 1, result.stdout
    return json.loads(result.stderr)["error"]


def make_repo(root: Path, name: str = "tree") -> Path:
    """`git init` with `origin` pointing at a local bare-repository path."""
    tree = root / name
    tree.mkdir(parents=True)
    subprocess.run(["git", "init", "-q"], cwd=tree, check=True)
    remote = root / f"{name}-remote.git"
    subprocess.run(["git", "remote", "add", "origin", str(remote)], cwd=tree, check=True)
    return tree


def new_user(platform, name: str) -> tuple[dict, dict[str, str]]:
    """A user created by the admin, and an environment that acts as them."""
    created = osmosis_json(
        "admin", "user", "create", name, "--email", f"{name}@example.com", env=platform.env
    )
    env = clean_env(**{**platform.env, "OSMOSIS_TOKEN": created["resource"]["token"]})
    return created["resource"], env


def headers(token: str, git: str | None = None) -> dict[str, str]:
    result = {"Authorization": f"Bearer {token}"}
    if git is not None:
        result["X-Osmosis-Git"] = git
    return result


def test_the_first_use_creates_the_workspace_with_its_user_as_owner(running_platform, tmp_path):
    tree = make_repo(tmp_path)
    info = cli_json("workspace", "info", env=running_platform.env, cwd=tree)["data"]
    identity = f"file://{(tmp_path / 'tree-remote').resolve()}"
    assert info["identity"] == identity == info["git"]["identity"]
    assert info["role"] == "owner" and info["created_by"] == "admin"
    assert [m["name"] for m in info["members"]] == ["admin"]
    assert info["workspace_directory"] == str(tree.resolve())
    again = cli_json("workspace", "info", env=running_platform.env, cwd=tree)["data"]
    assert again["id"] == info["id"]
    shown = cli("workspace", "info", env={**running_platform.env, "COLUMNS": "80"}, cwd=tree)
    assert "admin (owner)" in shown.stdout and '"user_id"' not in shown.stdout


def test_outsiders_get_the_same_404_as_for_a_workspace_that_does_not_exist(
    running_platform, tmp_path
):
    tree = make_repo(tmp_path)
    owner = cli_json("workspace", "info", env=running_platform.env, cwd=tree)["data"]
    outsider, as_outsider = new_user(running_platform, "outsider")

    error = cli_error("workspace", "info", env=as_outsider, cwd=tree)
    assert error["code"] == "NOT_FOUND"

    token = as_outsider["OSMOSIS_TOKEN"]
    url = running_platform.url
    answers = [
        httpx.delete(f"{url}/api/secrets/X_KEY", headers=headers(token, git))
        for git in (owner["identity"], "nobody/never-created")
    ]
    answers += [
        httpx.post(f"{url}/api/workspace/members", headers=headers(token, git), json=body)
        for git in (owner["identity"], "nobody/never-created")
        for body in ({"user_id": outsider["id"]},)
    ]
    for response in answers:
        assert response.status_code == 404
    messages = {response.json()["error"]["message"] for response in answers}
    assert messages == {error["message"]}
    assert "exist" not in error["message"] and owner["identity"] not in error["message"]


def test_a_member_adds_a_user_who_then_sees_the_workspace(running_platform, tmp_path):
    tree = make_repo(tmp_path)
    cli_json("workspace", "info", env=running_platform.env, cwd=tree)
    _, as_bea = new_user(running_platform, "bea")

    added = cli_json(
        "workspace", "member", "add", "bea@example.com", env=running_platform.env, cwd=tree
    )
    assert added["operation"] == "workspace.member.add"
    assert {m["name"] for m in added["resource"]["members"]} == {"admin", "bea"}

    info = cli_json("workspace", "info", env=as_bea, cwd=tree)["data"]
    assert info["role"] == "member"

    twice = cli_error("workspace", "member", "add", "bea@example.com", env=as_bea, cwd=tree)
    assert twice["code"] == "CONFLICT"
    unknown = cli_error("workspace", "member", "add", "nobody@example.com", env=as_bea, cwd=tree)
    assert unknown["code"] == "NOT_FOUND" and "nobody@example.com" in unknown["message"]


def test_workspace_routes_need_the_git_header(running_platform):
    token = running_platform.admin_token
    for method, path in [
        ("GET", "/api/workspace"),
        ("GET", "/api/secrets"),
        ("DELETE", "/api/secrets/X_KEY"),
    ]:
        response = httpx.request(method, f"{running_platform.url}{path}", headers=headers(token))
        assert response.status_code == 400
        assert response.json()["error"]["code"] == "GIT_SCOPE_HEADER_REQUIRED"


def test_commands_outside_a_repository_or_without_origin_need_a_workspace(
    running_platform, tmp_path
):
    outside = tmp_path / "plain"
    outside.mkdir()
    error = cli_error("workspace", "info", env=running_platform.env, cwd=outside)
    assert error["code"] == "WORKSPACE_REQUIRED"

    subprocess.run(["git", "init", "-q"], cwd=outside, check=True)
    result = cli("secret", "list", env=running_platform.env, cwd=outside)
    assert result.returncode == 1
    assert "origin" in result.stderr and "git remote add origin" in result.stderr
    assert "Traceback" not in result.stderr


# -- doctor: local only, no platform --------------------------------------------------------
def test_doctor_lists_every_missing_directory_and_fix_creates_them(tmp_path):
    tree = make_repo(tmp_path)
    (tree / "data").mkdir()
    env = clean_env(OSMOSIS_PLATFORM_URL="http://127.0.0.1:9", OSMOSIS_HOME=str(tmp_path / "h"))

    error = cli_error("doctor", env=env, cwd=tree)
    assert error["code"] == "VALIDATION"
    assert error["details"]["missing"] == ["rollouts/", "configs/eval/"]
    human = cli("doctor", env=env, cwd=tree)
    assert "osmosis doctor --fix" in human.stderr

    fixed = cli_json("doctor", "--fix", env=env, cwd=tree)
    assert fixed["resource"]["created"] == ["rollouts/", "configs/eval/"]
    assert (tree / "rollouts").is_dir() and (tree / "configs" / "eval").is_dir()

    ok = cli_json("doctor", env=env, cwd=tree / "data")
    assert ok["resource"]["missing"] == [] and ok["resource"]["created"] == []
    assert ok["resource"]["workspace_directory"] == str(tree.resolve())


def test_doctor_without_an_origin_checks_the_layout_and_says_what_origin_is_for(tmp_path):
    tree = tmp_path / "tree"
    tree.mkdir()
    subprocess.run(["git", "init", "-q"], cwd=tree, check=True)
    fixed = cli("doctor", "--fix", env=clean_env(), cwd=tree)
    assert fixed.returncode == 0 and (tree / "rollouts").is_dir()
    warning = " ".join(fixed.stderr.split())
    assert "no `origin` remote" in warning and "platform commands need one" in warning
    assert "(hint:" not in warning


def test_doctor_outside_a_repository_is_workspace_required(tmp_path):
    error = cli_error("doctor", "--fix", env=clean_env(), cwd=tmp_path)
    assert error["code"] == "WORKSPACE_REQUIRED"
    assert list(tmp_path.iterdir()) == []
