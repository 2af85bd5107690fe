"""OpenTelemetry traces of a run (issue 29, optional): one span tree per run, so an operator
sees one attempt's timeline in Jaeger or Tempo.

    observer = from_env()   # None, and nothing of OpenTelemetry imported, when tracing is off

On when `OTEL_EXPORTER_OTLP_ENDPOINT` (or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) is set: spans
go to that collector over OTLP/HTTP (`pip install 'osmosis-eval[tracing]'`); the SDK reads its
usual `OTEL_*` variables (headers, service name, resource attributes). `OSMOSIS_OTEL_EXPORTER`
picks another exporter, for tests and debugging: `memory` (kept in this process:
`memory_spans()`), `file:PATH` (one JSON span per line, appended) or `otlp`.

The tree, every span carrying `osmosis.run.id`:

    osmosis.run                      the invocation (`osmosis.run.local_id`, status)
      osmosis.attempt                dispatch → the engine done with it (`osmosis.attempt.key`
                                     "row:run", `osmosis.rollout.id`, outcome, reward)
        osmosis.rollout.admission    the rollout server taking the attempt
        osmosis.rollout              admitted → terminal result: the agent and the rollout's
                                     grader, on the rollout server
          osmosis.model.call         each model call through the bridge (status, tokens)
        osmosis.grading              the result read against the pass threshold, recorded

An attempt that goes back to pending (its server died, the provider was down) ends with
`osmosis.attempt.requeued`; its retry is a new attempt span with a new rollout id.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from osmosis.eval.errors import HostError
from osmosis.eval.host.observe import RunObserver, call_bounds_ns
from osmosis.eval.results.records import AttemptRecord

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from opentelemetry.trace import Span, Tracer

    from osmosis.eval.model.bridge_calls import CallRecord

logger = logging.getLogger("osmosis.eval.host.tracing")

ENDPOINT_ENVS = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
EXPORTER_ENV = "OSMOSIS_OTEL_EXPORTER"
_CHOICES = "memory, file:PATH or otlp"


class TracingSetupError(HostError):
    """The tracing settings name an exporter that cannot be used."""

    default_hint = "unset OSMOSIS_OTEL_EXPORTER and OTEL_EXPORTER_OTLP_ENDPOINT to run untraced"


def exporter_setting(environ: Mapping[str, str] | None = None) -> str | None:
    """Which exporter the environment asks for (`memory`, `file:PATH`, `otlp`); None: off."""
    env = os.environ if environ is None else environ
    chosen = env.get(EXPORTER_ENV, "").strip()
    if chosen:
        return chosen
    if any(env.get(name, "").strip() for name in ENDPOINT_ENVS):
        return "otlp"
    return None


def from_env(environ: Mapping[str, str] | None = None) -> RunObserver | None:
    """The run's span tree when tracing is on, else None (and no OpenTelemetry import)."""
    setting = exporter_setting(environ)
    if setting is None:
        return None
    provider = _provider(setting)
    return SpanTree(provider.get_tracer("osmosis.eval"), provider)


def memory_spans() -> list[Any]:
    """The spans finished so far in this process with `OSMOSIS_OTEL_EXPORTER=memory`."""
    return list(_memory_exporter().get_finished_spans())


@functools.cache
def _memory_exporter() -> InMemorySpanExporter:
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    return InMemorySpanExporter()


@functools.cache  # one provider per process and setting: every run of the process shares it
def _provider(setting: str) -> TracerProvider:
    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import (
            BatchSpanProcessor,
            ConsoleSpanExporter,
            SimpleSpanProcessor,
        )
    except ImportError:
        raise TracingSetupError(
            f"tracing is on ({EXPORTER_ENV} or OTEL_EXPORTER_OTLP_ENDPOINT is set) but the "
            "OpenTelemetry SDK is not installed: pip install 'osmosis-eval[tracing]'"
        ) from None
    provider = TracerProvider(
        resource=Resource.create({"service.name": "osmosis"})  # OTEL_SERVICE_NAME wins
    )
    if setting == "memory":
        provider.add_span_processor(SimpleSpanProcessor(_memory_exporter()))
    elif setting.startswith("file:") and setting.removeprefix("file:"):
        path = Path(setting.removeprefix("file:")).expanduser()
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            out = path.open("a", encoding="utf-8")
        except OSError as error:
            raise TracingSetupError(
                f"{EXPORTER_ENV}={setting}: cannot write {path}: {error}"
            ) from None
        exporter = ConsoleSpanExporter(
            out=out, formatter=lambda span: json.dumps(json.loads(span.to_json())) + "\n"
        )
        # Batched off the event loop, as OTLP is; `run_ended` flushes before the exit.
        provider.add_span_processor(BatchSpanProcessor(exporter))
    elif setting == "otlp":
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        except ImportError:
            raise TracingSetupError(
                "OTEL_EXPORTER_OTLP_ENDPOINT is set but the OTLP exporter is not installed: "
                "pip install 'osmosis-eval[tracing]'"
            ) from None
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    else:
        raise TracingSetupError(f"{EXPORTER_ENV} must be {_CHOICES}, got {setting!r}")
    return provider


@dataclass
class _Attempt:
    span: Span
    context: Context
    attributes: dict[str, Any]
    rollout: Span | None = None
    rollout_context: Context | None = None
    grading: Span | None = None
    recorded: bool = False


class SpanTree(RunObserver):
    """One run's spans (module doc); what a run does not close is closed at its end."""

    def __init__(self, tracer: Tracer, provider: TracerProvider) -> None:
        self._tracer = tracer
        self._provider = provider
        self._run: Span | None = None
        self._run_context: Context | None = None
        self._base: dict[str, Any] = {}
        self._threshold = 1.0
        self._attempts: dict[str, _Attempt] = {}

    def run_started(self, *, run_id: str, local_run_id: str, pass_threshold: float) -> None:
        from opentelemetry import trace

        self._base = {"osmosis.run.id": run_id}
        self._threshold = pass_threshold
        self._run = self._tracer.start_span(
            "osmosis.run", attributes={**self._base, "osmosis.run.local_id": local_run_id}
        )
        self._run_context = trace.set_span_in_context(self._run)

    def run_ended(self, *, status: str, halted: str | None) -> None:
        for rollout_id in list(self._attempts):
            self.attempt_closed(rollout_id)
        if self._run is not None:
            self._run.set_attribute("osmosis.run.status", status)
            if halted:
                self._run.set_attribute("osmosis.run.halted", halted)
            self._run.end()
            self._run = None
        # Spans leave before the process may exit (a platform worker ends with its run).
        self._provider.force_flush()

    def attempt_opened(self, rollout_id: str) -> None:
        from opentelemetry import trace

        attributes = {**self._base, "osmosis.rollout.id": rollout_id}
        span = self._tracer.start_span(
            "osmosis.attempt", context=self._run_context, attributes=attributes
        )
        self._attempts[rollout_id] = _Attempt(span, trace.set_span_in_context(span), attributes)

    def admitted(
        self,
        rollout_id: str,
        *,
        row: int | None,
        run: int | None,
        started_ns: int,
        ended_ns: int,
        error: str | None,
    ) -> None:
        attempt = self._attempts.get(rollout_id)
        if attempt is None:
            return
        if row is not None and run is not None:
            key: dict[str, Any] = {
                "osmosis.attempt.key": f"{row}:{run}",
                "osmosis.row_index": row,
                "osmosis.run_index": run,
            }
            attempt.attributes.update(key)
            attempt.span.set_attributes(key)
        span = self._tracer.start_span(
            "osmosis.rollout.admission",
            context=attempt.context,
            attributes=attempt.attributes,
            start_time=started_ns,
        )
        _fail_if(span, error)
        span.end(end_time=ended_ns)
        if error is None:
            from opentelemetry import trace

            attempt.rollout = self._tracer.start_span(
                "osmosis.rollout",
                context=attempt.context,
                attributes=attempt.attributes,
                start_time=ended_ns,
            )
            attempt.rollout_context = trace.set_span_in_context(attempt.rollout)

    def model_call(self, call: CallRecord) -> None:
        attempt = self._attempts.get(call.rollout_id)
        if attempt is None:  # answered after its attempt ended: in no attempt's timeline
            return
        began, ended = call_bounds_ns(call)
        span = self._tracer.start_span(
            "osmosis.model.call",
            context=attempt.rollout_context or attempt.context,
            attributes={
                **attempt.attributes,
                "http.response.status_code": call.status_code,
                "gen_ai.request.model": call.model,
                "gen_ai.usage.input_tokens": call.prompt_tokens,
                "gen_ai.usage.output_tokens": call.completion_tokens,
                "osmosis.provider.attempts": call.attempts,
            },
            start_time=began,
        )
        _fail_if(span, call.error if call.status_code != 200 else None)
        span.end(end_time=ended)

    def result_in(self, rollout_id: str) -> None:
        attempt = self._attempts.get(rollout_id)
        if attempt is None:
            return
        now = time.time_ns()
        if attempt.rollout is not None:
            attempt.rollout.end(end_time=now)
            attempt.rollout = None
        attempt.grading = self._tracer.start_span(
            "osmosis.grading", context=attempt.context, attributes=attempt.attributes
        )

    def recorded(self, record: AttemptRecord) -> None:
        from osmosis.vocabulary import outcome

        attempt = self._attempts.get(record.rollout_id)
        if attempt is None:
            return
        attempt.recorded = True
        facts: dict[str, Any] = {
            "osmosis.attempt.status": record.status,
            "osmosis.attempt.outcome": outcome(record.status, record.reward, self._threshold),
        }
        if record.reward is not None:
            facts["osmosis.attempt.reward"] = record.reward
        if record.error_type:
            facts["osmosis.attempt.error_type"] = record.error_type
        if attempt.grading is not None:
            attempt.grading.set_attributes(facts)
            attempt.grading.end()
            attempt.grading = None
        attempt.span.set_attributes(facts)

    def attempt_closed(self, rollout_id: str) -> None:
        attempt = self._attempts.pop(rollout_id, None)
        if attempt is None:
            return
        for open_span in (attempt.rollout, attempt.grading):
            if open_span is not None:
                open_span.end()
        if not attempt.recorded:
            attempt.span.set_attribute("osmosis.attempt.requeued", True)
        attempt.span.end()


def _fail_if(span: Span, error: str | None) -> None:
    if error:
        from opentelemetry.trace import Status, StatusCode

        span.set_status(Status(StatusCode.ERROR, error[:500]))


__all__ = [
    "EXPORTER_ENV",
    "SpanTree",
    "TracingSetupError",
    "exporter_setting",
    "from_env",
    "memory_spans",
]
