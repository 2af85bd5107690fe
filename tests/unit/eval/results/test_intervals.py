"""Intervals: golden values (published and by hand), honesty at 0 and 1, clustering by row,
and the seeded bootstrap where it is used."""

from __future__ import annotations

import json
import math
import random
import statistics
from pathlib import Path
from typing import Any

import pytest

from osmosis.eval.results import intervals
from osmosis.eval.results.intervals import (
    BOOTSTRAP_MIN_ROWS,
    bootstrap_ci,
    correlation,
    mean_ci,
    mover_difference,
    paired_bootstrap_ci,
    proportion_ci,
    student_t_quantile,
    t_ci,
    wilson_bounds,
)

CASES: dict[str, Any] = json.loads(
    (Path(__file__).parent / "golden" / "intervals" / "cases.json").read_text(encoding="utf-8")
)


def rows_of(pairs: list[list[float]]) -> list[tuple[float, float]]:
    return [(float(x), float(y)) for x, y in pairs]


# --------------------------------------------------------------------------- golden values


@pytest.mark.parametrize(
    "case", CASES["wilson_published"]["cases"], ids=lambda c: f"{c['successes']}/{c['trials']}"
)
def test_wilson_matches_newcombes_published_values(case: dict[str, Any]) -> None:
    low, high = wilson_bounds(case["successes"] / case["trials"], case["trials"])

    assert (low, high) == (
        pytest.approx(case["low"], abs=5e-5),
        pytest.approx(case["high"], abs=5e-5),
    )


@pytest.mark.parametrize("case", CASES["wilson_by_hand"], ids=lambda c: c["name"])
def test_wilson_matches_the_hand_computed_values(case: dict[str, Any]) -> None:
    low, high = wilson_bounds(case["estimate"], case["n"])

    assert (low, high) == (pytest.approx(case["low"], abs=1e-6), pytest.approx(case["high"]))


@pytest.mark.parametrize("case", CASES["proportion_rows"], ids=lambda c: c["name"])
def test_row_intervals_match_the_hand_computed_values(case: dict[str, Any]) -> None:
    ci = proportion_ci(rows_of(case["rows"]))

    assert ci.method == case["method"]
    assert ci.effective_n == pytest.approx(case["effective_n"])
    assert ci.low == pytest.approx(case["low"], abs=1e-6)
    assert ci.high == pytest.approx(case["high"], abs=1e-6)
    assert (ci.resamples, ci.seed) == (0, None)


@pytest.mark.parametrize(
    "case", CASES["t_quantiles"], ids=lambda c: f"{c['probability']}-df{c['df']}"
)
def test_student_t_quantiles_match_the_tables(case: dict[str, Any]) -> None:
    value = student_t_quantile(case["probability"], case["df"])

    assert value == pytest.approx(case["value"], abs=1e-6)
    assert student_t_quantile(1 - case["probability"], case["df"]) == pytest.approx(-value)


def test_student_t_approaches_the_normal_quantile() -> None:
    assert student_t_quantile(0.975, 100_000) == pytest.approx(1.959964, abs=1e-4)


@pytest.mark.parametrize("case", CASES["t_rows"], ids=lambda c: c["name"])
def test_t_intervals_match_the_hand_computed_values(case: dict[str, Any]) -> None:
    ci = t_ci(rows_of(case["rows"]))

    assert ci is not None and ci.method == "t_cluster"
    assert (ci.low, ci.high) == (
        pytest.approx(case["low"], abs=1e-6),
        pytest.approx(case["high"], abs=1e-6),
    )


@pytest.mark.parametrize("case", CASES["paired"], ids=lambda c: c["name"][:20])
def test_a_paired_difference_matches_newcombes_method_ten_by_hand(case: dict[str, Any]) -> None:
    base, other = rows_of(case["baseline"]), rows_of(case["other"])
    r = correlation([(a[0] / a[1], b[0] / b[1]) for a, b in zip(base, other, strict=True)])

    ci = mover_difference(proportion_ci(base), proportion_ci(other), correlation=r)

    assert r == pytest.approx(case["correlation"])
    assert ci.method == "newcombe_paired"
    assert ci.estimate == pytest.approx(case["estimate"])
    assert ci.low == pytest.approx(case["low"], abs=1e-6)
    assert ci.high == pytest.approx(case["high"], abs=1e-6)


# --------------------------------------------------------------------------- honesty


@pytest.mark.parametrize("rows", [1, 2, 3, 5, 10, 30])
def test_no_small_run_claims_certainty(rows: int) -> None:
    for attempts in (1, 4):
        all_pass = proportion_ci([(attempts, attempts)] * rows)
        all_fail = proportion_ci([(0, attempts)] * rows)

        # The bound is the Wilson bound on the rows, whatever the attempts per row.
        assert all_pass.low == pytest.approx(rows / (rows + 1.959964**2), abs=1e-6)
        assert all_pass.high == 1.0
        assert all_fail.low == 0.0
        assert all_fail.high == pytest.approx(1.959964**2 / (rows + 1.959964**2), abs=1e-6)


def test_clustered_wilson_keeps_its_coverage_on_hard_and_easy_rows() -> None:
    # 12 rows x 4 attempts, each row with its own chance of passing (mean 0.7): attempts of a
    # row agree far more than independent ones would. A naive Wilson on the 48 attempts
    # covers the true rate too rarely; the clustered one keeps close to 95 %.
    rng = random.Random(5)
    truth, covered, naive_covered, trials = 0.7, 0, 0, 600
    for _ in range(trials):
        skills = [min(1.0, max(0.0, rng.gauss(truth, 0.3))) for _ in range(12)]
        rows = [(float(sum(rng.random() < s for _ in range(4))), 4.0) for s in skills]
        mean_skill = statistics.fmean(skills)
        ci = proportion_ci(rows)
        covered += ci.low <= mean_skill <= ci.high
        passes = sum(x for x, _ in rows)
        low, high = wilson_bounds(passes / 48, 48)
        naive_covered += low <= mean_skill <= high
    assert covered / trials >= 0.9
    assert naive_covered / trials < covered / trials


def test_bounded_mean_rewards_use_the_proportion_interval() -> None:
    rows = [(0.5, 1.0), (1.0, 1.0), (0.25, 1.0)]

    ci = mean_ci(rows, bounded=True)

    assert ci == proportion_ci(rows)
    assert ci is not None and ci.method == "wilson"


def test_unbounded_mean_rewards_choose_by_row_count() -> None:
    few = [(float(i % 5), 1.0) for i in range(BOOTSTRAP_MIN_ROWS - 1)]
    many = [(float(i % 5), 1.0) for i in range(BOOTSTRAP_MIN_ROWS)]

    assert (mean_ci(few, bounded=False) or pytest.fail()).method == "t_cluster"
    assert (mean_ci(many, bounded=False) or pytest.fail()).method == "bootstrap"
    assert mean_ci([(3.0, 1.0)] * 50, bounded=False) is None
    assert t_ci([(3.0, 1.0)]) is None


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: wilson_bounds(1.5, 3), "proportion"),
        (lambda: wilson_bounds(0.5, 0), "n must be positive"),
        (lambda: proportion_ci([(3, 2)]), "numerator <= denominator"),
        (lambda: proportion_ci([]), "at least one row"),
        (lambda: proportion_ci([(1, 1)], level=1.0), "level"),
        (lambda: student_t_quantile(1.0, 3), "probability"),
    ],
)
def test_bad_input_is_refused(call: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        call()


# --------------------------------------------------------------------------- bootstrap


def random_rows(seed: int, count: int, attempts_per_row: int) -> list[tuple[float, float]]:
    rng = random.Random(seed)
    rows = []
    for _ in range(count):
        skill = rng.random()
        n = rng.randint(1, attempts_per_row)
        rows.append((float(sum(rng.random() < skill for _ in range(n))), float(n)))
    return rows


@pytest.mark.parametrize("seed", range(6))
def test_an_interval_contains_its_point_estimate(seed: int) -> None:
    rows = random_rows(seed, count=5 + 7 * seed, attempts_per_row=4)
    skewed = [(1.0, 1.0)] + [(0.0, 1.0)] * (20 + seed)
    rng = random.Random(seed)
    continuous = [(rng.random() * 3, 3.0) for _ in range(15)]
    identical = [(0.7, 3.0)] * 9

    for data in (rows, skewed, continuous, identical):
        for method in ("bootstrap", "normal"):
            ci = bootstrap_ci(data, method=method, resamples=500)
            assert ci.low <= ci.estimate <= ci.high
            # A ratio of row sums is a weighted mean of row ratios (up to float rounding).
            assert min(x / y for x, y in data) - 1e-12 <= ci.low
            assert ci.high <= max(x / y for x, y in data) + 1e-12
        wilson = proportion_ci(data)
        assert wilson.low <= wilson.estimate <= wilson.high


def test_the_same_input_and_seed_give_the_same_interval() -> None:
    rows = random_rows(11, count=40, attempts_per_row=4)
    shuffled = rows[:]
    random.Random(3).shuffle(shuffled)

    first = bootstrap_ci(rows)
    assert bootstrap_ci(rows) == first
    assert bootstrap_ci(shuffled) == first  # the row order does not matter either
    assert first.seed is not None and bootstrap_ci(rows, seed=first.seed + 1) != first


def test_resampling_rows_keeps_their_attempts_together() -> None:
    # Attempts of a row are not independent, so the row bootstrap must be about twice
    # (sqrt(4)) as wide as one that pretends the 80 attempts were independent.
    rows = [(4.0, 4.0)] * 10 + [(0.0, 4.0)] * 10
    as_if_independent = [(1.0, 1.0)] * 40 + [(0.0, 1.0)] * 40

    clustered = bootstrap_ci(rows)
    naive = bootstrap_ci(as_if_independent)

    assert clustered.estimate == naive.estimate == 0.5
    width_ratio = (clustered.high - clustered.low) / (naive.high - naive.low)
    assert 1.6 < width_ratio < 2.4


def test_a_bootstrap_pass_rate_interval_has_the_textbook_width() -> None:
    # 50 passes in 100 single-attempt rows: the standard error is 0.05, the interval ~ +-0.098,
    # where Wilson agrees: on many rows the bootstrap is valid.
    ci = bootstrap_ci([(1.0, 1.0)] * 50 + [(0.0, 1.0)] * 50)
    wilson = proportion_ci([(1.0, 1.0)] * 50 + [(0.0, 1.0)] * 50)

    assert ci.low == pytest.approx(0.402, abs=0.02)
    assert ci.high == pytest.approx(0.598, abs=0.02)
    assert (wilson.low, wilson.high) == (
        pytest.approx(0.4038, abs=1e-4),
        pytest.approx(0.5962, abs=1e-4),
    )


def test_the_normal_form_agrees_with_the_bootstrap_on_a_moderate_sample() -> None:
    rows = random_rows(5, count=300, attempts_per_row=4)

    bootstrap = bootstrap_ci(rows, method="bootstrap")
    normal = bootstrap_ci(rows, method="normal")

    assert (normal.method, normal.resamples, normal.seed) == ("normal", 0, None)
    assert normal.low == pytest.approx(bootstrap.low, abs=0.01)
    assert normal.high == pytest.approx(bootstrap.high, abs=0.01)


def test_auto_bootstraps_binary_rows_and_switches_only_for_many_distinct_rows() -> None:
    binary = [(1.0, 1.0)] * 60_000 + [(0.0, 1.0)] * 40_000
    distinct = [(random.Random(i).random(), 1.0) for i in range(5_000)]

    assert bootstrap_ci(binary).method == "bootstrap"
    assert bootstrap_ci(distinct[:200]).method == "bootstrap"
    assert bootstrap_ci(distinct).method == "normal"


def test_a_narrower_level_gives_a_narrower_interval() -> None:
    rows = random_rows(2, count=50, attempts_per_row=3)

    for interval in (bootstrap_ci, proportion_ci):
        wide = interval(rows, level=0.99)
        narrow = interval(rows, level=0.8)
        assert wide.low <= narrow.low <= narrow.high <= wide.high


@pytest.mark.parametrize(
    ("rows", "options", "message"),
    [
        ([], {}, "at least one row"),
        ([(1.0, 0.0)], {}, "positive denominator"),
        ([(math.nan, 1.0)], {}, "finite numerator"),
        ([(1.0, 1.0)], {"level": 1.0}, "level"),
        ([(1.0, 1.0)], {"resamples": 0}, "resamples"),
    ],
)
def test_bootstrap_ci_refuses_bad_input(
    rows: list[tuple[float, float]], options: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        bootstrap_ci(rows, **options)


def test_the_paired_bootstrap_resamples_rows_with_both_runs_together() -> None:
    # 40 rows: 12 regressed (1 -> 0), 28 passed in both. Paired, the difference is -0.3 with
    # a standard error of sqrt(0.3 * 0.7 / 40) = 0.072; unpaired it would be ~0.08.
    rows = [(1.0, 1.0, 0.0, 1.0)] * 12 + [(1.0, 1.0, 1.0, 1.0)] * 28

    ci = paired_bootstrap_ci(rows, seed=3)

    assert ci.method == "bootstrap_paired" and ci.seed == 3 and ci.resamples == 2000
    assert ci.estimate == pytest.approx(-0.3)
    assert ci.low == pytest.approx(-0.3 - 1.96 * 0.0725, abs=0.03)
    assert ci.high == pytest.approx(-0.3 + 1.96 * 0.0725, abs=0.03)
    assert paired_bootstrap_ci(rows, seed=3) == ci


def test_the_paired_bootstrap_falls_back_to_its_normal_form_on_many_distinct_rows() -> None:
    rng = random.Random(8)
    rows = [(rng.random(), 1.0, rng.random(), 1.0) for _ in range(3000)]

    normal = paired_bootstrap_ci(rows)
    resampled = paired_bootstrap_ci(rows[:400])

    assert normal.method == "normal_paired" and normal.seed is None
    assert resampled.method == "bootstrap_paired"
    # Both around 0 with a standard error of sqrt(2/12/n).
    assert normal.high - normal.low == pytest.approx(2 * 1.96 * math.sqrt(2 / 12 / 3000), rel=0.1)


# --------------------------------------------------------------------------- the sampler


@pytest.mark.parametrize(
    ("trials", "p"), [(7, 0.3), (40, 0.1), (40, 0.4), (500, 0.8), (10**6, 0.5)]
)
def test_the_binomial_sampler_has_the_right_mean_and_variance(trials: int, p: float) -> None:
    rng = random.Random(17)
    draws = [intervals._binomial(rng, trials, p) for _ in range(20_000)]

    assert all(0 <= draw <= trials for draw in draws)
    sd = math.sqrt(trials * p * (1 - p))
    assert statistics.fmean(draws) == pytest.approx(trials * p, abs=4 * sd / math.sqrt(20_000))
    assert statistics.pvariance(draws) == pytest.approx(sd * sd, rel=0.05)


def test_the_binomial_sampler_matches_the_exact_distribution() -> None:
    rng = random.Random(23)
    trials, p, count = 40, 0.4, 40_000  # n*p = 16: the rejection sampler's regime
    seen = [0] * (trials + 1)
    for _ in range(count):
        seen[intervals._binomial(rng, trials, p)] += 1

    exact = [math.comb(trials, k) * p**k * (1 - p) ** (trials - k) for k in range(trials + 1)]
    distance = sum(abs(seen[k] / count - exact[k]) for k in range(trials + 1)) / 2
    assert distance < 0.02


def test_the_binomial_sampler_edges() -> None:
    rng = random.Random(0)

    assert intervals._binomial(rng, 0, 0.5) == 0
    assert intervals._binomial(rng, 9, 0.0) == 0
    assert intervals._binomial(rng, 9, 1.0) == 9


def test_the_public_names_are_pinned() -> None:
    assert intervals.__all__ == [
        "BOOTSTRAP_MIN_ROWS",
        "DEFAULT_LEVEL",
        "DEFAULT_RESAMPLES",
        "DEFAULT_SEED",
        "ConfidenceInterval",
        "bootstrap_ci",
        "correlation",
        "mean_ci",
        "mover_difference",
        "paired_bootstrap_ci",
        "proportion_ci",
        "student_t_quantile",
        "t_ci",
        "wilson_bounds",
    ]
