"""`regression_gate`: a run regressed only when the interval of its change lies wholly below
`-margin`; row flips and flaky rows are information."""

from __future__ import annotations

import math

import pytest

from osmosis.eval.results.compare import (
    RowOutcome,
    compare_outcomes,
    regression_gate,
)


def outcomes(rates: list[tuple[int, int]]) -> dict[int, RowOutcome]:
    return {
        row: RowOutcome(attempts=n, passes=p, rewards=n, reward_sum=float(p))
        for row, (p, n) in enumerate(rates)
    }


def test_flips_both_ways_within_noise_pass_the_gate() -> None:
    base = outcomes([(2, 4), (3, 4), (1, 4), (2, 4)] * 5)
    other = outcomes([(3, 4), (2, 4), (2, 4), (1, 4)] * 5)
    result = compare_outcomes(["a", "b"], [base, other])

    gate = regression_gate(result)

    assert result.regressed_rows  # listed, as information
    interval = result.differences[0].pass_rate
    assert interval is not None and interval.interval.low < 0 < interval.interval.high
    assert not gate.failed and gate.regressed == [] and gate.ungated == []
    assert gate.as_dict() == {
        "measure": "pass_rate",
        "margin": 0.0,
        "failed": False,
        "regressed_runs": [],
        "ungated_runs": [],
    }


def test_a_drop_whose_interval_lies_below_the_margin_fails() -> None:
    base = outcomes([(4, 4)] * 20)
    other = outcomes([(4, 4), (0, 4)] * 10)
    result = compare_outcomes(["a", "b", "c"], [base, other, base])

    gate = regression_gate(result)
    reward_gate = regression_gate(result, measure="mean_reward")

    assert gate.failed and [d.label for d in gate.regressed] == ["b"]
    assert reward_gate.failed and [d.label for d in reward_gate.regressed] == ["b"]
    found = result.differences[0].pass_rate
    assert found is not None
    high = found.interval.high
    assert high < 0
    # A margin wider than the interval's high end tolerates the drop; a narrower one does not.
    assert not regression_gate(result, margin=-high + 0.01).failed
    assert regression_gate(result, margin=max(0.0, -high - 0.01)).failed


@pytest.mark.parametrize("margin", [-0.1, math.nan, math.inf])
def test_a_margin_must_be_a_finite_non_negative_number(margin: float) -> None:
    result = compare_outcomes(["a", "b"], [outcomes([(1, 1)]), outcomes([(1, 1)])])
    with pytest.raises(ValueError, match="margin"):
        regression_gate(result, margin=margin)


def test_a_run_without_an_interval_is_named_ungated() -> None:
    result = compare_outcomes(["a", "b"], [outcomes([(1, 1)]), {}])

    gate = regression_gate(result)

    assert not gate.failed and gate.ungated == ["b"]


def test_flaky_rows_are_those_whose_attempts_disagree_within_a_run() -> None:
    base = outcomes([(2, 4), (4, 4), (0, 4), (1, 1)])
    other = outcomes([(4, 4), (3, 4), (0, 4), (0, 1)])
    result = compare_outcomes(["a", "b"], [base, other])

    assert result.flaky_rows == {"a": [0], "b": [1]}
    assert RowOutcome(attempts=0, passes=0).flaky is False
    payload = result.as_dict()
    assert payload["flaky_rows"] == {"a": [0], "b": [1]}
    assert payload["rows"][0]["outcomes"][0]["flaky"] is True
