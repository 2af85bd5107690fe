"""What `osmosis eval run` says in the first hour (issue 17.6), checked on real runs against
the scripted model: a concurrency above the rollout server's capacity is said, not capped in
silence; uvicorn's access lines for the protocol's polling stay out of `logs.txt`; a resumed
run's duration is active time with its first start kept; a missing key's hint names
`[secrets]`, as the docs do, not `[env]`."""

from __future__ import annotations

import json
import time
from datetime import datetime
from pathlib import Path

import pytest

from tests.e2e.conftest import model_env, osmosis
from tests.e2e.workspace import (
    OSMOSIS_AI_MAIN,
    OSMOSIS_AI_PYPROJECT,
    SCRIPTED_MAIN,
    make_workspace,
    row,
)

pytestmark = pytest.mark.slow

# The scripted rollouts with uvicorn's default log level: INFO, access log on.
LOUD_MAIN = SCRIPTED_MAIN.replace('\n                log_level="warning")', "\n                )")
LOUD_OSMOSIS_AI_MAIN = OSMOSIS_AI_MAIN.replace(
    '\n                log_level="warning")', "\n                )"
)


def run(ws: Path, config: Path, env: dict[str, str], *args: str):
    return osmosis("eval", "run", str(config), "-y", *args, cwd=ws, env=env, timeout=600)


def test_a_concurrency_above_the_servers_capacity_is_said(tmp_path, fake_model):
    rows = [row("pass", a, 2) for a in range(4)]
    config = make_workspace(tmp_path, rows, env={"MAX_CONCURRENT": "2"})
    done = run(tmp_path, config, model_env(fake_model), "--max-in-flight", "8", "--name", "c")
    assert done.returncode == 0, done.stderr
    said = "--max-in-flight 8 is above the rollout servers' capacity of 2"
    assert said in " ".join(done.stdout.split())
    assert said in (tmp_path / ".osmosis" / "evals" / "c" / "logs.txt").read_text()


def logged(ws: Path, name: str) -> str:
    return (ws / ".osmosis" / "evals" / name / "logs.txt").read_text()


def test_protocol_access_lines_stay_out_of_the_run_log(tmp_path, fake_model):
    assert LOUD_MAIN != SCRIPTED_MAIN
    config = make_workspace(tmp_path, [row("pass", a, 2) for a in range(4)], main=LOUD_MAIN)
    done = run(tmp_path, config, model_env(fake_model), "--name", "quiet")
    assert done.returncode == 0, done.stderr
    log = logged(tmp_path, "quiet")
    assert "Application startup complete" in log  # uvicorn's INFO lines do reach the log
    assert 'HTTP/1.1" 20' not in log and "/rollout" not in log.replace("rollout_trials", "")


@pytest.mark.interop
def test_an_osmosis_ai_rollouts_access_lines_stay_out_of_the_run_log(tmp_path, fake_model):
    assert LOUD_OSMOSIS_AI_MAIN != OSMOSIS_AI_MAIN
    rows = [row("pass", a, 2) for a in range(4)]
    config = make_workspace(tmp_path, rows, main=LOUD_OSMOSIS_AI_MAIN)
    (tmp_path / "rollouts" / "scripted" / "pyproject.toml").write_text(OSMOSIS_AI_PYPROJECT)
    done = run(tmp_path, config, model_env(fake_model), "--name", "theirs")
    if done.returncode != 0 and "osmosis-ai" in done.stderr and "install" in done.stderr:
        pytest.skip(f"osmosis-ai cannot be installed on this machine: {done.stderr[-300:]}")
    assert done.returncode == 0, done.stderr
    log = logged(tmp_path, "theirs")
    assert "Uvicorn running on" in log or "Application startup complete" in log
    assert '"POST /rollout HTTP/1.1"' not in log and '"GET /health HTTP/1.1"' not in log


def metrics_of(ws: Path, name: str) -> dict:
    return json.loads((ws / ".osmosis" / "evals" / name / "metrics.json").read_text())["eval_run"]


def test_a_resumed_run_counts_active_time_and_keeps_its_first_start(tmp_path, fake_model):
    config = make_workspace(tmp_path, [*(row("pass", a, 2) for a in range(3)), row("breakable")])
    # The rollout inherits the environment: its grader fails the second row this time.
    first = run(tmp_path, config, model_env(fake_model, BREAK_GRADER="1"), "--name", "again")
    assert first.returncode == 0, first.stderr
    before = metrics_of(tmp_path, "again")
    time.sleep(3)  # the time between two invocations is not active time
    second = run(tmp_path, config, model_env(fake_model), "--name", "again", "--retry-failed")
    assert second.returncode == 0, second.stderr
    after = metrics_of(tmp_path, "again")
    assert after["started_at"] == before["started_at"]
    wall_ms = (
        datetime.fromisoformat(after["completed_at"]) - datetime.fromisoformat(after["started_at"])
    ).total_seconds() * 1000
    assert before["duration_ms"] < after["duration_ms"] < wall_ms - 2500


def test_a_missing_key_is_pointed_at_secrets_not_env(tmp_path):
    rows = [row("pass", a, 2) for a in range(4)]
    config = make_workspace(tmp_path, rows, model_path="openai/gpt-4o-mini")
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}  # no OPENAI_API_KEY anywhere
    done = osmosis("--json", "eval", "run", str(config), "-y", cwd=tmp_path, env=env)
    assert done.returncode == 1
    message = json.loads(done.stderr)["error"]["message"]
    assert "[secrets].required" in message and "--secrets-file" in message
    assert "[env]" not in message
