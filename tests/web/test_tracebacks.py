"""Finding a failed attempt's traceback where the rollout server left it: its diagnostics,
its trajectory, or the run's logs.txt among other rollouts' lines."""

from __future__ import annotations

import json
from pathlib import Path

from osmosis.platform.web.tracebacks import find_traceback

A, B, C = "a" * 32, "b" * 32, "c" * 32
TRACE_B = [
    "Traceback (most recent call last):",
    '  File "/ws/rollouts/x/main.py", line 9, in run',
    "    raise ValueError(text)",
    "ValueError: the first line",
    "and the second line of the message",
]


def write_log(run_dir: Path, lines: list[str]) -> None:
    # As the engine writes the rollout server's output: a timestamp, then `[rollout] `.
    stamp = "2026-12-01T10:00:00.000+00:00"
    (run_dir / "logs.txt").write_text("".join(f"{stamp} {line}\n" for line in lines))


def rollout(line: str) -> str:
    return f"[rollout] {line}"


def record(level: str, message: str) -> str:
    return rollout(f"2026-12-01 10:00:00,123 {level} osmosis.rollout: {message}")


def test_the_log_gives_each_rollouts_own_traceback_and_nothing_after_it(tmp_path: Path):
    write_log(
        tmp_path,
        [
            "dispatching 3 work items with concurrency 3",
            record("WARNING", f"workflow of rollout {A} failed: workflow exceeded its 5s deadline"),
            record("ERROR", f"grader of rollout {B} failed: the first line"),
            rollout("and the second line of the message"),
            *(rollout(line) for line in TRACE_B),
            record("ERROR", f"rollout {C} crashed"),
            rollout("Traceback (most recent call last):"),
            rollout('  File "/ws/rollouts/x/main.py", line 3, in <module>'),
            rollout("RuntimeError: crashed"),
            "run incomplete: the engine halted",
        ],
    )
    found = find_traceback(tmp_path, B, None)
    assert found is not None and found.source == "logs.txt"
    assert found.text == "\n".join(TRACE_B)  # the message's own lines before it are skipped
    crashed = find_traceback(tmp_path, C, None)
    assert crashed is not None and crashed.text.splitlines()[-1] == "RuntimeError: crashed"
    assert find_traceback(tmp_path, A, None) is None  # a deadline has no traceback


def test_diagnostics_then_the_trajectory_come_before_the_log(tmp_path: Path):
    failure = record("ERROR", f"workflow of rollout {A} failed: x")
    write_log(tmp_path, [failure, *(rollout(line) for line in TRACE_B)])
    assert find_traceback(tmp_path, A, None).source == "logs.txt"  # type: ignore[union-attr]
    trial = tmp_path / "rollout_trials" / A
    trial.mkdir(parents=True)
    from_trajectory = find_traceback(tmp_path, A, {"err_traceback": "Traceback: from extra"})
    assert from_trajectory is not None and from_trajectory.source == "trajectory"
    (trial / "diagnostics.json").write_text(json.dumps({"traceback": ["Traceback\n", "  f\n"]}))
    found = find_traceback(tmp_path, A, {"err_traceback": "Traceback: from extra"})
    assert found is not None and found.source == "diagnostics.json"
    assert found.text == "Traceback\n  f\n"  # format_exception's lines, joined


def test_nothing_is_looked_up_for_a_rollout_id_that_is_not_one(tmp_path: Path):
    (tmp_path / "logs.txt").write_text("")  # empty: nothing to map, nothing to find
    assert find_traceback(tmp_path, "../../etc", None) is None
    assert find_traceback(tmp_path, A, None) is None


def test_a_linked_diagnostics_file_is_not_read(tmp_path: Path):
    # A rollout writes rollout_trials/ itself: a link there must not reach the host's files.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "diagnostics.json").write_text(json.dumps({"traceback": "the host's secret"}))
    (tmp_path / "rollout_trials").mkdir()
    (tmp_path / "rollout_trials" / A).symlink_to(elsewhere)
    assert find_traceback(tmp_path, A, None) is None
    trial = tmp_path / "rollout_trials" / A
    trial.unlink()
    trial.mkdir()
    (trial / "diagnostics.json").symlink_to(elsewhere / "diagnostics.json")
    assert find_traceback(tmp_path, A, None) is None


def test_a_traceback_kept_only_in_the_error_message_is_shown_last(tmp_path: Path):
    message = "grader failed\nTraceback (most recent call last):\n  File x\nValueError: no"
    found = find_traceback(tmp_path, "c" * 32, None, message)
    assert found is not None
    assert (found.source, found.text.splitlines()[0]) == (
        "error message",
        "Traceback (most recent call last):",
    )
    assert find_traceback(tmp_path, "c" * 32, None, "timed out after 30s") is None
