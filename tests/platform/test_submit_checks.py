"""`osmosis eval submit` checks what the server will see, before it sends anything.

Real git work trees whose `origin` is a local bare repository; the CLI as a subprocess. The
git checks come before any request: with the platform URL on a closed port, the refusal is
still the git one. The provider-key and row-count checks ask a real server.
"""

from __future__ import annotations

import shutil
import socket
from pathlib import Path

import pytest

from tests.e2e.workspace import make_workspace
from tests.platform.conftest import clean_env
from tests.platform.test_eval_cli import CONFIG, ROWS, confirmation
from tests.platform.test_workspaces import cli, cli_error, cli_json
from tests.unit.test_git_state import git, new_repo


def workspace(root: Path, *, limit: int | None = None, secrets: list[str] = ()) -> Path:
    """rollouts/scripted, its config and data, committed on `main` and pushed to `origin`."""
    tree = new_repo(root)
    make_workspace(tree, ROWS, limit=limit, secrets=list(secrets))
    (tree / ".gitignore").write_text(".osmosis/\n")
    git(tree, "add", ".")
    git(tree, "commit", "-q", "-m", "workspace")
    git(tree, "push", "-q", "-u", "origin", "main")
    return tree


def second_rollout(tree: Path) -> str:
    """rollouts/second, a copy of rollouts/scripted, with configs/eval/second.toml."""
    shutil.copytree(tree / "rollouts" / "scripted", tree / "rollouts" / "second")
    config = tree / "configs" / "eval" / "second.toml"
    config.write_text(
        (tree / CONFIG).read_text().replace('rollout = "scripted"', 'rollout = "second"')
    )
    return "configs/eval/second.toml"


@pytest.fixture
def nowhere_env(tmp_path: Path) -> dict[str, str]:
    """Logged in to a platform on a closed port: any request would fail to connect."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return clean_env(
        OSMOSIS_HOME=str(tmp_path / "home"),
        OSMOSIS_CONFIG_DIR=str(tmp_path / "cfg"),
        OSMOSIS_PLATFORM_URL=f"http://127.0.0.1:{port}",
        OSMOSIS_TOKEN="osm_not_a_real_token",
    )


# -- git: refused before any request -----------------------------------------------------------
def test_a_rollout_committed_but_not_pushed_is_refused_naming_git_push(tmp_path, nowhere_env):
    tree = workspace(tmp_path)
    config = second_rollout(tree)
    git(tree, "add", ".")
    git(tree, "commit", "-q", "-m", "second rollout")
    error = cli_error("eval", "submit", config, "-y", env=nowhere_env, cwd=tree)
    assert error["message"].startswith(
        "rollouts/second/main.py is committed locally but not pushed: the platform runs origin/main"
    )
    plain = cli("--plain", "eval", "submit", config, "-y", env=nowhere_env, cwd=tree)
    assert plain.returncode == 1
    assert "hint: git push origin main" in plain.stderr
    assert "connect" not in plain.stderr.lower()  # no request was attempted
    # Pushed, the same submit gets past git and only then meets the closed port.
    git(tree, "push", "-q", "origin", "main")
    after = cli_error("eval", "submit", config, "-y", env=nowhere_env, cwd=tree)
    assert "not pushed" not in after["message"]


def test_a_rollout_never_committed_is_refused_naming_git_add(tmp_path, nowhere_env):
    tree = workspace(tmp_path)
    config = second_rollout(tree)
    plain = cli("--plain", "eval", "submit", config, "-y", env=nowhere_env, cwd=tree)
    assert plain.returncode == 1
    assert "rollouts/second/main.py is not committed" in plain.stderr
    assert "hint: git add rollouts/second && git commit && git push" in plain.stderr


def test_an_origin_tip_this_clone_has_not_fetched_says_fetch_first(tmp_path, nowhere_env):
    tree = workspace(tmp_path)
    other = tmp_path / "other"
    git(tmp_path, "clone", "-q", str(tmp_path / "origin.git"), str(other))
    (other / "NOTES.md").write_text("from another clone\n")
    git(other, "add", "NOTES.md")
    git(other, "commit", "-q", "-m", "notes")
    git(other, "push", "-q", "origin", "main")
    tip = git(other, "rev-parse", "HEAD")
    plain = cli("--plain", "eval", "submit", CONFIG, "-y", env=nowhere_env, cwd=tree)
    assert plain.returncode == 1
    assert f"origin/main is at {tip[:7]}, which this clone has not fetched" in plain.stderr
    assert "hint: git fetch origin" in plain.stderr


# -- the server: provider key, rows ------------------------------------------------------------
@pytest.mark.slow
def test_without_limit_the_summary_says_how_many_rows_and_the_sampling_rule(
    running_platform, tmp_path
):
    tree = workspace(tmp_path, secrets=["OPENAI_API_KEY"])
    env = {**running_platform.env, "OPENAI_API_KEY": "sk-in-the-environment"}
    cli_json("dataset", "upload", "data/scripted.jsonl", "-y", env=env, cwd=tree)
    plain = cli("--plain", "eval", "submit", CONFIG, env=env, cwd=tree)
    assert plain.returncode == 1  # no terminal and no -y: the summary, then no confirmation
    assert "1 of 6: a seeded random 10% sample (no evaluation.limit" in plain.stdout
    # A clean, pushed workspace with its key named: no warning at all.
    assert "warning" not in plain.stderr.lower() and "Push before" not in plain.stdout
    error = confirmation(tree, env)
    assert error["details"]["warnings"] == []
    assert error["details"]["summary"]["Rows"].startswith("1 of 6: a seeded random 10% sample")


@pytest.mark.slow
def test_with_limit_the_rows_are_the_limit(running_platform, tmp_path):
    tree = workspace(tmp_path, limit=4, secrets=["OPENAI_API_KEY"])
    env = {**running_platform.env, "OPENAI_API_KEY": "sk-in-the-environment"}
    cli_json("dataset", "upload", "data/scripted.jsonl", "-y", env=env, cwd=tree)
    error = confirmation(tree, env)
    assert error["details"]["summary"]["Rows"] == "4 of 6 (evaluation.limit = 4)"


@pytest.mark.slow
def test_a_stored_provider_key_not_named_in_the_config_is_refused(running_platform, tmp_path):
    tree = workspace(tmp_path)  # [secrets].required = []
    env = running_platform.env
    # Neither named nor stored: only the server's own environment could give it; a warning.
    unset = confirmation(tree, env)
    assert any(
        "OPENAI_API_KEY, which is neither in [secrets].required nor stored" in w
        for w in unset["details"]["warnings"]
    )
    stored = {**env, "V": "sk-stored"}
    cli_json(
        "secret",
        "set",
        "OPENAI_API_KEY",
        "--scope",
        "workspace",
        "--env",
        "V",
        env=stored,
        cwd=tree,
    )
    error = cli_error("eval", "submit", CONFIG, "-y", env=env, cwd=tree)
    assert error["message"].startswith(
        "openai/fake-model needs OPENAI_API_KEY, which is stored on the platform but not in "
        "[secrets].required"
    )
    assert cli_json("eval", "list", env=env, cwd=tree)["items"] == []
