"""A local run directory as `eval view` reads it while `eval run` writes it: running while the
run's lock is held, live numbers from the journal, then metrics.json's once it is written."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from uuid import uuid4

import pytest

from osmosis.eval.host.run_dir import RunDirectory, Slots
from osmosis.eval.results.metrics import summarize
from osmosis.eval.results.records import AttemptRecord, FinishedAttempt
from osmosis.platform.web.source import RunFilters, RunNotFound
from osmosis.platform.web.source_local import LocalSource, _probe, is_locked

INPUTS = {
    "model_path": "openai/m",
    "dataset": {"sha256": "f" * 64, "selected_source_rows": "digest"},
    "n": 1,
    "pass_threshold": 1.0,
    "rollout": {"name": "scripted", "entrypoint": "main.py"},
}


def attempt(row: int, status: str = "success") -> FinishedAttempt:
    record = AttemptRecord(
        row_index=row,
        run_index=0,
        rollout_id=uuid4().hex,
        source_row_index=row,
        status=status,  # type: ignore[arg-type]
        reward=1.0 if status == "success" else None,
        error_type="agent_error" if status == "failed" else None,
        duration_ms=10.0,
        finished_at=datetime.now(UTC),
    )
    return FinishedAttempt(record=record, trajectory=None, trial_dir=None)


def open_run(root: Path, name: str) -> RunDirectory:
    run = RunDirectory.open(
        root / name,
        slots=Slots(rows=3, n=1),
        inputs=INPUTS,
        provenance={"config_path": "configs/eval/x.toml", "dataset_path": "/gone/x.jsonl"},
    )
    run.write_progress({"total_runs": 3, "sampled_rows": 3, "total_dataset_rows": 3})
    return run


def finish(run: RunDirectory, status: str) -> None:
    run.write_outputs(
        status=status,
        summary=summarize(run.records(), 1.0),
        eval_run={"name": run.name, "dataset_name": "x", "duration_ms": 5.0},
    )


def test_a_run_being_written_is_running_with_live_numbers_then_finished(tmp_path: Path):
    source = LocalSource(tmp_path)
    run = open_run(tmp_path, "try1")
    try:
        run.record(attempt(0))
        view = source.find("try1")
        assert view.status == "running" and view.live
        assert (view.tally.completed, view.tally.total, view.tally.passed) == (1, 3, 1)
        run.record(attempt(1, "failed"))
        assert source.find("try1").tally.failed == 1  # the journal, read again
        assert source.results(view)["total_samples"] == 2
    finally:
        run.close()
    assert source.find("try1").status == "incomplete"  # stopped before its outputs
    run = open_run(tmp_path, "try1")  # a resume
    try:
        run.record(attempt(2))
        finish(run, "finished")
    finally:
        run.close()
    view = source.find("try1")
    assert (view.status, view.tally.completed, view.dataset) == ("finished", 3, "x")
    assert view.detail is not None and view.detail.config_path == "configs/eval/x.toml"


def test_attempts_recorded_after_metrics_json_are_counted(tmp_path: Path):
    run = open_run(tmp_path, "try2")
    try:
        run.record(attempt(0, "failed"))
        finish(run, "incomplete")
        run.record(attempt(1))  # then the process was killed before its outputs
    finally:
        run.close()
    view = LocalSource(tmp_path).find("try2")
    assert (view.status, view.tally.completed) == ("incomplete", 2)
    assert not view.tally.all_failed


def test_the_lock_is_seen_without_being_taken(tmp_path: Path):
    run = open_run(tmp_path, "held")
    lock = tmp_path / ".locks" / "held.lock"
    try:
        assert is_locked(lock) and _probe(lock)  # /proc/locks, and the fallback probe
    finally:
        run.close()
    assert not is_locked(lock) and not _probe(lock)
    open_run(tmp_path, "held").close()  # nothing of ours kept it: `eval run` opens it again


def test_only_run_directories_under_the_root_are_runs(tmp_path: Path):
    open_run(tmp_path, "real").close()
    (tmp_path / "notes").mkdir()
    (tmp_path / ".hidden").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    source = LocalSource(tmp_path)
    assert [v.ref for v in source.list_runs(RunFilters(), limit=10, offset=0).rows] == ["real"]
    for ref in ("notes", "link", ".locks", "../real", "real/../real", ""):
        with pytest.raises(RunNotFound):
            source.find(ref)
    one = LocalSource(tmp_path / "real")  # a run directory itself is a root of one run
    assert one.single and [v.ref for v in one.list_runs(RunFilters(), limit=5, offset=0).rows] == [
        "real"
    ]
