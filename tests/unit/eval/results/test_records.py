"""AttemptRecord validation, its index.jsonl and journal forms, and the index-row lint."""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from osmosis.eval.results.records import (
    RECORD_SCHEMA_VERSION,
    AttemptRecord,
    index_row,
    journal_entry,
    lint_index_row,
)

GOLDEN = Path(__file__).parent / "golden"
ROLLOUT_ID = "0123456789abcdef0123456789abcdef"
FINISHED = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)


def attempt(**overrides: Any) -> dict[str, Any]:
    """The fields of a valid successful attempt, with `overrides` applied."""
    fields: dict[str, Any] = {
        "row_index": 1,
        "run_index": 0,
        "rollout_id": ROLLOUT_ID,
        "source_row_index": 7,
        "status": "success",
        "reward": 1.0,
        "tokens": 12,
        "duration_ms": 185.8,
        "finished_at": FINISHED,
    }
    fields.update(overrides)
    return fields


def test_a_successful_attempt_is_recorded_with_defaults() -> None:
    record = AttemptRecord(**attempt())

    assert record.schema_version == RECORD_SCHEMA_VERSION == 1
    assert record.resumed is False
    assert record.trajectory_filename is None
    assert record.error_type is None


def test_a_failed_attempt_may_carry_a_reward_because_the_metrics_count_it() -> None:
    record = AttemptRecord(**attempt(status="failed", reward=0.5, error_type="timeout"))

    assert record.reward == 0.5


def test_an_integer_reward_is_stored_as_a_float() -> None:
    record = AttemptRecord(**attempt(reward=1))

    assert record.reward == 1.0
    assert isinstance(record.reward, float)


def test_records_are_frozen() -> None:
    record = AttemptRecord(**attempt())

    with pytest.raises(ValidationError):
        record.reward = 0.0  # type: ignore[misc]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"rollout_id": ROLLOUT_ID.upper()}, "32 lowercase hex"),
        ({"rollout_id": "abc123"}, "32 lowercase hex"),
        ({"rollout_id": "01234567-89ab-cdef-0123-456789abcdef"}, "32 lowercase hex"),
        ({"reward": math.nan}, "finite"),
        ({"reward": math.inf}, "finite"),
        ({"reward": True}, "valid number"),
        ({"reward": "1.0"}, "valid number"),
        ({"row_index": "1"}, "valid integer"),
        ({"row_index": True}, "valid integer"),
        ({"run_index": -1}, "greater than or equal to 0"),
        ({"tokens": -3}, "greater than or equal to 0"),
        ({"cost_usd": -0.01}, "greater than or equal to 0"),
        ({"duration_ms": math.inf}, "finite"),
        ({"status": "cancelled"}, "'success', 'failed' or 'skipped'"),
        ({"status": "skipped"}, "a skipped attempt carries no reward"),
        ({"status": "failed"}, "a failed attempt needs an error_type"),
        ({"status": "failed", "error_type": ""}, "at least 1 character"),
        ({"error_type": "timeout"}, "a success attempt carries no error_type"),
        ({"error_message": "boom"}, "a success attempt carries no error_type"),
        ({"trajectory_filename": "nested/trajectory.json"}, "trajectory_filename must match"),
        ({"trajectory_filename": "traj.json"}, "trajectory_filename must match"),
        ({"finished_at": datetime(2026, 1, 2)}, "timezone"),
        ({"schema_version": 2}, "unsupported attempt record schema_version 2"),
        ({"sample_id": "s-1"}, "Extra inputs are not permitted"),
    ],
)
def test_invalid_attempts_are_refused_with_a_reason(
    overrides: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValidationError, match=message):
        AttemptRecord(**attempt(**overrides))


def test_a_skipped_attempt_needs_no_reward_and_no_error() -> None:
    record = AttemptRecord(**attempt(status="skipped", reward=None))

    assert index_row(record)["status"] == "skipped"
    assert "reward" not in index_row(record)


def test_index_row_keeps_the_reference_key_order_and_omits_none() -> None:
    record = AttemptRecord(
        **attempt(
            status="failed",
            reward=None,
            error_type="agent_error",
            error_message="grader raised",
            trajectory_filename="trajectory.json",
            cost_usd=0.002,
            prompt_tokens=8,
            completion_tokens=4,
        )
    )

    row = index_row(record)

    # The reference notes' [ran] example, key for key.
    assert row == {
        "row_index": 1,
        "run_index": 0,
        "rollout_id": ROLLOUT_ID,
        "trajectory_filename": "trajectory.json",
        "status": "failed",
        "tokens": 12,
        "duration_ms": 185.8,
        "error_type": "agent_error",
    }
    assert list(row) == [
        "row_index",
        "run_index",
        "rollout_id",
        "trajectory_filename",
        "status",
        "tokens",
        "duration_ms",
        "error_type",
    ]


def test_index_row_marks_only_resumed_results() -> None:
    fresh = index_row(AttemptRecord(**attempt()))
    resumed = index_row(AttemptRecord(**attempt(resumed=True)))

    assert "resumed" not in fresh
    assert resumed["resumed"] is True
    assert list(resumed)[-1] == "resumed"


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {"resumed": True, "trajectory_filename": "trajectory.json"},
        {"status": "failed", "reward": None, "tokens": None, "error_type": "timeout"},
        {"status": "skipped", "reward": None},
    ],
)
def test_every_index_row_we_write_passes_the_platform_lint(overrides: dict[str, Any]) -> None:
    row = index_row(AttemptRecord(**attempt(**overrides)))

    assert lint_index_row(row) == []
    assert lint_index_row(json.loads(json.dumps(row))) == []


def test_journal_entries_round_trip_through_json() -> None:
    record = AttemptRecord(
        **attempt(status="failed", reward=None, error_type="timeout", error_message="agent ran out")
    )

    entry = journal_entry(record)
    line = json.dumps(entry)

    assert entry["schema_version"] == RECORD_SCHEMA_VERSION
    assert "reward" not in entry
    assert entry["finished_at"] == "2026-01-02T03:04:05Z"
    assert AttemptRecord.model_validate_json(line) == record
    assert AttemptRecord.model_validate(json.loads(line)) == record


def test_a_journal_line_from_a_newer_osmosis_is_refused_plainly() -> None:
    entry = journal_entry(AttemptRecord(**attempt())) | {"schema_version": 2}

    with pytest.raises(ValidationError, match="this osmosis reads version 1"):
        AttemptRecord.model_validate(entry)


CONTRACT = json.loads((GOLDEN / "index" / "contract_cases.json").read_text(encoding="utf-8"))


@pytest.mark.parametrize(
    ("row", "expected"),
    [pytest.param(case["row"], case["problems"], id=case["name"]) for case in CONTRACT["cases"]],
)
def test_lint_matches_the_platform_contract_cases(row: dict[str, Any], expected: list[str]) -> None:
    problems = lint_index_row(row)

    assert len(problems) == len(expected), problems
    for fragment in expected:
        assert any(fragment in problem for problem in problems), (fragment, problems)


@pytest.mark.parametrize(
    ("row", "expected"),
    [
        pytest.param(
            {"row_index": True, "run_index": 0, "rollout_id": ROLLOUT_ID, "status": "success"},
            ["row_index must be a number", "duration_ms must be a number"],
            id="bool-is-not-a-number",
        ),
        pytest.param(
            {"row_index": 0, "run_index": 0, "rollout_id": ROLLOUT_ID, "duration_ms": 1.0},
            ["status must be one of"],
            id="status-missing",
        ),
        pytest.param(
            {"row_index": 0, "run_index": 0, "rollout_id": 7, "status": "failed", "duration_ms": 1},
            ["32 lowercase hex"],
            id="rollout-id-not-a-string",
        ),
        pytest.param(
            {"row_index": None, "run_index": 0, "rollout_id": None, "status": "success"},
            [
                "None-valued keys must be omitted: rollout_id, row_index",
                "duration_ms must be a number",
                "rollout_id or sample_id",
            ],
            id="nulls-reported-once-each",
        ),
        pytest.param(
            {"row_index": 0, "run_index": 0, "rollout_id": ROLLOUT_ID, "status": "success",
             "duration_ms": 1.0, "trajectory_filename": "trajectory.json.bak"},
            ["trajectory_filename"],
            id="trajectory-filename-wrong-suffix",
        ),
    ],
)  # fmt: skip
def test_lint_edge_cases(row: dict[str, Any], expected: list[str]) -> None:
    problems = lint_index_row(row)

    assert len(problems) == len(expected), problems
    for fragment in expected:
        assert any(fragment in problem for problem in problems), (fragment, problems)


def test_lint_refuses_a_row_that_is_not_an_object() -> None:
    assert lint_index_row([1, 2, 3]) == ["row must be a JSON object"]  # type: ignore[arg-type]
