"""The live progress line counts passes against the run's own threshold."""

from datetime import UTC, datetime

from rich.console import Console

from osmosis.cli.eval.progress import EvalProgress
from osmosis.cli.output import Mode, Output
from osmosis.eval.results.records import AttemptRecord


def record(index: int, status: str, reward: float | None) -> AttemptRecord:
    return AttemptRecord(
        row_index=index,
        run_index=0,
        rollout_id=f"{index:032x}",
        source_row_index=index,
        status=status,
        reward=reward,
        error_type="timeout" if status == "failed" else None,
        tokens=10,
        duration_ms=1.0,
        finished_at=datetime.now(UTC),
    )


def test_passes_follow_the_pass_threshold_and_skips_leave_the_denominator():
    progress = EvalProgress(Output(mode=Mode.PLAIN, _console=Console(record=True)))
    progress.start_progress(5, 0, pass_threshold=0.5)
    for attempt in (
        record(0, "success", 0.5),  # passes at 0.5, would not at the default 1.0
        record(1, "success", 0.4),
        record(2, "failed", None),
        record(3, "skipped", None),
    ):
        progress.advance(attempt)
    assert (progress.passed, progress.scored, progress.failed) == (1, 3, 1)
    assert progress.outcomes == {"passed": 1, "not_passed": 1, "errored": 1, "skipped": 1}
    assert progress.summary().startswith(
        "pass 33% · 1 passed · 1 not passed · 1 errored · 1 skipped · tokens 40"
    )


def test_the_line_names_wrong_answers_apart_from_errors():
    progress = EvalProgress(Output(mode=Mode.PLAIN, _console=Console(record=True)))
    progress.start_progress(2, 0, pass_threshold=1.0)
    progress.advance(record(0, "success", 0.0))
    progress.advance(record(1, "success", 1.0))
    assert progress.summary().startswith(
        "pass 50% · 1 passed · 1 not passed · 0 errored · 0 skipped · tokens 20"
    )
