"""The run directory: exactly-once journal, resume lock on inputs, crash tolerance."""

import asyncio
import json
from dataclasses import replace
from datetime import UTC, datetime

import pytest

from osmosis.eval.host.run_dir import ResumeRefused, RunDirectory, RunLocked, Slots
from osmosis.eval.results.records import AttemptRecord, FinishedAttempt
from osmosis.eval.results.redact import Redactor

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
    with open_run(path, redactor=Redactor(["sk-secret"])) as run:
        leaked = attempt(0, 0)
        leaked.trajectory["steps"] = [{"message": "my key is sk-secret"}]
        run.record(leaked)
        failed = attempt(0, 1, status="failed")
        failed = replace(
            failed,
            record=failed.record.model_copy(update={"error_message": "401 for key sk-secret"}),
        )
        run.record(failed)
        run.log("calling with sk-secret")
    for file in path.rglob("*"):
        if file.is_file():
            assert b"sk-secret" not in file.read_bytes(), file
    with open_run(path) as run:
        assert [r.error_message for r in run.records()] == [None, "401 for key [REDACTED]"]


@pytest.mark.parametrize("secret", ['pa"ss\\word-0123', "caf\u00e9-s3cret-0123"])
def test_a_secret_in_its_escaped_spelling_never_reaches_a_trajectory(tmp_path, secret):
    """An agent that logs a JSON dump of its environment puts the secret's escaped spelling in
    its trajectory (`pa\\"ss`); the document's JSON escapes it once more. The one-scan check
    before writing once took that document for clean and wrote the secret out."""
    path = tmp_path / "evals" / "r1"
    dumped = json.dumps({"PW": secret})  # the escaped spelling, as the agent logged it
    with open_run(path, redactor=Redactor([secret])) as run:
        leaked = attempt(0, 0)
        leaked.trajectory["steps"] = [{"message": f"env: {dumped}"}]
        run.record(leaked)
    [written] = (path / "trajectories").iterdir()
    steps = json.loads(written.read_text())["steps"]
    assert steps == [{"message": 'env: {"PW": "[REDACTED]"}'}]


def test_one_pass_over_the_journal_writes_the_same_index_and_none_when_it_fails(tmp_path):
    """`indexing`: index.jsonl written from the records a caller reads anyway (eval run's
    metrics pass), byte for byte what a second read would write; a pass that raises leaves
    the index as it was (never a partial one)."""
    path = tmp_path / "evals" / "r1"
    with open_run(path) as run:
        run.record(attempt(1, 0))
        run.record(attempt(0, 1, status="failed"))
        run.record(attempt(0, 0))
        run.write_outputs(status="finished", summary={}, eval_run={})
        reread = (path / "index.jsonl").read_bytes()
        (path / "index.jsonl").unlink()
        with run.indexing() as index:
            for record in run.records():
                index(record)
        run.write_outputs(status="finished", summary={}, eval_run={}, indexed=True)
        assert (path / "index.jsonl").read_bytes() == reread
        assert (path / "summary.jsonl").read_bytes() == reread
        with pytest.raises(ValueError, match="metrics failed"), run.indexing() as index:
            index(next(run.records()))
            raise ValueError("metrics failed")
        assert (path / "index.jsonl").read_bytes() == reread


def test_a_one_letter_secret_leaves_the_journal_and_trajectories_intact(tmp_path):
    # OPENAI_API_KEY=x once turned every "x" of the journal into [REDACTED]: `row_inde...`,
    # no record readable, a resume that would have run everything again. A key "1" (local
    # servers ignore it) must not turn `"run_index": 1` into `"run_index": [REDACTED]` either.
    path = tmp_path / "evals" / "r1"
    with open_run(path, redactor=Redactor(["x", "1"])) as run:
        for row in range(3):
            run.record(attempt(row, 0))
        failed = attempt(0, 1, status="failed")
        failed.trajectory["extra"] = {"index": 1, "note": "the key x was refused", "n": "1"}
        failed = replace(
            failed, record=failed.record.model_copy(update={"error_message": "key x refused"})
        )
        run.record(failed)
    with open_run(path) as run:  # a resume reads every line back
        assert run.recorded_count() == 4
        assert [r.error_message for r in run.records() if r.status == "failed"] == [
            "key [REDACTED] refused"
        ]
    trajectory = json.loads((path / "trajectories" / "row_0_run_1.json").read_text())
    assert trajectory["extra"] == {
        "index": 1,
        "note": "the key [REDACTED] was refused",
        "n": "[REDACTED]",
    }
    assert trajectory["schema_version"] == "ATIF-v1.7"


def test_a_trial_trajectory_that_links_elsewhere_is_not_read_through(tmp_path):
    secret_file = tmp_path / "credentials.json"
    secret_file.write_text('{"token": "platform-admin-token"}')
    trial = tmp_path / "trial"
    trial.mkdir()
    (trial / "trajectory.json").symlink_to(secret_file)
    path = tmp_path / "evals" / "r1"
    with open_run(path, redactor=Redactor(["unrelated-value"])) as run:
        run.record(replace(attempt(0, 0), trial_dir=trial))
    assert (trial / "trajectory.json").is_symlink()  # left alone, never copied over
    for file in path.rglob("*"):
        if file.is_file():
            assert b"platform-admin-token" not in file.read_bytes(), file


def test_a_trajectory_is_written_in_place_and_a_link_at_its_name_is_replaced(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("untouched")
    path = tmp_path / "evals" / "r1"
    with open_run(path) as run:
        run.record(attempt(0, 0))
        (path / "trajectories" / "row_1_run_0.json").symlink_to(victim)
        run.record(attempt(1, 0))
        run.record(replace(attempt(0, 0), trajectory={"schema_version": "ATIF-v1.7", "x": 1}))
    assert victim.read_text() == "untouched"
    replaced = path / "trajectories" / "row_1_run_0.json"
    assert not replaced.is_symlink() and json.loads(replaced.read_text())["steps"] == []
    # A retried attempt's file is rewritten whole (truncated, not overlaid), and no
    # temporary file is left beside it.
    assert json.loads((path / "trajectories" / "row_0_run_0.json").read_text())["x"] == 1
    assert sorted(p.name for p in (path / "trajectories").iterdir()) == [
        "row_0_run_0.json",
        "row_1_run_0.json",
    ]


async def test_concurrent_stores_are_each_recorded_once_and_readable_when_they_return(tmp_path):
    path = tmp_path / "evals" / "r1"
    slots = Slots(rows=50, n=2)
    with RunDirectory.open(path, slots=slots, inputs=INPUTS, provenance={}) as run:

        async def store(row: int, run_index: int) -> bool:
            await run.store(attempt(row, run_index))
            return run.is_recorded(row, run_index)  # durable, and counted, once it returns

        seen = await asyncio.gather(*(store(row, k) for row in range(50) for k in range(2)))
        assert all(seen)
    lines = [json.loads(line) for line in (path / "events.jsonl").read_text().splitlines()]
    assert sorted((e["row_index"], e["run_index"]) for e in lines) == [
        (row, k) for row in range(50) for k in range(2)
    ]
    assert len(list((path / "trajectories").iterdir())) == 100
    with RunDirectory.open(path, slots=slots, inputs=INPUTS, provenance={}) as run:
        assert run.recorded_count() == 100


def test_an_attempt_without_artifacts_gets_no_empty_artifacts_folder(tmp_path):
    trial = tmp_path / "trial"
    (trial / "artifacts").mkdir(parents=True)
    with_files = tmp_path / "trial-2"
    (with_files / "artifacts").mkdir(parents=True)
    (with_files / "artifacts" / "out.txt").write_text("42")
    path = tmp_path / "evals" / "r1"
    with open_run(path) as run:
        run.record(replace(attempt(0, 0), trial_dir=trial))
        run.record(replace(attempt(0, 1), trial_dir=with_files))
    assert not (path / "artifacts" / "row_0_run_0").exists()
    assert (path / "artifacts" / "row_0_run_1" / "out.txt").read_text() == "42"


@pytest.mark.parametrize("secret", ["sk-live-0123456789", "x"])
def test_the_rollouts_own_trial_files_are_redacted_in_place(tmp_path, secret):
    trial = tmp_path / "trial"
    trial.mkdir()
    leaked = {"steps": [{"message": f"the key is {secret} ok"}], "extra": {"n": 1}}
    clean = {"steps": [{"message": "nothing to hide"}]}
    (trial / "trajectory.json").write_text(json.dumps(leaked))
    (trial / "diagnostics.json").write_text(json.dumps(clean))
    clean_bytes = (trial / "diagnostics.json").read_bytes()
    with open_run(tmp_path / "evals" / "r1", redactor=Redactor([secret])) as run:
        run.record(replace(attempt(0, 0), trial_dir=trial))
    scrubbed = json.loads((trial / "trajectory.json").read_text())
    assert scrubbed == {"steps": [{"message": "the key is [REDACTED] ok"}], "extra": {"n": 1}}
    assert (trial / "diagnostics.json").read_bytes() == clean_bytes  # untouched: no secret


def test_redacting_a_trial_file_never_writes_through_a_link_the_rollout_planted(tmp_path):
    # The rollout owns its trial directory: a link at the temporary name the worker would use
    # must not make the worker overwrite the link's target (the platform's key, say).
    victim = tmp_path / "secret.key"
    victim.write_bytes(b"the platform's key")
    trial = tmp_path / "trial"
    trial.mkdir()
    (trial / "trajectory.json").write_text(
        json.dumps({"steps": [{"message": "sk-live-0123456789"}]})
    )
    for name in (".trajectory.json.tmp", "trajectory.json.tmp", ".trajectory.json.partial"):
        (trial / name).symlink_to(victim)
    with open_run(tmp_path / "evals" / "r1", redactor=Redactor(["sk-live-0123456789"])) as run:
        run.record(replace(attempt(0, 0), trial_dir=trial))
    assert victim.read_bytes() == b"the platform's key"
    scrubbed = json.loads((trial / "trajectory.json").read_text())
    assert scrubbed == {"steps": [{"message": "[REDACTED]"}]}


def _with_trajectory(finished, steps):
    record = finished.record.model_copy(update={"trajectory_filename": "trajectory.json"})
    return replace(finished, record=record, trajectory={"schema_version": "ATIF-v1.7",
                                                        "steps": steps})  # fmt: skip


def test_rollout_trials_link_each_trajectory_and_a_retry_keeps_the_earlier_ones_bytes(tmp_path):
    path = tmp_path / "evals" / "r1"
    first, again = "a" * 32, "b" * 32
    with open_run(path) as run:
        run.record(_with_trajectory(attempt(1, 0, status="failed", rollout_id=first),
                                    [{"step_id": 1, "message": "first"}]))  # fmt: skip
        kept = path / "trajectories" / "row_1_run_0.json"
        mirrored = path / "rollout_trials" / first / "trajectory.json"
        # A link to the run's own copy, not a second document (issue 30).
        assert mirrored.stat().st_ino == kept.stat().st_ino
        run.record(_with_trajectory(attempt(1, 0, rollout_id=again),
                                    [{"step_id": 1, "message": "again"}]))  # fmt: skip
    assert json.loads(kept.read_text())["steps"][0]["message"] == "again"
    assert json.loads(mirrored.read_text())["steps"][0]["message"] == "first"
    retried = path / "rollout_trials" / again / "trajectory.json"
    assert retried.stat().st_ino == kept.stat().st_ino


async def test_rollout_trials_of_stored_attempts_are_all_there_and_a_retry_keeps_earlier_bytes(
    tmp_path,
):
    # Through `store` (the writer thread hands each entry to the mirror thread): none is
    # lost, and a retry of a slot whose earlier entry the mirror thread has not made yet does
    # not hand the earlier entry the retry's bytes (it did, 2 runs in 3, before issue 30).
    path = tmp_path / "evals" / "r1"

    def said(row, message, **kwargs):
        steps = [{"step_id": 1, "message": message}]
        return _with_trajectory(attempt(row, 0, **kwargs), steps)

    with RunDirectory.open(path, slots=Slots(rows=40, n=1), inputs=INPUTS, provenance={}) as run:
        rows = range(1, 40)
        await asyncio.gather(
            *(run.store(said(row, f"row {row}", rollout_id=f"{row:032x}")) for row in rows)
        )
        await run.store(said(0, "first", status="failed", rollout_id="a" * 32))
        await run.store(said(0, "again", rollout_id="b" * 32))
    for row in rows:
        mirrored = path / "rollout_trials" / f"{row:032x}" / "trajectory.json"
        kept = path / "trajectories" / f"row_{row}_run_0.json"
        assert mirrored.stat().st_ino == kept.stat().st_ino
        assert json.loads(mirrored.read_text())["steps"][0]["message"] == f"row {row}"
    for rollout_id, message in (("a" * 32, "first"), ("b" * 32, "again")):
        mirrored = path / "rollout_trials" / rollout_id / "trajectory.json"
        assert json.loads(mirrored.read_text())["steps"][0]["message"] == message


def test_a_run_directory_without_official_trials_writes_no_rollout_trials(tmp_path):
    path = tmp_path / "evals" / "r1"
    with open_run(path, official_trials=False) as run:
        run.record(_with_trajectory(attempt(0, 0), [{"step_id": 1, "message": "hi"}]))
    assert (path / "trajectories" / "row_0_run_0.json").is_file()
    assert not (path / "rollout_trials").exists()
