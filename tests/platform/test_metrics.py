"""`/metrics` (issue 29): Debian's Prometheus scrapes a live server and reads the platform's
figures, and scrapes an API and a worker process during a run; the token setting guards both;
routes are labelled by template."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from cryptography.fernet import Fernet
from sqlalchemy import select

from osmosis.platform.app import create_app
from osmosis.platform.core.db import make_engine, make_session_factory
from osmosis.platform.core.db.models import User
from osmosis.testing import FakeModelServer
from tests.e2e.workspace import SCRIPTED_MAIN, row
from tests.platform.conftest import free_port
from tests.platform.eval_world import Server, finished, make_repo, submit, upload_dataset
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
    # The database statements those requests made, timed by kind.
    selects = re.search(
        r'osmosis_db_query_duration_seconds_count\{statement="select"\} (\S+)', text
    )
    assert selects is not None and float(selects.group(1)) > 0


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


# -- an API and a worker, scraped during a run (issue 29 acceptance) ---------------------------
TOKEN = "scrape-me"
# 6 pass, 2 graded 0 (not passed), 2 whose grader raises (errored); a second each, so the run
# lasts long enough to be scraped while it goes on.
RUN_ROWS = (
    [row("pass", a, 3, sleep=1.0) for a in range(2, 8)]
    + [row("pass_first_0", a, 5, sleep=1.0) for a in (2, 3)]
    + [row("grader_error", a, 7, sleep=1.0) for a in (2, 3)]
    + [row("die_once", 4, 4, sleep=1.0)]
)
OUTCOMES = {"passed": 7, "not_passed": 2, "errored": 2}
# One more row passes, after its rollout server died under it once (a restart to count).
DIES_ONCE = SCRIPTED_MAIN.replace(
    '        if kind == "hang":\n',
    '        if kind == "die_once" and not os.path.exists(os.environ["DIE_MARK"]):\n'
    '            Path(os.environ["DIE_MARK"]).write_text("died")\n'
    "            os._exit(3)\n"
    '        if kind == "hang":\n',
)


@pytest.fixture
def team_database(postgres) -> Iterator[str]:
    url = postgres.create_database()
    yield url
    postgres.drop_database(url)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_prometheus_scrapes_an_api_and_a_worker_during_a_run(tmp_path, team_database):
    """`osmosis server start --role api` and `--role worker` on one PostgreSQL database; the
    worker serves its own figures on OSMOSIS_METRICS_PORT. Both are scraped with the metrics
    token, and once more without it, which both refuse. The model answers 429 to a fifth of
    the calls (each retried by the bridge); the rollout server dies once mid-run."""
    shared = tmp_path / "shared-blobs"
    shared.mkdir()
    worker_port = free_port()
    with FakeModelServer(error_rate=0.2, retry_after=0.01, seed=3) as model:
        common = {
            "OSMOSIS_DATABASE_URL": team_database,
            "OSMOSIS_BLOB_DIR": str(shared),
            "OSMOSIS_BLOB_SHARED": "1",
            "OSMOSIS_SECRET_KEY": Fernet.generate_key().decode(),
            "OSMOSIS_SANDBOX": "off",  # processes and figures here; test_sandbox has the rest
            "OSMOSIS_METRICS_TOKEN": TOKEN,
        }
        api = Server.start(tmp_path / "api", model, OSMOSIS_ROLE="api", **common)
        worker = Server.start(
            tmp_path / "worker",
            model,
            OSMOSIS_ROLE="worker",
            OSMOSIS_METRICS_PORT=str(worker_port),
            OSMOSIS_OTEL_EXPORTER=f"file:{tmp_path / 'spans.jsonl'}",  # traces, by the way
            **common,
        )
        prometheus = None
        stack = contextlib.ExitStack()
        try:
            worker_url = f"http://127.0.0.1:{worker_port}/metrics"
            assert _answer(worker_url).status_code == 401  # bound once the worker runs
            assert httpx.get(f"{api.url}/metrics").status_code == 401
            served = httpx.get(worker_url, headers={"Authorization": f"Bearer {TOKEN}"})
            assert served.status_code == 200 and "osmosis_worker_runs 0.0" in served.text

            prometheus, port = _prometheus(
                tmp_path,
                api=api.url.removeprefix("http://"),
                worker=f"127.0.0.1:{worker_port}",
            )
            _query_until(port, 'up{job="worker"} == 1', lambda found: bool(found))
            repo = make_repo(
                tmp_path / "ws",
                RUN_ROWS,
                limit=len(RUN_ROWS),
                batch_size=2,
                main=DIES_ONCE,
                env={"DIE_MARK": str(tmp_path / "died")},
            )
            upload_dataset(api, repo)
            client = stack.enter_context(api.client())
            run_id = submit(client, repo).id

            live = _query_until(port, "sum(osmosis_worker_attempts_total)", lambda f: bool(f))
            assert float(live[0]["value"][1]) > 0
            assert client.runs.get(run_id).eval_run.status == "running"  # seen mid-run
            held = _query_until(port, "osmosis_worker_runs", lambda f: bool(f))
            assert float(held[0]["value"][1]) == 1

            detail = finished(client, run_id)
            assert detail.eval_run.status == "finished", detail.eval_run.error

            def outcomes(query: str) -> dict[str, float]:
                found = _query_until(
                    port,
                    query,
                    lambda found: (
                        {r["metric"]["outcome"]: float(r["value"][1]) for r in found}.items()
                        >= OUTCOMES.items()
                    ),
                )
                return {r["metric"]["outcome"]: float(r["value"][1]) for r in found}

            assert outcomes('osmosis_attempts_total{job="api"}') == {**OUTCOMES, "skipped": 0}
            assert outcomes('osmosis_worker_attempts_total{job="worker"}') == OUTCOMES
            calls = _query_until(
                port, 'osmosis_worker_bridge_calls_total{status="200"}', lambda f: bool(f)
            )
            assert float(calls[0]["value"][1]) >= len(RUN_ROWS)
            limited = _query_until(
                port, "osmosis_worker_provider_rate_limited_total > 0", lambda f: bool(f)
            )
            requests = _query_until(
                port, "osmosis_worker_provider_request_duration_seconds_count", lambda f: bool(f)
            )
            # Every call that reached the provider was timed, each 429 and its retry apart.
            assert float(requests[0]["value"][1]) >= float(calls[0]["value"][1]) + float(
                limited[0]["value"][1]
            )
            restarts = _query_until(
                port, "osmosis_worker_rollout_server_restarts_total", lambda f: bool(f)
            )
            assert float(restarts[0]["value"][1]) == 1
            refused = _query_until(port, 'up{job=~".*-without-token"}', lambda f: len(f) == 2)
            assert [float(r["value"][1]) for r in refused] == [0, 0]

            # The run worker's spans name the platform's run; every recorded attempt has one.
            lines = (tmp_path / "spans.jsonl").read_text().splitlines()
            spans = [json.loads(line) for line in lines]
            assert {span["attributes"]["osmosis.run.id"] for span in spans} == {run_id}
            recorded = [
                span["attributes"]["osmosis.attempt.key"]
                for span in spans
                if span["name"] == "osmosis.attempt"
                and not span["attributes"].get("osmosis.attempt.requeued")
            ]
            assert sorted(recorded) == sorted(f"{index}:0" for index in range(len(RUN_ROWS)))
        finally:
            stack.close()
            if prometheus is not None:
                prometheus.terminate()
                prometheus.wait(timeout=10)
            worker.stop()
            api.stop()


def _answer(url: str, seconds: float = 30) -> httpx.Response:
    deadline = time.monotonic() + seconds
    while True:
        try:
            return httpx.get(url)
        except httpx.ConnectError:
            assert time.monotonic() < deadline, f"nothing listens at {url}"
            time.sleep(0.1)


def _prometheus(tmp_path: Path, *, api: str, worker: str) -> tuple[subprocess.Popen[bytes], int]:
    """Debian's prometheus scraping both every second, with the token and without it."""
    if shutil.which("prometheus") is None:
        pytest.fail("prometheus is missing: scripts/install-system-deps.sh installs it")
    jobs = []
    for name, target in (("api", api), ("worker", worker)):
        jobs.append(
            f"  - job_name: {name}\n"
            f"    authorization: {{type: Bearer, credentials: {TOKEN}}}\n"
            f"    static_configs: [{{targets: ['{target}']}}]\n"
            f"  - job_name: {name}-without-token\n"
            f"    static_configs: [{{targets: ['{target}']}}]\n"
        )
    config = tmp_path / "prometheus.yml"
    config.write_text("global:\n  scrape_interval: 1s\nscrape_configs:\n" + "".join(jobs))
    port = free_port()
    process = subprocess.Popen(
        [
            "prometheus",
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'prometheus-data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return process, port
