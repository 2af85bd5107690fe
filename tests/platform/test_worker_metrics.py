"""A worker's live figures (issue 29.2): what run-worker processes count is served, summed, on
the worker's metrics port, behind the metrics token; with the setting unset nothing is counted
and prometheus-client is not even imported by a run worker.

The run workers here are real child processes given the environment the scheduler gives
them (`MetricsServer.child_env`), telling their figures what a run would;
tests/platform/test_metrics.py has Prometheus scrape a worker during a real run."""

from __future__ import annotations

import subprocess
import sys

import httpx
import pytest

from osmosis.platform.core.settings import Settings, SettingsError
from osmosis.platform.worker.metrics import MetricsServer
from tests.platform.conftest import free_port

# One run worker's share: two attempts (one passed, one failed on a sandbox limit), a model
# call, two provider requests (a 429, then the retry answered), a rollout-server restart.
RUN_WORKER = """
from datetime import UTC, datetime
from osmosis.eval.results.records import AttemptRecord
from osmosis.platform.worker.metrics import figures_from_env

figures = figures_from_env()
figures.run_started(run_id="r", local_run_id="l", pass_threshold=1.0)
def record(status, reward, error_type=None):
    return AttemptRecord(row_index=0, run_index=0, rollout_id="a" * 32, source_row_index=0,
                         status=status, reward=reward, duration_ms=1500.0,
                         error_type=error_type, finished_at=datetime.now(UTC))
figures.recorded(record("success", 1.0))
figures.recorded(record("failed", None, "resource_limit"))
figures.provider_answered(429, 0.01)
figures.provider_answered(200, 0.7)
figures.server_restarted("scripted", "exit code 1", None)
"""


def _figures(text: str) -> dict[str, float]:
    return {
        line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("osmosis_worker_")
    }


def test_run_workers_figures_are_summed_on_the_workers_port_behind_the_token(tmp_path):
    settings = Settings(home=tmp_path / "home", metrics_port=free_port(), metrics_token="t0k")
    server = MetricsServer.start(settings, held=lambda: 2)
    try:
        for _ in range(2):  # two runs, one process each, both finished
            done = subprocess.run(
                [sys.executable, "-c", RUN_WORKER],
                env={"PATH": "/usr/bin:/bin", **server.child_env()},
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert done.returncode == 0, done.stderr
        url = f"http://127.0.0.1:{server.port}/metrics"
        refused = httpx.get(url)
        assert refused.status_code == 401 and "metrics token" in refused.text
        assert httpx.get(url, headers={"Authorization": "Bearer nope"}).status_code == 401
        served = httpx.get(url, headers={"Authorization": "Bearer t0k"})
        assert served.status_code == 200
    finally:
        server.close()
    figures = _figures(served.text)
    assert figures['osmosis_worker_attempts_total{outcome="passed"}'] == 2
    assert figures['osmosis_worker_attempts_total{outcome="errored"}'] == 2
    assert figures["osmosis_worker_attempt_duration_seconds_count"] == 4
    assert figures["osmosis_worker_attempt_duration_seconds_sum"] == pytest.approx(6.0)
    assert figures['osmosis_worker_provider_requests_total{status="429"}'] == 2
    assert figures['osmosis_worker_provider_requests_total{status="200"}'] == 2
    assert figures["osmosis_worker_provider_rate_limited_total"] == 2
    assert figures['osmosis_worker_provider_request_duration_seconds_bucket{le="1.0"}'] == 4
    assert figures['osmosis_worker_provider_request_duration_seconds_bucket{le="0.05"}'] == 2
    assert figures["osmosis_worker_rollout_server_restarts_total"] == 2
    assert figures["osmosis_worker_sandbox_limit_breaches_total"] == 2
    assert figures["osmosis_worker_runs"] == 2
    assert not server.directory.exists()  # closed: the counts go with the worker


def test_a_taken_metrics_port_fails_the_start_naming_the_setting(tmp_path):
    settings = Settings(home=tmp_path / "home", metrics_port=free_port())
    first = MetricsServer.start(settings, held=lambda: 0)
    try:
        with pytest.raises(OSError, match="OSMOSIS_METRICS_PORT"):
            MetricsServer.start(
                Settings(home=tmp_path / "other", metrics_port=first.port), held=lambda: 0
            )
    finally:
        first.close()
    with pytest.raises(SettingsError, match="OSMOSIS_METRICS_PORT"):
        Settings(home=tmp_path / "home", metrics_port=70000)


UNSET = """
import sys
import osmosis.platform.worker.run_worker
from osmosis.platform.worker.metrics import figures_from_env
assert figures_from_env() is None
assert "prometheus_client" not in sys.modules, "imported without OSMOSIS_METRICS_PORT"
"""


def test_without_the_setting_a_run_worker_counts_nothing(tmp_path):
    done = subprocess.run(
        [sys.executable, "-c", UNSET],
        env={"PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
