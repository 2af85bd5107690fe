"""The compare page's arithmetic: per-row kinds, and a paired interval over rows whose
estimate is the change the page states beside the two runs' rates."""

from __future__ import annotations

import pytest

from osmosis.platform.web.compare import compare_runs
from osmosis.platform.web.run_queries import RowOutcome


def rows(*tallies: tuple[int, int, int]) -> dict[int, RowOutcome]:
    return {i: RowOutcome(scored=s, passed=p, errored=e) for i, (s, p, e) in enumerate(tallies)}


def test_rows_are_classified_by_their_pass_rates_then_errors():
    a = rows((2, 2, 0), (2, 1, 0), (2, 0, 0), (2, 0, 0), (2, 1, 0))
    b = rows((2, 0, 0), (2, 0, 0), (2, 2, 0), (2, 0, 2), (2, 1, 0), (2, 2, 0))
    result = compare_runs(a, b)
    assert [r.kind for r in result.rows] == [
        "regressed",
        "regressed",
        "improved",
        "errored",
        "unchanged",
        "missing",  # row 5 only ran in B
    ]
    assert result.counts["regressed"] == 2 and result.paired_rows == 5


def test_the_change_is_paired_over_rows_with_unequal_attempts():
    # Row 0 has one attempt in each run, row 1 has four: per row B - A is 0 and +1, so the
    # paired change is +50 points, though the pooled rates (1/5 -> 5/5) differ by 80.
    a = rows((1, 1, 0), (4, 0, 0))
    b = rows((1, 1, 0), (4, 4, 0))
    result = compare_runs(a, b)
    assert result.change is not None
    assert result.change.estimate == pytest.approx(0.5)
    assert (result.paired_a, result.paired_b) == (pytest.approx(0.5), pytest.approx(1.0))
    assert result.change.estimate == pytest.approx(result.paired_b - result.paired_a)
    # Two rows, each resampled whole: the interval spans the two row deltas.
    assert (result.change.low, result.change.high) == (0.0, 1.0)


def test_identical_runs_change_by_exactly_nothing():
    same = rows((3, 1, 0), (3, 2, 1), (3, 3, 0))
    result = compare_runs(same, same)
    assert result.change is not None
    assert (result.change.low, result.change.estimate, result.change.high) == (0.0, 0.0, 0.0)
    assert result.counts["unchanged"] == 3


def test_no_row_scored_in_both_runs_gives_no_interval():
    result = compare_runs(rows((1, 1, 0)), {0: RowOutcome(scored=0, passed=0, errored=0)})
    assert result.change is None and result.paired_a is None
