"""OpenTelemetry traces of `osmosis eval run` (issue 29.3): with an exporter set, one attempt
is one span tree under its run, carrying the run's and the attempt's ids; with none set,
nothing of OpenTelemetry is even imported.

The exporter here is the SDK's console exporter writing to a file (`OSMOSIS_OTEL_EXPORTER=
file:PATH`); in production `OTEL_EXPORTER_OTLP_ENDPOINT` picks OTLP over HTTP instead."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.e2e.conftest import model_env, osmosis, read_jsonl
from tests.e2e.workspace import make_workspace, row

ROWS = [row("pass", 6, 7), row("pass", 2, 3), row("fail", 4, 5), row("pass", 3, 3)]


def _spans(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _time(span: dict, key: str) -> datetime:
    return datetime.fromisoformat(span[key].replace("Z", "+00:00"))


@pytest.mark.slow
def test_one_attempt_is_one_span_tree_with_the_runs_ids(tmp_path, fake_model):
    config = make_workspace(tmp_path, ROWS, limit=1)
    spans_file = tmp_path / "spans.jsonl"
    env = model_env(fake_model, OSMOSIS_OTEL_EXPORTER=f"file:{spans_file}")
    done = osmosis("eval", "run", str(config), "--name", "traced", "-y", cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr
    (record,) = read_jsonl(tmp_path / ".osmosis" / "evals" / "traced" / "events.jsonl")

    spans = _spans(spans_file)
    assert {span["context"]["trace_id"] for span in spans} == {spans[0]["context"]["trace_id"]}
    by_id = {span["context"]["span_id"]: span for span in spans}
    children: dict[str | None, list[dict]] = {}
    for span in spans:
        children.setdefault(span["parent_id"], []).append(span)
    (root,) = children[None]
    assert root["name"] == "osmosis.run"
    assert root["attributes"]["osmosis.run.id"] == "traced"
    assert root["attributes"]["osmosis.run.status"] == "finished"
    (attempt,) = children[root["context"]["span_id"]]
    assert attempt["name"] == "osmosis.attempt"
    assert attempt["attributes"] == {
        "osmosis.run.id": "traced",
        "osmosis.rollout.id": record["rollout_id"],
        "osmosis.attempt.key": "0:0",
        "osmosis.row_index": 0,
        "osmosis.run_index": 0,
        "osmosis.attempt.status": "success",
        "osmosis.attempt.outcome": "passed",
        "osmosis.attempt.reward": 1.0,
    }
    steps = {span["name"]: span for span in children[attempt["context"]["span_id"]]}
    assert sorted(steps) == ["osmosis.grading", "osmosis.rollout", "osmosis.rollout.admission"]
    (call,) = children[steps["osmosis.rollout"]["context"]["span_id"]]
    assert call["name"] == "osmosis.model.call"
    assert call["attributes"]["http.response.status_code"] == 200
    assert call["attributes"]["gen_ai.usage.input_tokens"] > 0
    assert call["attributes"]["osmosis.attempt.key"] == "0:0"
    for span in spans:
        assert span["attributes"]["osmosis.run.id"] == "traced", span["name"]
        parent = by_id.get(span["parent_id"] or "")
        if parent is not None:  # a child lies within its parent's time
            assert _time(parent, "start_time") <= _time(span, "start_time"), span["name"]
            assert _time(span, "end_time") <= _time(parent, "end_time"), span["name"]
    # One after the other: taken in, rolled out (with its model call), then graded.
    admission, rollout, grading = (
        steps[name] for name in ("osmosis.rollout.admission", "osmosis.rollout", "osmosis.grading")
    )
    assert _time(admission, "end_time") <= _time(rollout, "start_time")
    assert _time(rollout, "end_time") <= _time(grading, "start_time")


# The CLI run in this very process, and what it imported, read after it exits.
_UNTRACED = """
import atexit, sys
atexit.register(lambda: print("otel modules:", sorted(
    name for name in sys.modules if name.split(".")[0] == "opentelemetry"), file=sys.stderr))
sys.argv = ["osmosis", "eval", "run", sys.argv[1], "--name", "untraced", "-y"]
from osmosis.cli.main import run
run()
"""


@pytest.mark.slow
def test_without_tracing_opentelemetry_is_never_imported(tmp_path, fake_model):
    config = make_workspace(tmp_path, ROWS, limit=2)
    env = model_env(fake_model)
    for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        env.pop(name, None)
    done = subprocess.run(
        [sys.executable, "-c", _UNTRACED, str(config)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr
    assert len(read_jsonl(tmp_path / ".osmosis" / "evals" / "untraced" / "events.jsonl")) == 2
    assert "otel modules: []" in done.stderr, done.stderr[-2000:]


def test_a_bad_exporter_setting_is_refused_naming_it(tmp_path, fake_model):
    config = make_workspace(tmp_path, ROWS, limit=1)
    env = model_env(fake_model, OSMOSIS_OTEL_EXPORTER="jaeger")
    done = osmosis("eval", "run", str(config), "--name", "bad", "-y", cwd=tmp_path, env=env)
    assert done.returncode != 0
    assert "OSMOSIS_OTEL_EXPORTER must be memory, file:PATH or otlp, got 'jaeger'" in done.stderr


class _Collector(ThreadingHTTPServer):
    """An OTLP/HTTP trace receiver on loopback: keeps each export request's body."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []
        collector = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if self.path == "/v1/traces":
                    collector.bodies.append(body)
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        super().__init__(("127.0.0.1", 0), Handler)


@pytest.mark.slow
def test_an_otlp_endpoint_receives_the_runs_spans(tmp_path, fake_model):
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    config = make_workspace(tmp_path, ROWS, limit=2)
    collector = _Collector()
    thread = threading.Thread(target=collector.serve_forever, daemon=True)
    thread.start()
    try:
        endpoint = f"http://127.0.0.1:{collector.server_address[1]}"
        env = model_env(fake_model, OTEL_EXPORTER_OTLP_ENDPOINT=endpoint)
        done = osmosis("eval", "run", str(config), "--name", "otlp", "-y", cwd=tmp_path, env=env)
    finally:
        collector.shutdown()
        collector.server_close()
        thread.join()
    assert done.returncode == 0, done.stderr
    names: list[str] = []
    for body in collector.bodies:
        request = ExportTraceServiceRequest.FromString(body)
        for resource in request.resource_spans:
            service = {a.key: a.value.string_value for a in resource.resource.attributes}
            assert service["service.name"] == "osmosis"
            for scope in resource.scope_spans:
                for span in scope.spans:
                    attributes = {a.key: a.value.string_value for a in span.attributes}
                    assert attributes["osmosis.run.id"] == "otlp", span.name
                    names.append(span.name)
    assert sorted(set(names)) == [
        "osmosis.attempt",
        "osmosis.grading",
        "osmosis.model.call",
        "osmosis.rollout",
        "osmosis.rollout.admission",
        "osmosis.run",
    ]
    assert names.count("osmosis.run") == 1 and names.count("osmosis.attempt") == 2
