"""The platform on Ray (`OSMOSIS_EXECUTOR=ray`): a run's rollout servers are actors on the
cluster's nodes, and the run finishes with the metrics the local executor gives it."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from osmosis.testing import FakeModelServer
from tests.e2e.workspace import row
from tests.integration.test_ray_cluster import ray_cluster
from tests.platform.eval_world import (
    Server,
    finished,
    make_repo,
    read_jsonl,
    run_dir,
    submit,
    upload_dataset,
)

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("ray"), pytest.mark.timeout(600)]
__all__ = ["ray_cluster"]  # the module-scoped cluster fixture, imported for this module

KINDS = ["pass", "wrong", "grader_error", "remove", "pass"]


@pytest.fixture(scope="module")
def fake_model() -> Iterator[FakeModelServer]:
    with FakeModelServer() as server:
        yield server


def test_a_platform_run_on_ray_finishes_with_the_local_executors_metrics(
    ray_cluster, tmp_path, fake_model
):
    rows = [row(KINDS[i % 5], i + 2, 3, sleep=0.05) for i in range(30)]
    for index in range(1, 30, 5):
        rows[index]["ground_truth"] = "0"  # "wrong": graded 0
    repo = make_repo(
        tmp_path / "ws", rows, n=2, limit=30, batch_size=8, env={"MAX_CONCURRENT": "4"}
    )
    closed = {k: v for k, v in ray_cluster.env.items() if k == "HOME" or k.startswith("RAY_")}
    settings = {
        "local": {"OSMOSIS_EXECUTOR": "local"},
        "ray": {"OSMOSIS_EXECUTOR": "ray", "OSMOSIS_RAY_ADDRESS": ray_cluster.address, **closed},
    }
    summaries, journals, logs = {}, {}, {}
    for executor, values in settings.items():
        server = Server.start(tmp_path / executor, fake_model, OSMOSIS_SANDBOX="off", **values)
        try:
            upload_dataset(server, repo)
            with server.client() as client:
                created = submit(client, repo)
                detail = finished(client, created.id, timeout=300)
            assert detail.eval_run.status == "finished", detail.eval_run.error
            directory = run_dir(server, created.id)
            summaries[executor] = json.loads((directory / "metrics.json").read_text())["summary"]
            journals[executor] = read_jsonl(directory / "events.jsonl")
            logs[executor] = (directory / "logs.txt").read_text()
        finally:
            server.stop()
    assert summaries["ray"] == summaries["local"]
    assert summaries["ray"]["total_samples"] == 60
    outcome = {
        name: {(e["row_index"], e["run_index"]): (e["status"], e.get("reward")) for e in entries}
        for name, entries in journals.items()
    }
    assert outcome["ray"] == outcome["local"]
    # One rollout server per alive node (2, under the cap of 4), each on its own node.
    placement = {(e["endpoint"], e["node"]) for e in journals["ray"]}
    assert {endpoint for endpoint, _ in placement} == {"scripted-0", "scripted-1"}
    assert len({node for _, node in placement}) == 2
    assert "outside the platform's sandbox" in logs["ray"]


def test_the_per_run_replica_cap_is_said_and_kept(ray_cluster, tmp_path, fake_model):
    repo = make_repo(tmp_path / "ws", [row("pass", i + 2, 3) for i in range(6)], limit=6)
    closed = {k: v for k, v in ray_cluster.env.items() if k == "HOME" or k.startswith("RAY_")}
    server = Server.start(
        tmp_path / "capped", fake_model, OSMOSIS_SANDBOX="off", OSMOSIS_EXECUTOR="ray",
        OSMOSIS_RAY_ADDRESS=ray_cluster.address, OSMOSIS_RAY_MAX_REPLICAS="1", **closed,
    )  # fmt: skip
    try:
        upload_dataset(server, repo)
        with server.client() as client:
            created = submit(client, repo)
            detail = finished(client, created.id, timeout=300)
        assert detail.eval_run.status == "finished", detail.eval_run.error
        directory = run_dir(server, created.id)
        assert {e["endpoint"] for e in read_jsonl(directory / "events.jsonl")} == {"scripted"}
        log = (directory / "logs.txt").read_text()
        assert (
            "2 rollout servers wanted; the per-run cap allows 1 (OSMOSIS_RAY_MAX_REPLICAS)" in log
        )
        metrics = json.loads((directory / "metrics.json").read_text())
        assert metrics["eval_run"]["replicas"] == 1
    finally:
        server.stop()
