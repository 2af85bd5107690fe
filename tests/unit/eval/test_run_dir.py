"""The run directory: exactly-once journal, resume lock on inputs, crash tolerance."""

import json
from datetime import UTC, datetime

import pytest

from osmosis.eval.engine import FinishedAttempt
from osmosis.eval.records import AttemptRecord
from osmosis.eval.run_dir import ResumeRefused, RunDirectory, RunLocked, Slots

INPUTS = {"model_path": "openai/m", "n": 2, "dataset": {"sha256": "abc"}}


def attempt(row, run, status="success", reward=1.0, rollout_id=None):
    return FinishedAttempt(
        record=AttemptRecord(
            row_index=row,
            run_index=run,
            rollout_id=rollout_id or f"{row:016x}{run:016x}",
            source_row_index=row + 10,
            status=status,
            reward=reward if status == "success" else None,
            error_type="agent_error" if status == "failed" else None,
            tokens=5,
            duration_ms=1.0,
            finished_at=datetime.now(UTC),
        ),
        trajectory={"schema_version": "ATIF-v1.7", "steps": []},
        trial_dir=None,
    )


def open_run(path, inputs=INPUTS, **kwargs):
    return RunDirectory.open(path, slots=Slots(rows=3, n=2), inputs=inputs, provenance={}, **kwargs)


def test_records_survive_reopening_and_come_back_in_slot_order(tmp_path):
    path = tmp_path / "evals" / "r1"
    with open_run(path) as run:
        run.record(attempt(2, 1))
        run.record(attempt(0, 0))
    with open_run(path) as run:
        assert run.recorded_count() == 2
        assert run.is_recorded(0, 0) and run.is_recorded(2, 1) and not run.is_recorded(1, 0)
        records = list(run.records())
        assert [(r.row_index, r.run_index) for r in records] == [(0, 0), (2, 1)]
        assert all(r.resumed for r in records)  # carried over from an earlier invocation
    assert (path / "trajectories" / "row_2_run_1.json").exists()


def test_a_retried_attempt_replaces_the_earlier_record(tmp_path):
    path = tmp_path / "evals" / "r1"
    with open_run(path) as run:
        run.record(attempt(1, 0, status="failed"))
        assert run.status_of(1, 0) == "failed"
        run.record(attempt(1, 0, rollout_id="f" * 32))
        assert run.status_of(1, 0) == "success"
        assert [r.rollout_id for r in run.records()] == ["f" * 32]


def test_a_line_cut_short_by_a_crash_is_dropped_and_the_attempt_stays_pending(tmp_path):
    path = tmp_path / "evals" / "r1"
    with open_run(path) as run:
        run.record(attempt(0, 0))
        run.record(attempt(0, 1))
    journal = path / "events.jsonl"
    data = journal.read_bytes()
    journal.write_bytes(data[: len(data) - 7])  # the second line loses its end
    with open_run(path) as run:
        assert run.is_recorded(0, 0) and not run.is_recorded(0, 1)
        run.record(attempt(0, 1))
    lines = journal.read_bytes().splitlines()
    assert len(lines) == 2 and all(json.loads(line) for line in lines)


def test_changed_inputs_refuse_resume_and_name_what_changed(tmp_path):
    path = tmp_path / "evals" / "r1"
    open_run(path).close()
    changed = {**INPUTS, "n": 4, "dataset": {"sha256": "def"}}
    with pytest.raises(ResumeRefused) as refused:
        open_run(path, inputs=changed)
    assert refused.value.changed == ["dataset.sha256", "n"]
    assert "--fresh" in str(refused.value)


def test_fresh_archives_the_old_run(tmp_path):
    path = tmp_path / "evals" / "r1"
    with open_run(path) as run:
        run.record(attempt(0, 0))
    with open_run(path, inputs={**INPUTS, "n": 4}, fresh=True) as run:
        assert run.recorded_count() == 0
    archives = [p.name for p in (tmp_path / "evals").iterdir() if ".archive-" in p.name]
    assert len(archives) == 1 and archives[0].startswith("r1.archive-")


def test_a_run_name_in_use_by_another_process_is_locked(tmp_path):
    path = tmp_path / "evals" / "r1"
    with open_run(path), pytest.raises(RunLocked):
        open_run(path)


def test_outputs_are_written_from_the_journal_and_summary_copies_index(tmp_path):
    path = tmp_path / "evals" / "r1"
    with open_run(path) as run:
        run.record(attempt(0, 0))
        run.record(attempt(0, 1, status="failed"))
        run.write_outputs(status="incomplete", summary={"total_samples": 2}, eval_run={"id": "x"})
    index = [json.loads(line) for line in (path / "index.jsonl").read_text().splitlines()]
    assert [row["status"] for row in index] == ["success", "failed"]
    assert "reward" not in index[1]  # None keys are omitted
    assert (path / "summary.jsonl").read_bytes() == (path / "index.jsonl").read_bytes()
    metrics = json.loads((path / "metrics.json").read_text())
    assert metrics["eval_run"]["status"] == "incomplete"


def test_redaction_applies_to_the_journal_and_trajectories(tmp_path):
    path = tmp_path / "evals" / "r1"
    with open_run(path, redact=lambda text: text.replace("sk-secret", "[REDACTED]")) as run:
        leaked = attempt(0, 0)
        leaked.trajectory["steps"] = [{"message": "my key is sk-secret"}]
        run.record(leaked)
        run.log("calling with sk-secret")
    for file in path.rglob("*"):
        if file.is_file():
            assert b"sk-secret" not in file.read_bytes(), file
