"""Each worker's live figures for Prometheus (issue 29), on `OSMOSIS_METRICS_PORT` when set.

    server = MetricsServer.start(settings)     # the worker process (the scheduler), at start
    env.update(server.child_env())             # every run worker it spawns writes its figures
    figures = figures_from_env()               # in the run worker: None when metrics are off
    await run_evaluation(plan, sink, site=site, observer=figures)
    server.close()

A worker runs each claimed run in a process of its own (`run_worker`), so the figures are
counted there and served here: prometheus-client's multiprocess mode, each run worker writing
its counters to memory-mapped files in a private directory the scheduler gives it
(`PROMETHEUS_MULTIPROC_DIR`, passed to the run workers only), and the scheduler's registry
summing them at each scrape. A run worker's counts stay after it exits, so every counter
covers this worker process's life. The served endpoint needs `OSMOSIS_METRICS_TOKEN` as a
bearer token when that is set, like the API's `/metrics`.

Figures (every name in docs/platform.md):

- `osmosis_worker_attempts_total{outcome}`: recorded attempts (passed, not_passed, errored,
  skipped); `rate(...[1m])` is attempts per second.
- `osmosis_worker_attempt_duration_seconds`: dispatch to terminal result, per attempt.
- `osmosis_worker_bridge_calls_total{status}`: model calls the bridge answered, by status.
- `osmosis_worker_provider_request_duration_seconds`: each request to the model provider,
  retries one by one.
- `osmosis_worker_provider_requests_total{status}`: those requests by the provider's status
  (`none`: no answer); `osmosis_worker_provider_rate_limited_total`: the 429s among them.
- `osmosis_worker_rollout_server_restarts_total`: rollout servers replaced mid-run.
- `osmosis_worker_sandbox_limit_breaches_total`: attempts failed for a sandbox resource limit
  (memory, processes, CPU time, file size, output bytes: `resource_limit`).
- `osmosis_worker_runs`: the runs this worker holds now.
"""

from __future__ import annotations

import hmac
import os
import shutil
import threading
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from socketserver import ThreadingMixIn
from typing import TYPE_CHECKING, Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from osmosis.eval.host.observe import RunObserver
from osmosis.eval.sites.api import RESOURCE_LIMIT, ResourceLimitBreach
from osmosis.platform.core.home_lock import process_alive
from osmosis.platform.core.settings import Settings
from osmosis.private_file import make_private_dir

if TYPE_CHECKING:
    from prometheus_client.core import Metric

    from osmosis.eval.model.bridge_calls import CallRecord
    from osmosis.eval.results.records import AttemptRecord

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"  # prometheus-client's own name for it
# Model calls take from a tenth of a second to minutes.
PROVIDER_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
ATTEMPT_BUCKETS = (0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0)


class WorkerFigures(RunObserver):
    """One run worker's counters, written to the scheduler's multiprocess directory."""

    def __init__(self) -> None:
        from prometheus_client import Counter, Histogram

        # registry=None: nothing collects them in this process; the files are what counts.
        self.attempts = Counter(
            "osmosis_worker_attempts", "Attempts recorded, by outcome.", ["outcome"], registry=None
        )
        self.attempt_seconds = Histogram(
            "osmosis_worker_attempt_duration_seconds",
            "Attempt wall time, dispatch to terminal result.",
            buckets=ATTEMPT_BUCKETS,
            registry=None,
        )
        self.bridge_calls = Counter(
            "osmosis_worker_bridge_calls",
            "Model calls the bridge answered for attempts, by HTTP status.",
            ["status"],
            registry=None,
        )
        self.provider_seconds = Histogram(
            "osmosis_worker_provider_request_duration_seconds",
            "Latency of each request to the model provider (each retry on its own).",
            buckets=PROVIDER_BUCKETS,
            registry=None,
        )
        self.provider_requests = Counter(
            "osmosis_worker_provider_requests",
            "Requests to the model provider, by its HTTP status (none: no answer).",
            ["status"],
            registry=None,
        )
        self.rate_limited = Counter(
            "osmosis_worker_provider_rate_limited",
            "Provider answers 429 (rate limited), retried or not.",
            registry=None,
        )
        self.restarts = Counter(
            "osmosis_worker_rollout_server_restarts",
            "Rollout servers replaced mid-run (died, stopped answering, or a limit killed them).",
            registry=None,
        )
        self.breaches = Counter(
            "osmosis_worker_sandbox_limit_breaches",
            "Attempts failed for a sandbox resource limit (error type resource_limit).",
            registry=None,
        )
        self._threshold = 1.0

    def run_started(self, *, run_id: str, local_run_id: str, pass_threshold: float) -> None:
        self._threshold = pass_threshold

    def recorded(self, record: AttemptRecord) -> None:
        from osmosis.vocabulary import outcome

        self.attempts.labels(outcome(record.status, record.reward, self._threshold)).inc()
        self.attempt_seconds.observe(record.duration_ms / 1000)
        if record.error_type == RESOURCE_LIMIT:
            self.breaches.inc()

    def model_call(self, call: CallRecord) -> None:
        self.bridge_calls.labels(str(call.status_code)).inc()

    def provider_answered(self, status: int | None, seconds: float) -> None:
        self.provider_seconds.observe(seconds)
        self.provider_requests.labels(str(status) if status is not None else "none").inc()
        if status == 429:
            self.rate_limited.inc()

    def server_restarted(self, name: str, reason: str, breach: ResourceLimitBreach | None) -> None:
        # A limit that killed the server is counted on the attempt it is charged to.
        self.restarts.inc()


def figures_from_env(environ: dict[str, str] | None = None) -> WorkerFigures | None:
    """The run worker's figures when its scheduler serves metrics, else None (and
    prometheus-client not imported)."""
    env = os.environ if environ is None else environ
    directory = env.get(MULTIPROC_ENV)
    if not directory or not Path(directory).is_dir():
        return None
    return WorkerFigures()


class _HeldRuns:
    """`osmosis_worker_runs`: read from the scheduler at each scrape."""

    def __init__(self, count: Callable[[], int]) -> None:
        self._count = count

    def collect(self) -> Iterator[Metric]:
        from prometheus_client.core import GaugeMetricFamily

        yield GaugeMetricFamily(
            "osmosis_worker_runs", "Runs this worker holds now.", value=self._count()
        )


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """Scrapes every few seconds would bury the server log."""


class MetricsServer:
    """The worker's figures over HTTP on `metrics_host:metrics_port` (module doc)."""

    def __init__(self, directory: Path, server: _Server, thread: threading.Thread) -> None:
        self.directory = directory
        self._server = server
        self._thread = thread

    @classmethod
    def start(cls, settings: Settings, *, held: Callable[[], int]) -> MetricsServer:
        """Bind now (a taken port fails the worker's start, naming the setting) and serve
        from a thread."""
        from prometheus_client import CollectorRegistry, make_wsgi_app
        from prometheus_client.multiprocess import MultiProcessCollector

        assert settings.metrics_port is not None
        # This process's own: counts left by an earlier process with this pid are not ours,
        # nor are those of workers that were killed before they could clear theirs.
        root = settings.home / "worker-metrics"
        directory = root / str(os.getpid())
        shutil.rmtree(directory, ignore_errors=True)
        for left in root.glob("*") if root.is_dir() else ():
            if not left.name.isdigit() or not process_alive(int(left.name)):
                shutil.rmtree(left, ignore_errors=True)
        make_private_dir(directory)
        registry = CollectorRegistry()
        MultiProcessCollector(registry, path=str(directory))  # type: ignore[no-untyped-call]
        registry.register(_HeldRuns(held))
        app = _guarded(make_wsgi_app(registry), settings.metrics_token)
        try:
            server = make_server(
                settings.metrics_host,
                settings.metrics_port,
                app,
                server_class=_Server,
                handler_class=_Quiet,
            )
        except OSError as error:
            shutil.rmtree(directory, ignore_errors=True)
            raise OSError(
                f"the worker's metrics cannot listen on {settings.metrics_host}:"
                f"{settings.metrics_port} (OSMOSIS_METRICS_HOST / OSMOSIS_METRICS_PORT): {error}"
            ) from error
        thread = threading.Thread(
            target=server.serve_forever, name="osmosis-worker-metrics", daemon=True
        )
        thread.start()
        return cls(directory, server, thread)

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def child_env(self) -> dict[str, str]:
        """What a run worker needs in its environment to count into this server."""
        return {MULTIPROC_ENV: str(self.directory)}

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
        shutil.rmtree(self.directory, ignore_errors=True)


WsgiApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


def _guarded(app: WsgiApp, token: str | None) -> WsgiApp:
    """`app` behind the metrics token, when one is set (401 without it)."""
    if not token:
        return app
    expected = f"Bearer {token}".encode()

    def guarded(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        given = str(environ.get("HTTP_AUTHORIZATION", "")).encode()
        if hmac.compare_digest(given, expected):
            return app(environ, start_response)
        start_response(
            "401 Unauthorized",
            [("Content-Type", "text/plain; charset=utf-8"), ("WWW-Authenticate", "Bearer")],
        )
        return [b"the worker's metrics need the metrics token (Authorization: Bearer ...)\n"]

    return guarded


__all__ = ["MULTIPROC_ENV", "MetricsServer", "WorkerFigures", "figures_from_env"]
