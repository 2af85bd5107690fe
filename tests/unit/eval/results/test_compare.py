"""Compare core: row alignment, per-row kinds, paired intervals and their method choice."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from osmosis.eval.results import compare
from osmosis.eval.results.compare import (
    ROW_KINDS,
    RowOutcome,
    RunIdentity,
    check_alignment,
    classify,
    compare_outcomes,
    row_outcomes,
    source_rows,
)
from osmosis.eval.results.intervals import mover_difference, proportion_ci
from osmosis.eval.results.records import AttemptRecord


def index(grid: list[list[Any]]) -> list[dict[str, Any]]:
    """One list per row, one entry per attempt: a reward, "fail" or "skip"."""
    rows = []
    for row_index, attempts in enumerate(grid):
        for run_index, outcome in enumerate(attempts):
            item: dict[str, Any] = {"row_index": row_index, "run_index": run_index}
            if outcome == "fail":
                item |= {"status": "failed", "error_type": "agent_error"}
            elif outcome == "skip":
                item |= {"status": "skipped"}
            else:
                item |= {"status": "success", "reward": outcome}
            rows.append(item)
    return rows


def test_row_outcomes_count_as_the_metrics_do() -> None:
    outcomes = row_outcomes(index([[1.0, "fail", "skip"], [0.5, 0.25], ["skip"]]))

    assert outcomes == {
        0: RowOutcome(attempts=2, passes=1, failed=1, rewards=1, reward_sum=1.0),
        1: RowOutcome(attempts=2, passes=0, failed=0, rewards=2, reward_sum=0.75),
    }
    assert outcomes[0].rate == 0.5 and outcomes[1].mean_reward == 0.375
    assert row_outcomes(index([[0.5]]), pass_threshold=0.5)[0].passes == 1


def test_records_and_index_rows_give_the_same_outcomes() -> None:
    rows = index([[1.0, "fail"], [0.0, 1.0]])
    finished = datetime(2026, 1, 1, tzinfo=UTC)
    records = [
        AttemptRecord(
            rollout_id=f"{i:032x}",
            source_row_index=row["row_index"],
            duration_ms=1.0,
            finished_at=finished,
            **row,
        )
        for i, row in enumerate(rows)
    ]

    assert row_outcomes(records) == row_outcomes(rows)


@pytest.mark.parametrize(
    ("base", "other", "kind"),
    [
        (RowOutcome(1, 1), RowOutcome(1, 0), "regressed"),
        (RowOutcome(4, 2), RowOutcome(4, 3), "improved"),
        (RowOutcome(4, 2), RowOutcome(2, 1), "same"),
        (RowOutcome(1, 1), None, "missing"),
        (None, RowOutcome(1, 1), "missing"),
        (RowOutcome(0, 0), RowOutcome(1, 1), "missing"),  # every attempt skipped
        # Partial credit below the threshold moves no row (the mean-reward difference says it).
        (RowOutcome(1, 0, rewards=1, reward_sum=0.2), RowOutcome(1, 0, 0, 1, 0.9), "same"),
    ],
)
def test_classify(base: RowOutcome | None, other: RowOutcome | None, kind: str) -> None:
    assert classify(base, other) == kind
    assert kind in ROW_KINDS


def test_a_known_regressed_row_is_named_and_counted() -> None:
    base = row_outcomes(index([[1.0], [1.0], [0.0], [1.0]]))
    new = row_outcomes(index([[1.0], [0.0], [1.0], [1.0]]))

    result = compare_outcomes(["base", "new"], [base, new])

    assert result.regressed_rows == [1]
    assert [row.kinds for row in result.rows] == [
        ("same",),
        ("regressed",),
        ("improved",),
        ("same",),
    ]
    difference = result.differences[0]
    assert difference.counts == {"regressed": 1, "improved": 1, "same": 2, "missing": 0}
    assert difference.paired_rows == 4
    assert difference.pass_rate is not None
    assert (difference.pass_rate.baseline, difference.pass_rate.other) == (0.75, 0.75)
    interval = difference.pass_rate.interval
    assert interval.estimate == 0.0
    # Few rows: no bootstrap, and no claim that the change is exactly zero.
    assert interval.method == "newcombe_paired"
    assert interval.low < -0.2 and interval.high > 0.2


def test_the_small_sample_interval_is_newcombes_method_ten() -> None:
    base_rows = [1.0] * 8 + [0.0] * 2
    other_rows = [1.0] * 5 + [0.0] * 5  # rows 5-7 regressed
    base = row_outcomes(index([[r] for r in base_rows]))
    other = row_outcomes(index([[r] for r in other_rows]))

    interval = compare_outcomes(["a", "b"], [base, other]).differences[0].pass_rate

    expected = mover_difference(
        proportion_ci([(r, 1.0) for r in base_rows]),
        proportion_ci([(r, 1.0) for r in other_rows]),
        correlation=0.5,
    )
    assert interval is not None and interval.interval == expected
    # The hand-computed golden value (golden/intervals/cases.json).
    assert interval.interval.low == pytest.approx(-0.528413, abs=1e-6)
    assert interval.interval.high == pytest.approx(-0.010571, abs=1e-6)


def test_many_changed_rows_use_the_seeded_paired_bootstrap() -> None:
    base = row_outcomes(index([[1.0, 1.0]] * 30 + [[0.0, 1.0]] * 10))
    other = row_outcomes(index([[0.0, 0.0]] * 12 + [[1.0, 1.0]] * 18 + [[0.0, 1.0]] * 10))

    first = compare_outcomes(["a", "b"], [base, other], seed=4)
    again = compare_outcomes(["a", "b"], [base, other], seed=4)

    pass_rate = first.differences[0].pass_rate
    assert pass_rate is not None
    assert pass_rate.interval.method == "bootstrap_paired"
    assert pass_rate.interval.seed == 4
    assert pass_rate.interval.estimate == pytest.approx(-0.3)
    assert pass_rate.interval.low < -0.3 < pass_rate.interval.high < 0
    assert again == first
    assert len(first.regressed_rows) == 12


def test_many_rows_with_few_changes_stay_with_the_small_sample_interval() -> None:
    base = row_outcomes(index([[1.0]] * 40))
    other = row_outcomes(index([[1.0]] * 38 + [[0.0]] * 2))

    pass_rate = compare_outcomes(["a", "b"], [base, other]).differences[0].pass_rate

    assert pass_rate is not None and pass_rate.interval.method == "newcombe_paired"
    assert pass_rate.interval.low < -0.05  # 2 of 40 could well be more
    identical = compare_outcomes(["a", "b"], [base, base]).differences[0].pass_rate
    assert identical is not None
    assert identical.interval.low < 0 < identical.interval.high  # never "exactly 0"


def test_unbounded_rewards_use_t_on_the_row_differences() -> None:
    base = row_outcomes(index([[3.0], [5.0], [4.0]]), pass_threshold=4.0)
    other = row_outcomes(index([[4.0], [7.0], [4.5]]), pass_threshold=4.0)

    mean = compare_outcomes(["a", "b"], [base, other]).differences[0].mean_reward

    assert mean is not None and mean.interval.method == "t_paired"
    # deltas 1, 2, 0.5: mean 7/6, sd 0.7638, t(2) 4.302653.
    assert mean.interval.estimate == pytest.approx(7 / 6)
    half = 4.302653 * 0.763763 / 3**0.5
    assert mean.interval.low == pytest.approx(7 / 6 - half, abs=1e-5)
    assert (mean.baseline, mean.other) == (pytest.approx(4.0), pytest.approx(31 / 6))


def test_three_runs_give_a_row_by_run_matrix_against_the_first() -> None:
    runs = [
        row_outcomes(index([[1.0], [0.0], [1.0]])),
        row_outcomes(index([[0.0], [0.0], [1.0]])),
        row_outcomes(index([[1.0], [1.0]])),
    ]

    result = compare_outcomes(["a", "b", "c"], runs)

    assert [row.kinds for row in result.rows] == [
        ("regressed", "same"),
        ("same", "improved"),
        ("same", "missing"),
    ]
    assert [d.label for d in result.differences] == ["b", "c"]
    assert result.differences[1].paired_rows == 2
    assert result.regressed_rows == [0]
    payload = result.as_dict()
    assert payload["runs"] == ["a", "b", "c"]
    assert payload["rows"][2]["outcomes"][2] is None


def test_alignment_names_every_mismatch() -> None:
    outcomes = [row_outcomes(index([[1.0]] * 3)), row_outcomes(index([[1.0]] * 5))]
    identities = [
        RunIdentity("a", dataset_sha256="a" * 64, rows_digest="3:x", pass_threshold=1.0),
        RunIdentity("b", dataset_sha256="b" * 64, rows_digest="5:y", pass_threshold=0.5),
    ]

    problems = check_alignment(identities, outcomes)

    assert len(problems) == 4
    assert problems[0].startswith("dataset differs: a has sha256 aaaaaaaaaaaa")
    assert "selected rows differ" in problems[1]
    assert problems[2] == "pass threshold differs: a 1, b 0.5"
    assert problems[3] == "rows differ: 2 only in b (3, 4)"


def test_unknown_identities_are_not_mismatches() -> None:
    outcomes = [row_outcomes(index([[1.0]])), row_outcomes(index([[0.0]]))]

    assert check_alignment([RunIdentity("a", "s" * 64), RunIdentity("b")], outcomes) == []


def test_rows_that_are_other_dataset_rows_are_not_paired() -> None:
    # Two platform runs without `limit` each sample 10 % of the rows at random: both have
    # rows 0..2, but row 0 is source row 13 in one and 5 in the other.
    a = [
        {**item, "source_row_index": s}
        for item, s in zip(index([[1.0]] * 3), (13, 20, 21), strict=True)
    ]
    b = [
        {**item, "source_row_index": s}
        for item, s in zip(index([[1.0]] * 3), (5, 15, 21), strict=True)
    ]
    outcomes = [row_outcomes(a), row_outcomes(b)]
    identities = [RunIdentity("a", "s" * 64), RunIdentity("b", "s" * 64)]

    problems = check_alignment(identities, outcomes, source_rows=[source_rows(a), source_rows(b)])
    same = check_alignment(identities, outcomes, source_rows=[source_rows(a), source_rows(a)])
    unknown = check_alignment(identities, outcomes, source_rows=[source_rows(a), None])

    assert problems == [
        "rows are other dataset rows: 2 of 3 rows paired by index ran different source rows "
        "(row 0: 13 in a, 5 in b; row 1: 20 in a, 15 in b)"
    ]
    assert source_rows(a) == {0: 13, 1: 20, 2: 21}
    assert same == [] and unknown == []


def test_compare_needs_two_runs() -> None:
    with pytest.raises(ValueError, match="two or more runs"):
        compare_outcomes(["a"], [{}])


def test_the_public_names_are_pinned() -> None:
    assert compare.__all__ == [
        "MIN_CHANGED_ROWS",
        "ROW_KINDS",
        "Comparison",
        "Difference",
        "GateResult",
        "RowComparison",
        "RowOutcome",
        "RunDifference",
        "RunIdentity",
        "check_alignment",
        "classify",
        "compare_outcomes",
        "regression_gate",
        "row_outcomes",
        "source_rows",
    ]
