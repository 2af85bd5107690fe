"""`/metrics`: what an operator's Prometheus scrapes from each API process.

    install(app, settings)      # the route, and the request-latency middleware
    curl -H "Authorization: Bearer $OSMOSIS_METRICS_TOKEN" http://127.0.0.1:8765/metrics

Two kinds of figures, in Prometheus' text format (`prometheus-client`):

- platform-wide, read from the database at each scrape (so every API process answers the same
  and none keeps state): `osmosis_runs{status}`, `osmosis_attempts_total{outcome}` (passed,
  not_passed, errored, skipped), `osmosis_attempt_errors_total{error_type}`,
  `osmosis_tokens_total{model}`, `osmosis_cost_usd_total{model}`,
  `osmosis_oldest_pending_run_seconds`, and how long those queries took
  (`osmosis_metrics_query_seconds`);
- this process's own: `osmosis_http_requests_total{method,route,status}` and
  `osmosis_http_request_duration_seconds{method,route}` (routes by template, `/api/eval-runs/{run}`,
  never by the path a client sent), `osmosis_db_query_duration_seconds{statement}` and, with an
  object store, `osmosis_blob_store_duration_seconds{operation}`.

With `OSMOSIS_METRICS_TOKEN` set, a scrape must carry it as a bearer token (401 otherwise); with
it unset, `/metrics` is open like `/api/health`.
"""

from __future__ import annotations

import hmac
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import Response
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector
from sqlalchemy import event, func, select
from sqlalchemy.orm import Session, sessionmaker
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from osmosis.platform.core.blobs import observe_store_operations
from osmosis.platform.core.db.run_models import EvalAttempt, EvalRun
from osmosis.platform.core.errors import AuthRequired
from osmosis.platform.core.settings import Settings
from osmosis.vocabulary import OUTCOMES

_UNMATCHED = "<unmatched>"  # a path no route serves: never the path itself (unbounded labels)


class PlatformFigures(Collector):
    """The platform-wide figures, read from the database when Prometheus scrapes."""

    def __init__(self, sessions: sessionmaker[Session]) -> None:
        self.sessions = sessions

    def collect(self) -> Iterator[Metric]:
        started = time.perf_counter()
        with self.sessions() as db:
            runs = GaugeMetricFamily(
                "osmosis_runs", "Evaluation runs by status.", labels=["status"]
            )
            for status, count in db.execute(
                select(EvalRun.status, func.count()).group_by(EvalRun.status)
            ):
                runs.add_metric([status], count)
            yield runs
            totals = db.execute(
                select(
                    func.coalesce(func.sum(EvalRun.passed), 0),
                    func.coalesce(func.sum(EvalRun.graded - EvalRun.passed), 0),
                    func.coalesce(func.sum(EvalRun.failed), 0),
                    func.coalesce(func.sum(EvalRun.skipped), 0),
                )
            ).one()
            outcomes = CounterMetricFamily(
                "osmosis_attempts",
                "Recorded attempts by outcome: passed (graded at or above the run's threshold), "
                "not_passed (graded below), errored (failed before a grade), skipped.",
                labels=["outcome"],
            )
            for outcome, count in zip(OUTCOMES, totals, strict=True):
                outcomes.add_metric([outcome], int(count))
            yield outcomes
            errors = CounterMetricFamily(
                "osmosis_attempt_errors", "Errored attempts by error type.", labels=["error_type"]
            )
            for error_type, count in db.execute(
                select(EvalAttempt.error_type, func.count())
                .where(EvalAttempt.error_type.is_not(None))
                .group_by(EvalAttempt.error_type)
            ):
                errors.add_metric([str(error_type)], count)
            yield errors
            tokens = CounterMetricFamily(
                "osmosis_tokens", "Model tokens used by runs, by model.", labels=["model"]
            )
            for model, count in db.execute(
                select(EvalRun.model_path, func.coalesce(func.sum(EvalRun.tokens), 0)).group_by(
                    EvalRun.model_path
                )
            ):
                tokens.add_metric([model], int(count))
            yield tokens
            cost = CounterMetricFamily(
                "osmosis_cost_usd", "Model cost of recorded attempts, by model.", labels=["model"]
            )
            for model, usd in db.execute(
                select(EvalRun.model_path, func.coalesce(func.sum(EvalAttempt.cost_usd), 0.0))
                .join(EvalAttempt, EvalAttempt.run_id == EvalRun.id)
                .group_by(EvalRun.model_path)
            ):
                cost.add_metric([model], float(usd or 0.0))
            yield cost
            oldest = db.scalar(
                select(func.min(EvalRun.created_at)).where(EvalRun.status == "pending")
            )
        waiting = GaugeMetricFamily(
            "osmosis_oldest_pending_run_seconds",
            "How long the oldest pending run has waited (0: none waits).",
        )
        if oldest is not None:
            created = oldest if oldest.tzinfo else oldest.replace(tzinfo=UTC)
            waiting.add_metric([], max(0.0, (datetime.now(UTC) - created).total_seconds()))
        else:
            waiting.add_metric([], 0.0)
        yield waiting
        query = GaugeMetricFamily(
            "osmosis_metrics_query_seconds", "How long reading these figures took this scrape."
        )
        query.add_metric([], time.perf_counter() - started)
        yield query


class RequestTimer:
    """ASGI middleware: each HTTP request counted and timed under its route's template."""

    def __init__(self, app: ASGIApp, *, requests: Counter, latency: Histogram) -> None:
        self.app = app
        self.requests = requests
        self.latency = latency

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500

        async def send_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            route = getattr(scope.get("route"), "path", None) or _UNMATCHED
            method = str(scope.get("method", ""))
            self.requests.labels(method, route, str(status)).inc()
            self.latency.labels(method, route).observe(time.perf_counter() - started)


def install(app: FastAPI, settings: Settings, sessions: sessionmaker[Session]) -> None:
    """Serve `/metrics` (token-guarded when `settings.metrics_token` is set) and time every
    request of `app`. Each app has its own registry: several apps in one process (tests)
    never share or collide."""
    registry = CollectorRegistry()
    registry.register(PlatformFigures(sessions))
    requests = Counter(
        "osmosis_http_requests",
        "HTTP requests answered, by method, route template and status.",
        ["method", "route", "status"],
        registry=registry,
    )
    latency = Histogram(
        "osmosis_http_request_duration_seconds",
        "HTTP request latency, by method and route template.",
        ["method", "route"],
        registry=registry,
    )
    app.add_middleware(RequestTimer, requests=requests, latency=latency)
    _time_the_database(sessions, registry)
    store = Histogram(
        "osmosis_blob_store_duration_seconds",
        "Object-store requests of this process (OSMOSIS_BLOB_URL), by operation.",
        ["operation"],
        registry=registry,
    )
    observe_store_operations(lambda operation, seconds: store.labels(operation).observe(seconds))
    token = settings.metrics_token

    @app.get("/metrics", include_in_schema=False)
    def metrics(request: Request) -> Response:
        if token:
            given = request.headers.get("authorization", "")
            if not hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
                raise AuthRequired(
                    "/metrics needs the metrics token (Authorization: Bearer "
                    "$OSMOSIS_METRICS_TOKEN)"
                )
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)


def _time_the_database(sessions: sessionmaker[Session], registry: CollectorRegistry) -> None:
    """`osmosis_db_query_duration_seconds{statement}`: every statement this process sends,
    by its first word (select, insert, update, delete, other)."""
    engine = sessions.kw.get("bind")
    if engine is None:
        return
    latency = Histogram(
        "osmosis_db_query_duration_seconds",
        "Database statements of this process, by kind.",
        ["statement"],
        registry=registry,
    )

    def started(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        conn.info.setdefault("osmosis_started", []).append(time.perf_counter())

    def ended(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        stack = conn.info.get("osmosis_started")
        if stack:
            word = statement.lstrip().split(None, 1)[0].lower() if statement.strip() else ""
            kind = word if word in _STATEMENTS else "other"
            latency.labels(kind).observe(time.perf_counter() - stack.pop())

    event.listen(engine, "before_cursor_execute", started)
    event.listen(engine, "after_cursor_execute", ended)


_STATEMENTS = frozenset({"select", "insert", "update", "delete"})

__all__ = ["PlatformFigures", "RequestTimer", "install"]
