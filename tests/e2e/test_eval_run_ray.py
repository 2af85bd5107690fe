"""`osmosis eval run --executor ray` end to end, on a two-node Ray cluster on loopback
(`ray start` twice: tests/integration/test_ray_cluster.py).

- 200 attempts with a replica on each node: every record and the metrics equal the local
  engine's; each attempt's trajectory and artifacts come back through the site.
- A replica's rollout server SIGKILLed on its node: restarted there (its actor lives on), no
  attempt lost or failed.
- The second node SIGKILLed mid-run (every process of it): every attempt recorded exactly
  once, none failed, the replica placed again on the head.
- The cluster and the `eval run` driver, traced with strace throughout: every connection
  goes to 127.0.0.1 (or a Unix socket), nothing is written under the real $HOME or /tmp/ray.
- One replica on this machine: the engine talks to its rollout server directly (the log
  says so); told to try it at an address where it does not answer, through its actor.
  Either way every attempt is recorded once, with the files it left.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.e2e.conftest import CLI, model_env, osmosis, read_jsonl
from tests.e2e.workspace import SCRIPTED_MAIN, make_workspace, row
from tests.integration.test_ray_cluster import (
    TRACED,
    RayCluster,
    off_loopback_connects,
    ray_cluster,
    traced_run,
    writes_under,
)

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("ray"), pytest.mark.timeout(600)]
__all__ = ["ray_cluster"]  # the module-scoped cluster fixture, imported for this module

KINDS = ["pass", "wrong", "grader_error", "remove", "pass"]
# The scripted rollout, also leaving an artifact: it must come back from the node.
MAIN = SCRIPTED_MAIN.replace(
    "        reply = await ctx.chat(ctx.prompt)\n",
    "        reply = await ctx.chat(ctx.prompt)\n"
    "        (ctx.artifacts_dir / 'answer.txt').write_text(reply['content'])\n",
)
VOLATILE = ("rollout_id", "duration_ms", "finished_at", "endpoint", "node")


def rows(count: int, **extra: object) -> list[dict]:
    made = []
    for index in range(count):
        kind = KINDS[index % len(KINDS)]
        made.append(row(kind, index + 2, 3, **extra))
        if kind == "wrong":
            made[-1]["ground_truth"] = "0"
    return made


def run_dir(workspace: Path, name: str) -> Path:
    return workspace / ".osmosis" / "evals" / name


def records(workspace: Path, name: str) -> dict[tuple[int, int], dict]:
    """The journal's records by (row, attempt), without what differs between any two runs."""
    return {
        (e["row_index"], e["run_index"]): {k: v for k, v in e.items() if k not in VOLATILE}
        for e in read_jsonl(run_dir(workspace, name) / "events.jsonl")
    }


def ray_env(cluster: RayCluster, fake_model, **extra: str) -> dict[str, str]:
    return {**model_env(fake_model, MAX_CONCURRENT="4", **extra), **cluster.env}


def test_200_attempts_over_two_nodes_give_the_local_engines_records(
    ray_cluster, tmp_path, fake_model
):
    config = make_workspace(tmp_path, rows(50), n=4, limit=50, batch_size=8, main=MAIN)
    local = osmosis(
        "eval", "run", str(config), "--name", "local", "--replicas", "2", "-y", "--json",
        cwd=tmp_path, env=model_env(fake_model, MAX_CONCURRENT="4"),
    )  # fmt: skip
    assert local.returncode == 0, local.stderr
    ray = traced_run(
        [*CLI, "eval", "run", str(config), "--name", "ray", "--executor", "ray",
         "--ray-address", ray_cluster.address, "-y", "--json"],
        ray_cluster.trace_dir / "driver-200", cwd=tmp_path, env=ray_env(ray_cluster, fake_model),
        timeout=400,
    )  # fmt: skip
    assert ray.returncode == 0, ray.stderr[-3000:]

    on_ray, here = records(tmp_path, "ray"), records(tmp_path, "local")
    assert len(on_ray) == 200 and on_ray == here
    metrics = {
        name: json.loads((run_dir(tmp_path, name) / "metrics.json").read_text())
        for name in ("ray", "local")
    }
    assert metrics["ray"]["summary"] == metrics["local"]["summary"]
    assert metrics["ray"]["eval_run"]["replicas"] == 2  # one per node, by default
    journal = read_jsonl(run_dir(tmp_path, "ray") / "events.jsonl")
    placement = {(e["endpoint"], e["node"]) for e in journal}
    assert {endpoint for endpoint, _ in placement} == {"scripted-0", "scripted-1"}
    assert len({node for _, node in placement}) == 2  # each on its own Ray node
    assert all(node.startswith("127.0.0.1 (ray node ") for _, node in placement)
    for name in ("ray", "local"):  # what the rollout wrote on its node is in the run dir
        directory = run_dir(tmp_path, name)
        answers = sorted((directory / "artifacts").glob("row_*_run_*/answer.txt"))
        assert len(answers) == 200, name  # written by the workflow, before any grader ran
        assert len(list((directory / "trajectories").glob("row_*_run_*.json"))) == 200
    ray_artifacts = run_dir(tmp_path, "ray") / "artifacts"
    local_artifacts = run_dir(tmp_path, "local") / "artifacts"
    assert {p.relative_to(ray_artifacts): p.read_text() for p in ray_artifacts.rglob("*.txt")} == {
        p.relative_to(local_artifacts): p.read_text() for p in local_artifacts.rglob("*.txt")
    }
    manifest = json.loads((run_dir(tmp_path, "ray") / "manifest.json").read_text())
    assert manifest["provenance"]["executor"] == "ray"


def rollout_server(cluster: RayCluster, node: int) -> int | None:
    """The pid of the rollout server a replica's actor runs on `node` (its temp dir holds the
    shipped checkout the server runs from)."""
    marker = f"{cluster.root}/ray-{node}/".encode()
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            text = cmdline.read_bytes()
        except OSError:
            continue
        if marker in text and b"rollouts/scripted/main.py" in text:
            return int(cmdline.parent.name)
    return None


def test_a_rollout_server_killed_on_its_node_restarts_there_costing_nothing(
    ray_cluster, tmp_path, fake_model
):
    config = make_workspace(tmp_path, rows(120, sleep=0.3), limit=120, batch_size=8)
    process = subprocess.Popen(
        [*CLI, "eval", "run", str(config), "--name", "server", "--executor", "ray",
         "--ray-address", ray_cluster.address, "-y", "--json"],
        cwd=tmp_path, env=ray_env(ray_cluster, fake_model),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    journal = run_dir(tmp_path, "server") / "events.jsonl"
    deadline = time.monotonic() + 180
    while not (journal.exists() and len(read_jsonl(journal)) >= 30):
        assert time.monotonic() < deadline and process.poll() is None, "the run never got going"
        time.sleep(0.1)
    server = rollout_server(ray_cluster, 0)
    assert server is not None
    os.kill(server, signal.SIGKILL)
    out, err = process.communicate(timeout=300)
    assert process.returncode == 0, err[-3000:]
    entries = read_jsonl(journal)
    assert sorted((e["row_index"], e["run_index"]) for e in entries) == [(r, 0) for r in range(120)]
    assert json.loads(out)["resource"]["metrics"]["errors_by_type"] == {"agent_error": 24}
    log = (run_dir(tmp_path, "server") / "logs.txt").read_text()
    assert "rollout server 'scripted-0' exited unexpectedly (code -9, killed by SIGKILL)" in log
    assert "restarting rollout server scripted-0 (restart 1 of 2 within 10 minutes)" in log
    assert "placing rollout server scripted-0" not in log  # its actor lives: restarted in place
    assert len({e["node"] for e in entries if e["endpoint"] == "scripted-0"}) == 1


def test_killing_the_second_node_mid_run_loses_no_attempt(ray_cluster, tmp_path, fake_model):
    config = make_workspace(tmp_path, rows(200, sleep=0.3), limit=200, batch_size=8)
    trace = ray_cluster.trace_dir / "driver-kill"
    process = subprocess.Popen(
        ["strace", "-f", "--seccomp-bpf", "-qq", "-e", f"trace={TRACED}", "-o", str(trace),
         *CLI, "eval", "run", str(config), "--name", "killed", "--executor", "ray",
         "--ray-address", ray_cluster.address, "-y", "--json"],
        cwd=tmp_path, env=ray_env(ray_cluster, fake_model),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    journal = run_dir(tmp_path, "killed") / "events.jsonl"
    deadline = time.monotonic() + 180
    while True:  # both replicas serving, about 30 % recorded
        entries = read_jsonl(journal) if journal.exists() else []
        if len(entries) >= 60 and len({e["endpoint"] for e in entries}) == 2:
            break
        assert time.monotonic() < deadline and process.poll() is None, "the run never got going"
        time.sleep(0.1)
    ray_cluster.kill_node(1)
    killed_at = len(read_jsonl(journal))
    out, err = process.communicate(timeout=300)
    assert process.returncode == 0, err[-3000:]
    entries = read_jsonl(journal)
    keys = sorted((e["row_index"], e["run_index"]) for e in entries)
    assert keys == [(r, 0) for r in range(200)]  # every attempt recorded exactly once
    metrics = json.loads(out)["resource"]["metrics"]
    assert metrics["total_samples"] == 200
    # 1 row in 5 has a grader that raises: those failures are the rollout's, none other.
    assert metrics["errors_by_type"] == {"agent_error": 40}
    assert killed_at < 120  # the node was lost with most of the run still to go
    log = (run_dir(tmp_path, "killed") / "logs.txt").read_text()
    assert "rollout endpoint scripted-1 (127.0.0.1 (ray node " in log and "is gone" in log
    assert "restarting rollout server scripted-1 (restart 1 of 2 within 10 minutes)" in log
    head = {e["node"] for e in entries if e["endpoint"] == "scripted-0"}.pop()
    head_id = head.removeprefix("127.0.0.1 (ray node ").rstrip(")")
    assert f"placing rollout server scripted-1 on 127.0.0.1 ({head_id})" in log  # not the lost one


def test_the_cluster_and_the_driver_contact_only_loopback_and_leave_home_alone(
    ray_cluster, tmp_path, fake_model
):
    config = make_workspace(tmp_path, rows(10), limit=10, batch_size=4)
    done = traced_run(
        [*CLI, "eval", "run", str(config), "--name", "small", "--executor", "ray",
         "--ray-address", ray_cluster.address, "-y", "--json"],
        ray_cluster.trace_dir / "driver-small", cwd=tmp_path,
        env=ray_env(ray_cluster, fake_model), timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    traces = ray_cluster.trace_files()
    assert len(traces) >= 3  # both nodes and at least this driver
    text = "".join(path.read_text(errors="replace") for path in traces)
    assert f"htons({ray_cluster.port})" in text  # the traces did see the cluster's traffic
    assert off_loopback_connects(traces) == []
    home = os.path.realpath(os.path.expanduser("~"))  # the real one: tests leave it set
    assert writes_under(traces, [home, "/tmp/ray"]) == []


def run_on_one_replica(cluster: RayCluster, workspace: Path, fake_model, name: str, **env: str):
    """`eval run --executor ray --replicas 1` of 30 attempts, each leaving an artifact: the
    run's journal and log."""
    config = make_workspace(workspace, rows(30), limit=30, batch_size=8, main=MAIN)
    done = osmosis(
        "eval", "run", str(config), "--name", name, "--executor", "ray", "--replicas", "1",
        "--ray-address", cluster.address, "-y", "--json",
        cwd=workspace, env={**ray_env(cluster, fake_model), **env}, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    directory = run_dir(workspace, name)
    entries = read_jsonl(directory / "events.jsonl")
    keys = sorted((e["row_index"], e["run_index"]) for e in entries)
    assert keys == [(r, 0) for r in range(30)]  # every attempt recorded exactly once
    # What each rollout wrote on its node came back, with the direct path as with the relay.
    assert len(list((directory / "artifacts").glob("row_*_run_*/answer.txt"))) == 30
    assert json.loads(done.stdout)["resource"]["metrics"]["errors_by_type"] == {"agent_error": 6}
    return (directory / "logs.txt").read_text()


def test_on_this_machine_the_engine_talks_to_the_rollout_server_directly(
    ray_cluster, tmp_path, fake_model
):
    log = run_on_one_replica(ray_cluster, tmp_path, fake_model, "direct")
    assert (
        "Ray: rollout server scripted on 127.0.0.1: protocol calls straight to "
        "http://127.0.0.1:" in log
    )
    assert "(it answers from here)" in log
    assert "relayed by its actor" not in log
    # Its node is this machine: the attempts' files are taken from the node's directory.
    assert "Ray: rollout server scripted: trial files taken from /" in log


def test_a_rollout_server_that_does_not_answer_from_here_is_reached_through_its_actor(
    ray_cluster, tmp_path, fake_model
):
    # The server binds 127.0.0.1 on its node: tried at 127.0.0.2, it refuses the engine.
    log = run_on_one_replica(
        ray_cluster, tmp_path, fake_model, "relay", OSMOSIS_RAY_SERVER_HOST="127.0.0.2"
    )
    assert "Ray: rollout server scripted on 127.0.0.1: protocol calls relayed by its actor " in log
    assert "(http://127.0.0.2:" in log and "does not answer from here: " in log
    assert "protocol calls straight to" not in log
    assert "trial files taken from" not in log  # they came back with each relayed result
