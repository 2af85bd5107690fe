"""`osmosis eval submit|list|info|logs|stop|retry|download` driven as a user does.

A real server process (`running_platform`), real git work trees whose `origin` is a local bare
repository, and the CLI run as a subprocess. Checks that stop before the first request need
no server at all.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from osmosis.testing import FakeModelServer
from tests.e2e.workspace import make_workspace, row
from tests.platform.conftest import CLI, clean_env
from tests.platform.test_workspaces import cli, cli_error, cli_json
from tests.unit.test_git_state import git, new_repo

ROWS = [row("ok", a, 7) for a in range(2, 8)]


def eval_workspace(
    root: Path, *, secrets: list[str] = (), main: str | None = None, rows: list[dict] = ROWS
) -> Path:
    """A workspace (rollout, config, dataset) committed on `main` and pushed to `origin`."""
    tree = new_repo(root)
    extra = {"main": main} if main is not None else {}
    make_workspace(tree, rows, limit=4, secrets=list(secrets), **extra)
    (tree / ".gitignore").write_text(".osmosis/\n")
    git(tree, "add", ".")
    git(tree, "commit", "-q", "-m", "workspace")
    git(tree, "push", "-q", "-u", "origin", "main")
    return tree


CONFIG = "configs/eval/scripted.toml"


@pytest.fixture
def offline_env(tmp_path: Path) -> dict[str, str]:
    """No platform anywhere: commands that fail before any request must still explain why."""
    return clean_env(OSMOSIS_HOME=str(tmp_path / "home"), OSMOSIS_CONFIG_DIR=str(tmp_path / "cfg"))


# -- checks before any request ----------------------------------------------------------------
def test_a_config_outside_configs_eval_with_bad_keys_reports_every_problem(tmp_path, offline_env):
    tree = eval_workspace(tmp_path)
    stray = tree / "stray.toml"
    stray.write_text(
        (tree / CONFIG)
        .read_text()
        .replace('entrypoint = "main.py"', 'entrypoint = "missing.py"')
        .replace("n = 1", "n = 0\nlimt = 3")
    )
    error = cli_error("eval", "submit", "stray.toml", "-y", env=offline_env, cwd=tree)
    assert error["code"] == "VALIDATION"
    messages = {issue["key"]: issue["message"] for issue in error["details"]["issues"]}
    assert "configs/eval" in messages[""]  # the location
    assert "did you mean 'limit'" in messages["evaluation.limt"]
    assert "integer >= 1" in messages["evaluation.n"]
    assert "rollouts/scripted/missing.py does not exist" in messages["experiment.entrypoint"]
    lines = {issue["key"]: issue["line"] for issue in error["details"]["issues"]}
    assert lines["evaluation.limt"] == 9


def test_submit_outside_a_git_workspace_is_workspace_required(tmp_path, offline_env):
    (tmp_path / "configs" / "eval").mkdir(parents=True)
    (tmp_path / "configs" / "eval" / "x.toml").write_text("")
    error = cli_error("eval", "submit", "configs/eval/x.toml", env=offline_env, cwd=tmp_path)
    assert error["code"] == "WORKSPACE_REQUIRED"


def test_an_unknown_commit_sha_is_refused_before_anything_is_sent(tmp_path, offline_env):
    tree = eval_workspace(tmp_path)
    config = tree / CONFIG
    config.write_text(
        config.read_text().replace("[evaluation]", 'commit_sha = "abcdef1"\n\n[evaluation]')
    )
    error = cli_error("eval", "submit", CONFIG, "-y", env=offline_env, cwd=tree)
    assert error["code"] == "VALIDATION"
    assert "commit_sha abcdef1 is not a commit in this repository" in error["message"]


def test_an_entrypoint_that_fails_to_import_is_refused_with_the_traceback_line(
    tmp_path, offline_env
):
    broken = "import os\nraise RuntimeError('config missing: ' + 'DB_URL')\n"
    tree = eval_workspace(tmp_path, main=broken)
    error = cli_error("eval", "submit", CONFIG, "-y", env=offline_env, cwd=tree)
    assert error["code"] == "VALIDATION"
    assert error["message"] == (
        "pre-flight import of rollouts/scripted/main.py failed: "
        "RuntimeError: config missing: DB_URL"
    )


# -- checks that need the platform (the secrets store), still before the run is created -------
def confirmation(tree: Path, env: dict[str, str], *args: str, stdin: str | None = None) -> dict:
    """The INTERACTIVE_REQUIRED envelope of `eval submit` without -y: what it would submit."""
    result = subprocess.run(
        [*CLI, "--json", "eval", "submit", CONFIG, *args],
        env=env,
        cwd=tree,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert result.returncode == 1, result.stdout
    return json.loads(result.stderr)["error"]


@pytest.mark.slow
def test_secrets_resolve_file_then_environment_then_the_platform_store(running_platform, tmp_path):
    names = ["FROM_FILE", "FROM_ENV", "MINE", "SHARED", "BOTH"]
    tree = eval_workspace(tmp_path, secrets=names)
    env = {**running_platform.env, "V": "stored-value-123"}
    for name, scope in [
        ("MINE", "personal"),
        ("SHARED", "workspace"),
        ("BOTH", "personal"),
        ("BOTH", "workspace"),
        ("FROM_FILE", "personal"),
    ]:
        cli_json("secret", "set", name, "--scope", scope, "--env", "V", env=env, cwd=tree)
    secrets_file = tmp_path / "run.env"
    secrets_file.write_text("export FROM_FILE='file-value'\n# comment\nFROM_ENV=file-wins-too\n")
    env = {**running_platform.env, "FROM_ENV": "env-value", "MINE": ""}

    error = confirmation(tree, env, "--secrets-file", str(secrets_file))
    assert error["code"] == "INTERACTIVE_REQUIRED"
    assert error["message"] == "Use --yes to confirm in non-interactive mode."
    scopes = {s["name"]: (s["scope"], s["source"]) for s in error["details"]["secrets"]}
    assert scopes == {
        "FROM_FILE": ("Run", "secrets file"),  # the file wins over the stored one
        "FROM_ENV": ("Run", "secrets file"),  # and over the environment
        "MINE": ("Personal", "platform"),  # an empty variable does not count
        "SHARED": ("Workspace", "platform"),
        "BOTH": ("Personal (overrides workspace)", "platform"),
    }
    summary = error["details"]["summary"]
    head = git(tree, "rev-parse", "HEAD")
    assert (summary["Rollout"], summary["Branch"], summary["Commit"]) == (
        "scripted",
        "main",
        head[:7],
    )
    assert not any("commit_sha" in w for w in error["details"]["warnings"])  # no boilerplate
    # No value ever appears in what the CLI prints.
    assert "file-value" not in json.dumps(error) and "env-value" not in json.dumps(error)

    from_stdin = confirmation(tree, env, "--secrets-file", "-", stdin="FROM_ENV=x\n")
    scopes = {s["name"]: s["source"] for s in from_stdin["details"]["secrets"]}
    assert scopes["FROM_ENV"] == "secrets file" and scopes["FROM_FILE"] == "platform"


@pytest.mark.slow
def test_every_missing_secret_is_listed_at_once(running_platform, tmp_path):
    tree = eval_workspace(tmp_path, secrets=["ALPHA_KEY", "BETA_KEY", "GAMMA_KEY"])
    env = {**running_platform.env, "BETA_KEY": "present"}
    error = cli_error("eval", "submit", CONFIG, "-y", env=env, cwd=tree)
    assert error["code"] == "INTERACTIVE_REQUIRED"
    assert error["details"] == {"missing": ["ALPHA_KEY", "GAMMA_KEY"], "flags": ["--secrets-file"]}
    plain = cli("--plain", "eval", "submit", CONFIG, "-y", env=env, cwd=tree)
    assert plain.returncode == 1
    assert "ALPHA_KEY, GAMMA_KEY" in plain.stderr and "osmosis secret set ALPHA_KEY" in plain.stderr


@pytest.mark.slow
def test_a_missing_rollout_dependency_only_warns(running_platform, tmp_path):
    needs = "import not_installed_anywhere_xyz\n"
    tree = eval_workspace(tmp_path, main=needs)
    (tree / "README.md").write_text("local edit")
    error = confirmation(tree, running_platform.env)
    assert error["code"] == "INTERACTIVE_REQUIRED"
    warnings = error["details"]["warnings"]
    assert any("No module named 'not_installed_anywhere_xyz'" in w for w in warnings)
    assert any("uncommitted changes (README.md)" in w for w in warnings)


# -- the platform's eval-run routes -----------------------------------------------------------
@pytest.mark.slow
def test_a_dataset_that_was_never_uploaded_is_refused_with_the_upload_hint(
    running_platform, tmp_path
):
    tree = eval_workspace(tmp_path)
    error = cli_error("eval", "submit", CONFIG, "-y", env=running_platform.env, cwd=tree)
    assert error["code"] == "NOT_FOUND" and "scripted" in error["message"]
    plain = cli("--plain", "eval", "submit", CONFIG, "-y", env=running_platform.env, cwd=tree)
    assert "hint: osmosis dataset upload data/scripted.jsonl" in plain.stderr
    assert cli_json("eval", "list", env=running_platform.env, cwd=tree)["items"] == []


@pytest.mark.slow
def test_list_on_a_workspace_without_runs_is_empty(running_platform, tmp_path):
    tree = eval_workspace(tmp_path)
    listing = cli_json("eval", "list", env=running_platform.env, cwd=tree)
    assert (listing["items"], listing["total_count"], listing["has_more"]) == ([], 0, False)
    assert listing["git"]["identity"].startswith("file://")
    table = cli("eval", "list", env=running_platform.env, cwd=tree)
    assert table.returncode == 0
    assert all(word in table.stdout for word in ("Name", "Status", "Reward", "Submitted By"))
    combined = cli_error(
        "eval", "list", "--all", "--limit", "5", env=running_platform.env, cwd=tree
    )
    assert combined["code"] == "VALIDATION"


@pytest.mark.slow
def test_an_unknown_run_is_not_found_for_every_command(running_platform, tmp_path):
    tree = eval_workspace(tmp_path)
    for command in (["info"], ["logs"], ["stop", "-y"], ["retry", "-y"], ["download"]):
        error = cli_error("eval", *command, "no-such-run", env=running_platform.env, cwd=tree)
        assert error["code"] == "NOT_FOUND", command


def test_bad_download_selections_are_refused_before_any_request(tmp_path, offline_env):
    for args, message in [
        (["--type", "all,logs"], "--type all cannot be combined"),
        (["--type", "metric"], "unknown --type value(s): metric"),
        (["--rows", "5-2"], "--rows"),
    ]:
        error = cli_error("eval", "download", "some-run", *args, env=offline_env, cwd=tmp_path)
        assert error["code"] == "VALIDATION" and message in error["message"], args


# -- end to end: submit, watch, download, stop, retry ------------------------------------------
@pytest.fixture(scope="module")
def fake_model() -> Iterator[FakeModelServer]:
    with FakeModelServer() as server:
        yield server


def wait_for(tree: Path, env: dict[str, str], name: str, statuses: set[str], timeout: float = 240):
    """`eval info --json` until the run's status is one of `statuses`; every answer seen."""
    seen = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        data = cli_json("eval", "info", name, env=env, cwd=tree)["data"]
        seen.append(data)
        if data["eval_run"]["status"] in statuses:
            return seen
        time.sleep(0.5)
    raise AssertionError(f"{name} never reached {statuses}: {seen[-1]['eval_run']}")


@pytest.mark.slow
@pytest.mark.timeout(600)  # two runs on the real worker, one of them retried
def test_submit_watch_download_stop_and_retry(running_platform, fake_model, tmp_path):
    # The first row takes 4 s: four instant rows can end before `eval info` has started.
    rows = [row("ok", 2, 7, sleep=4), row("ok", 3, 7), row("grader_error", 4, 7), row("ok", 5, 7)]
    rows += [row("ok", a, 7) for a in range(6, 9)]
    tree = eval_workspace(tmp_path, secrets=["OPENAI_API_KEY", "OPENAI_API_BASE"], rows=rows)
    env = {
        **running_platform.env,
        "OPENAI_API_KEY": "sk-fake-for-the-run-4d2e",
        "OPENAI_API_BASE": fake_model.base_url,
    }
    cli_json("dataset", "upload", "data/scripted.jsonl", "-y", env=env, cwd=tree)

    submitted = cli_json("eval", "submit", CONFIG, "-y", env=env, cwd=tree)
    name = submitted["resource"]["name"]
    assert submitted["operation"] == "eval.submit" and submitted["resource"]["status"] == "pending"
    assert submitted["resource"]["config"]["commit_sha"] == git(tree, "rev-parse", "HEAD")
    assert submitted["next_steps_structured"][0] == {"action": "eval_info", "name": name}
    url = submitted["resource"]["url"]  # the run's dashboard page
    assert url == f"{running_platform.url}/runs/{name}"
    assert {"action": "open_url", "url": url} in submitted["next_steps_structured"]

    seen = wait_for(tree, env, name, {"finished", "failed"})
    # The first look finds the run waiting or under way.
    first_look = seen[0]
    assert first_look["eval_run"]["status"] in {"pending", "running"}
    if first_look["eval_run"]["status"] == "pending":
        assert "pending" in first_look["metrics_error"]
    done = seen[-1]
    assert done["eval_run"]["status"] == "finished", done["eval_run"]["error"]
    assert (done["summary"]["graded"], done["summary"]["passed"], done["summary"]["failed"]) == (
        3,
        3,
        1,
    )
    assert done["summary"]["progress"] == {"completed": 4, "total": 4, "unit": "samples"}
    assert done["resolved_secret_scopes"] == {"OPENAI_API_KEY": "run", "OPENAI_API_BASE": "run"}
    assert done["metrics_available"] and done["results"]["errors_by_type"]
    assert done["output_path"] is None  # --json without -o saves nothing

    # download: the default types, then again (nothing moves), then the logs only
    first = cli_json("eval", "download", name, env=env, cwd=tree)["resource"]
    run_dir = tree / ".osmosis" / "evals" / name
    expected = {"metrics.json", "summary.jsonl"} | {
        f"trajectories/row_{r}_run_0.json" for r in range(4)
    }
    local = {p.relative_to(run_dir).as_posix() for p in run_dir.rglob("*") if p.is_file()}
    assert local == expected
    assert first["status"] == "success" and first["files_downloaded"] == len(expected)
    assert first["output_path"] == str(run_dir) and first["total_files"] == len(expected)
    assert json.loads((run_dir / "metrics.json").read_text())["summary"]["passed"] == 3
    second = cli_json("eval", "download", name, env=env, cwd=tree)["resource"]
    assert (second["files_downloaded"], second["files_skipped"], second["bytes_downloaded"]) == (
        0,
        len(expected),
        0,
    )
    edited = run_dir / "trajectories" / "row_1_run_0.json"
    edited.write_text("{}")
    repaired = cli_json("eval", "download", name, env=env, cwd=tree)["resource"]
    assert (repaired["files_downloaded"], repaired["files_skipped"]) == (1, len(expected) - 1)
    assert json.loads(edited.read_text()) != {}
    picked = cli_json(
        "eval", "download", name, "--rows", "1,3", "-o", str(tmp_path / "picked"), env=env, cwd=tree
    )["resource"]
    picked_dir = tmp_path / "picked" / name
    assert picked["output_path"] == str(picked_dir) and picked["rows"] == "1,3"
    assert {p.name for p in (picked_dir / "trajectories").iterdir()} == {
        "row_1_run_0.json",
        "row_3_run_0.json",
    }
    logs_only = cli_json("eval", "download", name, "--type", "logs", env=env, cwd=tree)
    assert logs_only["resource"]["breakdown"].keys() == {"logs"}
    assert (run_dir / "logs.txt").is_file()
    assert "sk-fake-for-the-run-4d2e" not in (run_dir / "logs.txt").read_text()

    # rich info saves metrics.json and names every section
    info = cli("eval", "info", name, "-o", str(tmp_path / "out"), env=env, cwd=tree)
    assert info.returncode == 0, info.stderr
    for words in (
        "Progress",
        "4 / 4 samples (100%)",
        "Configuration",
        "Commit",
        "3 graded · 3 passed, 0 not passed, 1 errored, 0 skipped",
        f"View: {url}",
    ):
        assert words in info.stdout, words
    saved = tmp_path / "out" / name / "metrics.json"
    assert saved.read_bytes() == (run_dir / "metrics.json").read_bytes()

    logs = cli_json("eval", "logs", name, "--limit", "1", env=env, cwd=tree)
    assert len(logs["items"]) == 1 and logs["next_cursor"]
    more = cli_json("eval", "logs", name, "--cursor", logs["next_cursor"], env=env, cwd=tree)
    assert more["items"] and more["items"][0] != logs["items"][0]
    listed = cli_json("eval", "list", env=env, cwd=tree)
    assert listed["items"][0]["name"] == name and listed["items"][0]["summary"]["passed"] == 3
    assert listed["items"][0]["url"] == url
    everywhere = cli_json("eval", "list", "--all", env=env, cwd=tmp_path)  # outside any repo
    assert name in {item["name"] for item in everywhere["items"]}
    assert "git" not in everywhere and everywhere["has_more"] is False

    # retry: the values given at submit were for that run only, so they are needed again
    no_values = {k: v for k, v in env.items() if not k.startswith("OPENAI_")}
    missing = cli_error("eval", "retry", name, "-y", env=no_values, cwd=tree)
    assert missing["code"] == "INTERACTIVE_REQUIRED"
    assert sorted(missing["details"]["missing"]) == ["OPENAI_API_BASE", "OPENAI_API_KEY"]
    retried = cli_json("eval", "retry", name, "-y", env=env, cwd=tree)
    assert retried["resource"]["retryable_samples"] == 1
    assert retried["message"] == f"Retrying 1 failed and skipped samples in {name}."
    again = wait_for(tree, env, name, {"finished", "failed"})[-1]
    assert again["eval_run"]["status"] == "finished" and again["summary"]["failed"] == 1

    # stop another run, slow on purpose
    slow = tree / "configs" / "eval" / "slow.toml"
    slow.write_text((tree / CONFIG).read_text().replace('dataset = "scripted"', 'dataset = "slow"'))
    (tree / "data" / "slow.jsonl").write_text(
        "\n".join(json.dumps(row("ok", a, 3, sleep=120)) for a in range(4)) + "\n"
    )
    cli_json("dataset", "upload", "data/slow.jsonl", "-y", env=env, cwd=tree)
    slow_name = cli_json("eval", "submit", "configs/eval/slow.toml", "-y", env=env, cwd=tree)[
        "resource"
    ]["name"]
    unconfirmed = cli_error("eval", "stop", slow_name, env=env, cwd=tree)
    assert unconfirmed["code"] == "INTERACTIVE_REQUIRED"
    code, screen = in_terminal(
        ["eval", "stop", slow_name], env=env, cwd=tree, answers=[("[y/N]", "")]
    )
    assert code == 130, screen  # Enter takes the default: No
    assert cli_json("eval", "info", slow_name, env=env, cwd=tree)["data"]["eval_run"]["status"] in {
        "pending",
        "running",
    }
    too_soon = cli_error("eval", "retry", slow_name, "-y", env=env, cwd=tree)
    assert too_soon["code"] == "CONFLICT"
    assert "only a finished, failed, stopped or halted" in too_soon["message"]
    stopped = cli_json("eval", "stop", slow_name, "-y", env=env, cwd=tree)
    assert stopped["operation"] == "eval.stop"
    final = wait_for(tree, env, slow_name, {"stopped"}, timeout=60)[-1]
    assert final["eval_run"]["status"] == "stopped"
    twice = cli_error("eval", "stop", slow_name, "-y", env=env, cwd=tree)
    assert twice["code"] == "CONFLICT" and "already stopped" in twice["message"]


# -- a person at a terminal -------------------------------------------------------------------
def in_terminal(
    args: list[str], *, env: dict[str, str], cwd: Path, answers: list[tuple[str, str]]
) -> tuple[int, str]:
    """Run the CLI on a pseudo-terminal, typing each answer once its prompt text appears."""
    import fcntl
    import os
    import pty
    import select
    import termios

    leader, follower = pty.openpty()
    process = subprocess.Popen(
        [*CLI, *args],
        stdin=follower,
        stdout=follower,
        stderr=follower,
        env={**env, "COLUMNS": "120", "TERM": "xterm"},
        cwd=cwd,
        close_fds=True,
        start_new_session=True,
        # The pty becomes the controlling terminal, so hidden prompts can switch echo off.
        preexec_fn=lambda: fcntl.ioctl(0, termios.TIOCSCTTY, 0),
    )
    os.close(follower)
    seen, pending = "", list(answers)
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        ready, _, _ = select.select([leader], [], [], 0.2)
        if ready:
            try:
                chunk = os.read(leader, 4096)
            except OSError:  # the child closed the terminal
                break
            if not chunk:
                break
            seen += chunk.decode(errors="replace")
        if pending and pending[0][0] in seen:
            os.write(leader, (pending.pop(0)[1] + "\n").encode())
        if process.poll() is not None and not ready:
            break
    os.close(leader)
    return process.wait(timeout=30), seen


@pytest.mark.slow
def test_at_a_terminal_a_missing_secret_is_asked_for_hidden_and_no_aborts(
    running_platform, tmp_path
):
    tree = eval_workspace(tmp_path, secrets=["TYPED_KEY"])
    code, screen = in_terminal(
        ["eval", "submit", CONFIG],
        env=running_platform.env,
        cwd=tree,
        answers=[
            # The space comes from getpass once echo is off; typing earlier would be flushed.
            ("Value for TYPED_KEY (used for this run only): ", "typed-secret-value-77"),
            ("Submit scripted", "n"),
        ],
    )
    assert code == 130, screen
    assert "typed-secret-value-77" not in screen  # hidden while typed, never printed
    assert re.search(r"TYPED_KEY\s*│\s*Run\s*│\s*prompt", screen)  # where it came from
    assert cli_json("eval", "list", env=running_platform.env, cwd=tree)["items"] == []
