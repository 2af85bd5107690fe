"""`osmosis eval run` starts its rollout server at the command's entry when the line and the
config fix its launch, and adopts it (issue 30): one server process, never one left behind,
never user code before the user said yes."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.e2e.conftest import model_env, osmosis
from tests.e2e.workspace import SCRIPTED_MAIN, make_workspace, row

pytestmark = pytest.mark.slow

# Each server process appends its pid first thing, before its imports (~0.4 s): a server the
# command started leaves its mark even when the command ends a moment later.
PID_MAIN = (
    'import os\nif os.environ.get("PIDS"):\n'
    '    try:\n        open(os.environ["PIDS"], "a").write(f"{os.getpid()}\\n")\n'
    "    except OSError:\n        pass  # the sandbox: its view of the file system is read-only\n"
    + SCRIPTED_MAIN
)
EARLY = "started at the command's entry"


def _pids(path: Path) -> list[int]:
    return [int(line) for line in path.read_text().split()] if path.exists() else []


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _workspace(root: Path, **kwargs: object) -> Path:
    rows = [row("pass", a) for a in range(2, 6)]
    return make_workspace(root / "ws", rows, limit=1, main=PID_MAIN, **kwargs)  # type: ignore[arg-type]


def test_a_run_adopts_the_server_started_at_its_entry_and_starts_no_other(tmp_path, fake_model):
    config = _workspace(tmp_path)
    pids = tmp_path / "pids"
    done = osmosis(
        "eval", "run", str(config), "-y", "--json",
        cwd=config.parents[2], env=model_env(fake_model, PIDS=str(pids)),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["resource"]["outcomes"]["passed"] == 1
    assert len(_pids(pids)) == 1  # the early server served the run: none started after it
    # No --name: the run has the default name the early server was started for, and one
    # directory (the server's artifact root is inside it).
    (run_dir,) = (config.parents[2] / ".osmosis" / "evals").glob("scripted-*")
    assert re.fullmatch(r"scripted-\d{8}-\d{6}", run_dir.name)
    assert json.loads(done.stdout)["resource"]["run_name"] == run_dir.name
    logs = (run_dir / "logs.txt").read_text()
    assert f"rollout server scripted: {EARLY}" in logs  # a reader is told it started early
    assert "rollout server scripted healthy at" in logs
    assert not any(_alive(pid) for pid in _pids(pids))


@pytest.mark.parametrize(
    ("case", "secrets", "extra", "servers"),
    [
        # [secrets]: resolved by the plan, not at the entry; the run's own server only.
        ("secrets", ["SCRIPTED_TOKEN"], (), 1),
        # Two servers: the one started early would be the wrong count.
        ("replicas", [], ("--replicas", "2"), 2),
    ],
)
def test_no_early_start_when_the_launch_is_not_known_at_the_entry(
    tmp_path, fake_model, case, secrets, extra, servers
):
    config = _workspace(tmp_path, secrets=secrets)
    pids = tmp_path / "pids"
    env = model_env(fake_model, PIDS=str(pids), SCRIPTED_TOKEN="t0ken-value")
    done = osmosis(
        "eval", "run", str(config), "-y", "--json", "--name", case, *extra,
        cwd=config.parents[2], env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["resource"]["outcomes"]["passed"] == 1
    assert len(_pids(pids)) == servers
    logs = (config.parents[2] / ".osmosis" / "evals" / case / "logs.txt").read_text()
    assert EARLY not in logs
    assert "healthy at" in logs


def test_without_yes_no_user_code_runs_before_the_user_said_yes(tmp_path, fake_model):
    config = _workspace(tmp_path)
    pids = tmp_path / "pids"
    done = osmosis(
        "eval", "run", str(config), "--json", "--name", "asked",
        cwd=config.parents[2], env=model_env(fake_model, PIDS=str(pids)),
    )  # fmt: skip
    assert done.returncode == 1
    assert json.loads(done.stderr)["error"]["code"] == "INTERACTIVE_REQUIRED"
    assert _pids(pids) == []  # the rollout's main.py never ran


def test_a_plan_error_after_the_early_start_exits_as_before_and_leaves_no_server(
    tmp_path, fake_model
):
    config = _workspace(tmp_path)
    data = config.parents[2] / "data" / "scripted.jsonl"
    data.write_text(data.read_text() + "{not json\n")
    pids = tmp_path / "pids"
    done = osmosis(
        "eval", "run", str(config), "-y", "--json", "--name", "broken",
        cwd=config.parents[2], env=model_env(fake_model, PIDS=str(pids)),
    )  # fmt: skip
    assert done.returncode == 1
    error = json.loads(done.stderr)["error"]
    assert "scripted.jsonl" in error["message"]
    (pid,) = _pids(pids)  # the early server had started ...
    assert not _alive(pid)  # ... and is gone with the command
    assert not (config.parents[2] / ".osmosis" / "evals" / "broken").exists()


def _sandbox_processes(marker: str) -> list[int]:
    """Processes whose command line names `marker` (a workspace's unique path)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and _alive(int(entry.name)):
            try:
                line = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if marker in line and "bwrap" in line:
                found.append(int(entry.name))
    return found


def test_a_sandboxed_run_adopts_the_sandboxed_server_started_at_its_entry(tmp_path, fake_model):
    config = _workspace(tmp_path)
    done = osmosis(
        "eval", "run", str(config), "-y", "--json", "--name", "boxed", "--sandbox",
        cwd=config.parents[2], env=model_env(fake_model),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["resource"]["outcomes"]["passed"] == 1
    logs = (config.parents[2] / ".osmosis" / "evals" / "boxed" / "logs.txt").read_text()
    assert "rollout server scripted: adopted the spare started" in logs
    assert "not adopted" not in logs
    assert _sandbox_processes(str(config.parents[2])) == []


def test_a_sandboxed_plan_error_leaves_no_sandbox_and_no_run_directory(tmp_path, fake_model):
    config = _workspace(tmp_path)
    data = config.parents[2] / "data" / "scripted.jsonl"
    data.write_text(data.read_text() + "{not json\n")
    done = osmosis(
        "eval", "run", str(config), "-y", "--json", "--name", "broken", "--sandbox",
        cwd=config.parents[2], env=model_env(fake_model),
    )  # fmt: skip
    assert done.returncode == 1
    assert "scripted.jsonl" in json.loads(done.stderr)["error"]["message"]
    assert not (config.parents[2] / ".osmosis" / "evals" / "broken").exists()
    assert _sandbox_processes(str(config.parents[2])) == []
