"""`/metrics` (issue 29): Debian's Prometheus scrapes a live server and reads the platform's
figures; the token setting guards it; routes are labelled by template."""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
import time

import httpx
import pytest
from sqlalchemy import select

from osmosis.platform.app import create_app
from osmosis.platform.core.db import make_engine, make_session_factory
from osmosis.platform.core.db.models import User
from tests.platform.conftest import free_port
from tests.web.seed import Attempt, RunSpec, seed_run, workspace


@pytest.fixture(scope="module")
def seeded(running_platform):
    """Two finished runs in the live server's database: 2 passed, 1 not passed, 1 errored
    (timeout), 1 skipped over both."""
    engine = make_engine(running_platform.database_url, pool_size=1)
    try:
        with make_session_factory(engine)() as db:
            admin = db.scalar(select(User).where(User.name == "admin"))
            assert admin is not None
            ws = workspace(db, identity="metrics.example/ws", owner=admin)
            mixed = [
                Attempt(0, 0),
                Attempt(0, 1, reward=0.0),
                Attempt(1, 0, status="failed", reward=None, error_type="timeout"),
                Attempt(1, 1, status="skipped", reward=None),
            ]
            seed_run(db, running_platform.home, ws=ws, user=admin,
                     spec=RunSpec(name="metrics-mixed", attempts=mixed, n=2))  # fmt: skip
            seed_run(db, running_platform.home, ws=ws, user=admin,
                     spec=RunSpec(name="metrics-passed", attempts=[Attempt(0, 0)]))  # fmt: skip
            db.commit()
    finally:
        engine.dispose()
    return running_platform


def test_prometheus_scrapes_the_platforms_figures(seeded, tmp_path):
    if shutil.which("prometheus") is None:
        pytest.fail("prometheus is missing: scripts/install-system-deps.sh installs it")
    httpx.get(f"{seeded.url}/api/health")  # a request to be counted
    target = seeded.url.removeprefix("http://")
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 1s\n"
        "scrape_configs:\n"
        f"  - job_name: osmosis\n    static_configs:\n      - targets: ['{target}']\n"
    )
    port = free_port()
    prometheus = subprocess.Popen(
        [
            "prometheus",
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        outcomes = _query_until(port, "osmosis_attempts_total", lambda found: len(found) >= 4)
        by_outcome = {r["metric"]["outcome"]: float(r["value"][1]) for r in outcomes}
        assert by_outcome == {"passed": 2, "not_passed": 1, "errored": 1, "skipped": 1}
        errors = _query_until(port, "osmosis_attempt_errors_total", lambda found: bool(found))
        assert {r["metric"]["error_type"]: float(r["value"][1]) for r in errors} == {"timeout": 1}
        runs = _query_until(port, "osmosis_runs", lambda found: bool(found))
        assert sum(float(r["value"][1]) for r in runs) == 2
        requests = _query_until(
            port, 'osmosis_http_requests_total{route="/api/health"}', lambda found: bool(found)
        )
        assert float(requests[0]["value"][1]) >= 1
    finally:
        prometheus.terminate()
        prometheus.wait(timeout=10)


def _query_until(port: int, query: str, done, seconds: float = 30) -> list[dict]:
    deadline = time.monotonic() + seconds
    found: list[dict] = []
    while time.monotonic() < deadline:
        try:
            answer = httpx.get(
                f"http://127.0.0.1:{port}/api/v1/query", params={"query": query}, timeout=5
            )
            found = answer.json()["data"]["result"] if answer.status_code == 200 else []
        except (httpx.HTTPError, KeyError, ValueError):
            found = []
        if done(found):
            return found
        time.sleep(0.5)
    raise AssertionError(f"prometheus never answered {query!r} as expected: {found}")


def test_routes_are_labelled_by_template_never_by_the_path_sent(local_platform):
    from fastapi.testclient import TestClient

    with TestClient(local_platform.app) as client:
        client.get("/api/eval-runs/no-such-run-1")
        client.get("/api/eval-runs/no-such-run-2")
        client.get("/no/route/here/" + "x" * 50)
        text = client.get("/metrics").text
    assert "no-such-run" not in text and "xxxxx" not in text
    assert 'route="<unmatched>"' in text
    assert 'route="/api/eval-runs/{run' in text


def test_a_metrics_token_guards_the_scrape(tmp_path, databases):
    from fastapi.testclient import TestClient

    settings = dataclasses.replace(databases.settings(tmp_path / "home"), metrics_token="scrape-me")
    app = create_app(settings)
    try:
        with TestClient(app) as client:
            refused = client.get("/metrics")
            assert refused.status_code == 401
            assert refused.json()["error"]["code"] == "AUTH_REQUIRED"
            wrong = client.get("/metrics", headers={"Authorization": "Bearer nope"})
            assert wrong.status_code == 401
            served = client.get("/metrics", headers={"Authorization": "Bearer scrape-me"})
            assert served.status_code == 200 and "osmosis_runs" in served.text
    finally:
        app.state.engine.dispose()


def test_without_a_token_metrics_is_open_like_health(local_platform):
    from fastapi.testclient import TestClient

    with TestClient(local_platform.app) as client:
        served = client.get("/metrics")
    assert served.status_code == 200
    assert "# TYPE osmosis_attempts_total counter" in served.text
