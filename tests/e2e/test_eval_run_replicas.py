"""`osmosis eval run --replicas N` end to end: N rollout server processes share the attempts,
the outcome of every attempt is what one server gives, and a replica killed mid-run costs
nothing but time. Also on the platform (`OSMOSIS_ROLLOUT_REPLICAS`), shown by `eval info`."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.e2e.conftest import CLI, model_env, osmosis, read_jsonl
from tests.e2e.workspace import make_workspace, row

pytestmark = pytest.mark.slow

KINDS = ["pass", "wrong", "grader_error", "remove", "pass"]


def rows(count: int, **extra: object) -> list[dict]:
    made = []
    for index in range(count):
        kind = KINDS[index % len(KINDS)]
        made.append(
            {**row(kind, index + 2, 3, **extra), "ground_truth": "0"}
            if kind == "wrong"
            else row(kind, index + 2, 3, **extra)
        )
    return made


def run_dir(workspace: Path, name: str) -> Path:
    return workspace / ".osmosis" / "evals" / name


def outcomes(workspace: Path, name: str) -> dict[tuple[int, int], tuple[str, float | None]]:
    return {
        (r["row_index"], r["run_index"]): (r["status"], r.get("reward"))
        for r in read_jsonl(run_dir(workspace, name) / "index.jsonl")
    }


def test_two_replicas_give_every_attempt_the_outcome_one_gives(tmp_path, fake_model):
    config = make_workspace(tmp_path, rows(50), n=4, limit=50, batch_size=8)
    env = model_env(fake_model, MAX_CONCURRENT="4")
    for name, replicas in (("one", "1"), ("two", "2")):
        done = osmosis(
            "eval", "run", str(config), "--name", name, "--replicas", replicas, "-y", "--json",
            cwd=tmp_path, env=env,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
    one, two = outcomes(tmp_path, "one"), outcomes(tmp_path, "two")
    assert len(one) == 200 and one == two
    served_by = {
        name: {e["endpoint"] for e in read_jsonl(run_dir(tmp_path, name) / "events.jsonl")}
        for name in ("one", "two")
    }
    assert served_by == {"one": {"scripted"}, "two": {"scripted-0", "scripted-1"}}
    manifest = json.loads((run_dir(tmp_path, "two") / "manifest.json").read_text())
    assert manifest["provenance"]["replicas"] == 2
    metrics = json.loads((run_dir(tmp_path, "two") / "metrics.json").read_text())
    assert metrics["eval_run"]["replicas"] == 2


def test_a_replica_killed_at_30_percent_costs_nothing(tmp_path, fake_model):
    config = make_workspace(tmp_path, rows(200, sleep=0.1), limit=200, batch_size=8)
    env = model_env(fake_model, MAX_CONCURRENT="4")
    process = subprocess.Popen(
        [*CLI, "eval", "run", str(config), "--name", "killed", "--replicas", "2", "-y", "--json"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    journal = run_dir(tmp_path, "killed") / "events.jsonl"
    deadline = time.monotonic() + 120
    while not (journal.exists() and len(journal.read_bytes().splitlines()) >= 60):
        assert time.monotonic() < deadline and process.poll() is None, "run never got going"
        time.sleep(0.02)
    servers = rollout_servers(process.pid)
    assert len(servers) == 2
    os.kill(servers[0], signal.SIGKILL)
    out, err = process.communicate(timeout=180)
    assert process.returncode == 0, err
    entries = read_jsonl(journal)
    keys = [(e["row_index"], e["run_index"]) for e in entries]
    assert sorted(keys) == [(r, 0) for r in range(200)]  # every attempt recorded exactly once
    metrics = json.loads(out)["resource"]["metrics"]
    assert metrics["total_samples"] == 200
    # 1 in 5 rows has a grader that raises: those failures are the rollout's, none other.
    assert metrics["errors_by_type"] == {"agent_error": 40}
    log = (run_dir(tmp_path, "killed") / "logs.txt").read_text()
    assert "killed by SIGKILL" in log and "(restart 1 of 2 within 10 minutes)" in log


def rollout_servers(engine_pid: int) -> list[int]:
    """The rollout server processes the `eval run` process started (its children)."""
    children = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            cmdline = (stat.parent / "cmdline").read_bytes()
        except OSError:
            continue
        if int(fields[1]) == engine_pid and b"main.py" in cmdline:
            children.append(int(stat.parent.name))
    return sorted(children)


def test_the_platform_starts_the_configured_replicas_and_eval_info_shows_them(tmp_path, fake_model):
    from tests.platform.eval_world import (
        Server,
        finished,
        make_repo,
        run_dir,
        submit,
        upload_dataset,
    )

    server = Server.start(tmp_path / "platform", fake_model, OSMOSIS_ROLLOUT_REPLICAS="2")
    try:
        repo = make_repo(
            tmp_path / "ws", rows(20, sleep=0.05), limit=20, batch_size=8,
            env={"MAX_CONCURRENT": "4"},
        )  # fmt: skip
        upload_dataset(server, repo)
        with server.client() as client:
            created = submit(client, repo)
            detail = finished(client, created.id)
        assert detail.eval_run.status == "finished", detail.eval_run.error
        journal = read_jsonl(run_dir(server, created.id) / "events.jsonl")
        assert {e["endpoint"] for e in journal} == {"scripted-0", "scripted-1"}
        info = osmosis(
            "--plain", "eval", "info", created.name, cwd=repo.tree,
            env={**server.env, "OSMOSIS_PLATFORM_URL": server.url},
        )  # fmt: skip
        assert info.returncode == 0, info.stderr
        assert "Replicas\t2" in info.stdout.splitlines()
    finally:
        server.stop()


def test_option_values_that_cannot_work_are_refused_naming_each(tmp_path, fake_model):
    config = make_workspace(tmp_path, rows(4), limit=4)
    done = osmosis(
        "eval", "run", str(config), "-y", "--json",
        "--replicas", "0", "--outage-wait", "-1", "--stall-after", "0",
        cwd=tmp_path, env=model_env(fake_model),
    )  # fmt: skip
    assert done.returncode == 1
    error = json.loads(done.stderr)["error"]
    assert error["code"] == "VALIDATION"
    assert error["message"] == "must be positive: --replicas 0, --outage-wait -1, --stall-after 0"
    assert not run_dir(tmp_path, "x").parent.exists()  # nothing was written
