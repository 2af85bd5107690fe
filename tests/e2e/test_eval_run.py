"""`osmosis eval run` end to end: real CLI process, rollout server, bridge, scripted model."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.e2e.conftest import CLI, model_env, osmosis, read_jsonl
from tests.e2e.workspace import SCRIPTED_MAIN, make_workspace, row

pytestmark = pytest.mark.slow


def run_dir(workspace: Path, name: str) -> Path:
    return workspace / ".osmosis" / "evals" / name


def test_metrics_equal_the_hand_computed_values(tmp_path, fake_model):
    rows = [
        row("pass"),  # 4 passes
        {**row("wrong"), "ground_truth": "0"},  # 4 graded zeros
        row("pass_first_1", 3, 9),  # 1 pass, 3 graded zeros
        row("grader_error", 2, 5),  # 4 failed, agent_error
        row("remove", 4, 4),  # 4 skipped
        row("hang", 8, 8),  # 4 failed, timeout
    ]
    config = make_workspace(tmp_path, rows, n=4, limit=6, agent_timeout=2, grader_timeout=5)
    done = osmosis(
        "eval",
        "run",
        str(config),
        "--name",
        "known",
        "-y",
        "--json",
        cwd=tmp_path,
        env=model_env(fake_model),
    )
    assert done.returncode == 0, done.stderr
    summary = json.loads((run_dir(tmp_path, "known") / "metrics.json").read_text())["summary"]
    assert {
        k: summary[k]
        for k in (
            "total_samples",
            "completed_samples",
            "graded",
            "passed",
            "failed",
            "skipped",
            "n_runs",
        )
    } == {
        "total_samples": 24,
        "completed_samples": 20,
        "graded": 12,
        "passed": 5,
        "failed": 8,
        "skipped": 4,
        "n_runs": 4,
    }
    assert summary["pass_rate"] == pytest.approx(5 / 20)
    assert summary["reward_stats"]["mean"] == pytest.approx(5 / 12)
    assert summary["reward_stats"]["median"] == 0.0
    assert summary["reward_stats"]["std"] == pytest.approx(math.sqrt(5 / 12 * 7 / 12))
    # pass@k over the 5 rows with scored attempts (row 4 is all skipped):
    # k=1: (1 + 1/4)/5; k=2: (1 + (1 - C(3,2)/C(4,2)))/5; k=4: (1 + 1)/5
    assert summary["pass_at_k"] == [
        {"k": 1, "value": pytest.approx(0.25)},
        {"k": 2, "value": pytest.approx(0.3)},
        {"k": 4, "value": pytest.approx(0.4)},
    ]
    # pass^k: only row 0 passes every attempt; row 2 contributes 1/4 at k=1.
    assert summary["pass_hat_k"] == [
        {"k": 1, "value": pytest.approx(0.25)},
        {"k": 2, "value": pytest.approx(0.2)},
        {"k": 4, "value": pytest.approx(0.2)},
    ]
    assert summary["errors_by_type"] == {"agent_error": 4, "timeout": 4}
    assert summary["tokens_used"] > 0
    ci = summary["confidence_intervals"]["pass_rate"]
    assert ci["low"] <= summary["pass_rate"] <= ci["high"]
    envelope = json.loads(done.stdout)
    assert envelope["operation"] == "eval.run" and envelope["status"] == "success"
    assert envelope["resource"]["metrics"] == summary
    index = read_jsonl(run_dir(tmp_path, "known") / "index.jsonl")
    assert [(r["row_index"], r["run_index"]) for r in index] == [
        (r, k) for r in range(6) for k in range(4)
    ]
    for record in index:
        trajectory = (
            run_dir(tmp_path, "known")
            / "trajectories"
            / (f"row_{record['row_index']}_run_{record['run_index']}.json")
        )
        assert json.loads(trajectory.read_text())["schema_version"] == "ATIF-v1.7"


def test_rerunning_a_complete_run_dispatches_nothing(tmp_path, fake_model):
    config = make_workspace(tmp_path, [row("pass", a, 3) for a in range(2, 7)])
    env = model_env(fake_model)
    first = osmosis("eval", "run", str(config), "--name", "again", "-y", cwd=tmp_path, env=env)
    assert first.returncode == 0, first.stderr
    served = fake_model.stats().chat_completions
    second = osmosis(
        "eval", "run", str(config), "--name", "again", "-y", "--json", cwd=tmp_path, env=env
    )
    assert second.returncode == 0, second.stderr
    assert "already complete" in json.loads(second.stdout)["message"]
    assert fake_model.stats().chat_completions == served


def test_changed_inputs_refuse_to_resume_naming_the_change(tmp_path, fake_model):
    config = make_workspace(tmp_path, [row("pass", a, 3) for a in range(2, 7)])
    env = model_env(fake_model)
    assert (
        osmosis(
            "eval", "run", str(config), "--name", "locked", "-y", cwd=tmp_path, env=env
        ).returncode
        == 0
    )
    config.write_text(config.read_text().replace("n = 1", "n = 2"))
    refused = osmosis(
        "eval", "run", str(config), "--name", "locked", "-y", "--json", cwd=tmp_path, env=env
    )
    assert refused.returncode == 1
    error = json.loads(refused.stderr)["error"]
    assert "Changed: n" in error["message"] and "--fresh" in error["message"]


def test_sigkill_mid_run_then_resume_records_every_attempt_exactly_once(tmp_path, fake_model):
    rows = [row("pass", a, 7, sleep=0.25) for a in range(2, 32)]
    config = make_workspace(tmp_path, rows, limit=30, batch_size=2)
    pid_file = tmp_path / "rollout.pid"
    env = model_env(fake_model, PID_FILE=str(pid_file), MAX_CONCURRENT="2")
    process, journal = start_run_until_recorded(tmp_path, config, "killed", env, records=6)
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=10)
    rollout_pid = int(pid_file.read_text())
    assert _gone_within(rollout_pid, seconds=10), "the rollout server outlived the engine"
    recorded_before = len(read_jsonl(journal))
    assert recorded_before < 30

    resumed = osmosis(
        "eval", "run", str(config), "--name", "killed", "-y", "--json", cwd=tmp_path, env=env
    )
    assert resumed.returncode == 0, resumed.stderr
    entries = read_jsonl(journal)
    keys = [(e["row_index"], e["run_index"]) for e in entries]
    assert sorted(keys) == [(r, 0) for r in range(30)]  # no duplicates, no losses
    index = read_jsonl(run_dir(tmp_path, "killed") / "index.jsonl")
    assert sum(1 for r in index if r.get("resumed")) == recorded_before
    assert json.loads(resumed.stdout)["resource"]["metrics"]["passed"] == 30


def test_hung_workflow_and_hung_grader_end_as_timeouts_and_the_run_finishes(tmp_path, fake_model):
    rows = [row("hang"), row("grader_hang", 2, 2), row("pass", 3, 3), row("pass", 4, 4)]
    config = make_workspace(tmp_path, rows, limit=4, agent_timeout=1.5, grader_timeout=1.5)
    started = time.monotonic()
    done = osmosis(
        "eval",
        "run",
        str(config),
        "--name",
        "hung",
        "-y",
        cwd=tmp_path,
        env=model_env(fake_model),
        timeout=120,
    )
    elapsed = time.monotonic() - started
    assert done.returncode == 0, done.stderr
    index = read_jsonl(run_dir(tmp_path, "hung") / "index.jsonl")
    assert [(r["status"], r.get("error_type")) for r in index] == [
        ("failed", "timeout"),
        ("failed", "timeout"),
        ("success", None),
        ("success", None),
    ]
    assert elapsed < 60  # deadlines of 1.5 s, not the hour the rollout would have hung


def test_a_secret_never_reaches_any_file_of_the_run(tmp_path, fake_model):
    secret = "s3cr3t-VALUE-4242"
    rows = [row("pass"), row("grader_error", 2, 2), row("pass", 3, 3), row("pass", 4, 4)]
    config = make_workspace(tmp_path, rows, limit=4, secrets=["SHOUT_SECRET"])
    secrets_file = tmp_path / "secrets.env"
    secrets_file.write_text(f"SHOUT_SECRET={secret}\n")
    done = osmosis(
        "eval",
        "run",
        str(config),
        "--name",
        "secret",
        "-y",
        "--verbose",
        "--secrets-file",
        str(secrets_file),
        cwd=tmp_path,
        env=model_env(fake_model),
    )
    assert done.returncode == 0, done.stderr
    assert secret not in done.stdout + done.stderr
    files = [p for p in run_dir(tmp_path, "secret").rglob("*") if p.is_file()]
    assert any(p.name == "logs.txt" for p in files)
    assert [p for p in files if secret.encode() in p.read_bytes()] == []
    assert "[REDACTED]" in (run_dir(tmp_path, "secret") / "logs.txt").read_text()


def start_run_until_recorded(
    workspace: Path, config: Path, name: str, env: dict[str, str], *, records: int
) -> tuple[subprocess.Popen[bytes], Path]:
    """Start `eval run` in the background; return once `records` attempts are in its journal."""
    process = subprocess.Popen(
        [*CLI, "eval", "run", str(config), "--name", name, "-y"],
        cwd=workspace,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    journal = run_dir(workspace, name) / "events.jsonl"
    deadline = time.monotonic() + 60
    while not (journal.exists() and len(journal.read_bytes().splitlines()) >= records):
        assert time.monotonic() < deadline and process.poll() is None, "run never got going"
        time.sleep(0.05)
    return process, journal


def _gone_within(pid: int, *, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        if Path(f"/proc/{pid}/stat").exists() and " Z " in Path(f"/proc/{pid}/stat").read_text():
            return True  # a zombie: dead, waiting to be reaped by init
        time.sleep(0.05)
    return False


def test_ctrl_c_records_what_finished_stops_the_rollout_and_resumes(tmp_path, fake_model):
    rows = [row("pass", a, 7, sleep=0.3) for a in range(2, 22)]
    config = make_workspace(tmp_path, rows, limit=20, batch_size=2)
    pid_file = tmp_path / "rollout.pid"
    env = model_env(fake_model, PID_FILE=str(pid_file), MAX_CONCURRENT="2")
    process, journal = start_run_until_recorded(tmp_path, config, "interrupted", env, records=4)
    process.send_signal(signal.SIGINT)
    assert process.wait(timeout=30) == 130
    assert _gone_within(int(pid_file.read_text()), seconds=10)
    metrics = json.loads((run_dir(tmp_path, "interrupted") / "metrics.json").read_text())
    assert metrics["eval_run"]["status"] == "incomplete"
    assert metrics["summary"]["total_samples"] == len(read_jsonl(journal)) < 20
    resumed = osmosis(
        "eval", "run", str(config), "--name", "interrupted", "-y", cwd=tmp_path, env=env
    )
    assert resumed.returncode == 0, resumed.stderr
    assert sorted((e["row_index"], e["run_index"]) for e in read_jsonl(journal)) == [
        (r, 0) for r in range(20)
    ]


def test_retry_failed_reruns_only_failures_with_fresh_rollout_ids(tmp_path, fake_model):
    rows = [row("pass", 2, 2), row("breakable", 3, 3), row("pass", 4, 4), row("breakable", 5, 5)]
    config = make_workspace(tmp_path, rows, limit=4)
    broken = osmosis(
        "eval",
        "run",
        str(config),
        "--name",
        "retry",
        "-y",
        cwd=tmp_path,
        env=model_env(fake_model, BREAK_GRADER="1"),
    )
    assert broken.returncode == 0, broken.stderr
    index_path = run_dir(tmp_path, "retry") / "index.jsonl"
    first = {r["row_index"]: r for r in read_jsonl(index_path)}
    assert [first[r]["status"] for r in range(4)] == ["success", "failed", "success", "failed"]

    retried = osmosis(
        "eval",
        "run",
        str(config),
        "--name",
        "retry",
        "-y",
        "--retry-failed",
        "--json",
        cwd=tmp_path,
        env=model_env(fake_model),
    )
    assert retried.returncode == 0, retried.stderr
    assert json.loads(retried.stdout)["resource"]["dispatched"] == 2
    second = {r["row_index"]: r for r in read_jsonl(index_path)}
    assert all(second[r]["status"] == "success" for r in range(4))
    for r in (1, 3):
        assert second[r]["rollout_id"] != first[r]["rollout_id"]
        assert "resumed" not in second[r]
    for r in (0, 2):
        assert second[r]["rollout_id"] == first[r]["rollout_id"] and second[r]["resumed"]
    metrics = json.loads((run_dir(tmp_path, "retry") / "metrics.json").read_text())["summary"]
    assert metrics["passed"] == 4 and metrics["failed"] == 0  # recomputed from the journal


EXPLAINING_MAIN = SCRIPTED_MAIN.replace(
    "        ctx.set_reward(1.0 if numbers and numbers[0] == ctx.label else 0.0)\n",
    "        said = numbers[0] if numbers else 'nothing'\n"
    "        ctx.set_reward(1.0 if numbers and numbers[0] == ctx.label else 0.0,\n"
    "                       explanation=f'answered {said}, expected {ctx.label}')\n",
)


def test_a_graders_explanation_is_kept_beside_its_reward(tmp_path, fake_model):
    assert EXPLAINING_MAIN != SCRIPTED_MAIN
    rows = [row("pass", 2, 3), {**row("wrong", 2, 4), "ground_truth": "0"}, row("pass", 3, 3),
            row("pass", 4, 3)]  # fmt: skip
    config = make_workspace(tmp_path, rows, main=EXPLAINING_MAIN)
    junit = tmp_path / "junit.xml"
    done = osmosis("eval", "run", str(config), "--name", "why", "-y", "--junit", str(junit),
                   cwd=tmp_path, env=model_env(fake_model))  # fmt: skip
    assert done.returncode == 0, done.stderr
    records = read_jsonl(run_dir(tmp_path, "why") / "events.jsonl")
    said = {r["row_index"]: (r["reward"], r["reward_explanation"]) for r in records}
    assert said[0] == (1.0, "answered 6, expected 6")
    assert said[1] == (0.0, "answered 8, expected 0")
    assert "reward 0 (not passed): answered 8, expected 0" in junit.read_text()
