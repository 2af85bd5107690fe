"""Metrics: the reference summary (golden cases), pass@k, pass^k, intervals and the extras."""

from __future__ import annotations

import json
import math
import random
import statistics
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from osmosis.eval import intervals, metrics
from osmosis.eval.metrics import (
    EXTRA_SUMMARY_KEYS,
    REFERENCE_SUMMARY_KEYS,
    RowTally,
    bootstrap_ci,
    pass_at_k,
    pass_at_k_estimate,
    pass_hat_k,
    pass_hat_k_estimate,
    platform_metrics,
    platform_results,
    reference_summary,
    reward_stats,
    summarize,
    tally_rows,
)
from osmosis.eval.records import AttemptRecord

GOLDEN = Path(__file__).parent / "golden" / "metrics"
GOLDEN_CASES = sorted(GOLDEN.glob("*.json"))


def load(name: str) -> dict[str, Any]:
    case: dict[str, Any] = json.loads((GOLDEN / f"{name}.json").read_text(encoding="utf-8"))
    return case


def as_records(rows: list[dict[str, Any]]) -> list[AttemptRecord]:
    """The same attempts as the engine would hold them."""
    finished = datetime(2026, 1, 1, tzinfo=UTC)
    return [
        AttemptRecord(source_row_index=row["row_index"], finished_at=finished, **row)
        for row in rows
    ]


def attempts(outcomes: Sequence[Sequence[str | float | None]]) -> list[dict[str, Any]]:
    """Index rows from a grid: one list per dataset row, one entry per attempt.

    A number is a successful attempt with that reward, "fail" a failed attempt without one,
    "skip" a skipped attempt, and None a successful attempt left ungraded.
    """
    rows = []
    for row_index, row in enumerate(outcomes):
        for run_index, outcome in enumerate(row):
            item: dict[str, Any] = {"row_index": row_index, "run_index": run_index}
            if outcome == "fail":
                item |= {"status": "failed", "error_type": "agent_error"}
            elif outcome == "skip":
                item |= {"status": "skipped"}
            else:
                item |= {"status": "success"}
                if outcome is not None:
                    item["reward"] = outcome
            rows.append(item)
    return rows


# --------------------------------------------------------------------------- golden cases


def test_the_golden_cases_are_all_present() -> None:
    assert [path.stem for path in GOLDEN_CASES] == [
        "all_failed_no_rewards",
        "local_smoke_run_5x2",
        "multi_attempt_pass_at_k",
        "single_attempt_all_pass",
        "skipped_excluded_from_scored",
    ]


@pytest.mark.parametrize("path", GOLDEN_CASES, ids=lambda path: path.stem)
def test_summary_reproduces_the_reference_exactly(path: Path) -> None:
    case = json.loads(path.read_text(encoding="utf-8"))

    summary = summarize(case["index"], pass_threshold=case["pass_threshold"])

    assert reference_summary(summary) == case["expected"]
    # The reference keys come first, in the reference's order, and our extras after them.
    assert list(summary) == list(case["expected"]) + [
        key for key in EXTRA_SUMMARY_KEYS if key in summary
    ]
    assert [key for key in REFERENCE_SUMMARY_KEYS if key in summary] == list(case["expected"])


@pytest.mark.parametrize("path", GOLDEN_CASES, ids=lambda path: path.stem)
def test_records_and_index_rows_give_the_same_summary(path: Path) -> None:
    case = json.loads(path.read_text(encoding="utf-8"))

    from_rows = summarize(case["index"], pass_threshold=case["pass_threshold"])
    from_records = summarize(as_records(case["index"]), pass_threshold=case["pass_threshold"])

    assert from_records == from_rows


def test_smoke_run_numbers_read_as_the_reference_notes_print_them() -> None:
    summary = summarize(load("local_smoke_run_5x2")["index"])

    stats = summary["reward_stats"]
    assert (round(stats["mean"], 3), stats["median"], round(stats["std"], 3)) == (0.667, 1, 0.471)
    assert summary["pass_at_k"] == [{"k": 1, "value": 0.5}, {"k": 2, "value": 0.5}]


# --------------------------------------------------------------------------- counting rules


def test_a_failed_attempt_that_carries_a_reward_is_graded_and_can_pass() -> None:
    rows = [
        {"row_index": 0, "run_index": 0, "status": "failed", "reward": 1.0, "error_type": "x"},
        {"row_index": 1, "run_index": 0, "status": "success", "reward": 0.0},
    ]

    summary = summarize(rows)

    assert (summary["graded"], summary["passed"], summary["failed"]) == (2, 1, 1)
    assert summary["pass_rate"] == 0.5


def test_a_threshold_of_zero_passes_every_graded_attempt() -> None:
    summary = summarize(attempts([[0.0], [0.3], ["fail"], ["skip"]]), pass_threshold=0.0)

    assert (summary["passed"], summary["completed_samples"]) == (2, 3)
    assert summary["pass_threshold"] == 0.0


def test_an_ungraded_success_is_a_non_pass_in_the_denominator() -> None:
    summary = summarize(attempts([[1.0], [None]]))

    assert (summary["graded"], summary["passed"], summary["pass_rate"]) == (1, 1, 0.5)


def test_rewards_that_are_not_finite_numbers_are_not_graded() -> None:
    rows = attempts([[1.0], [1.0], [1.0], [1.0]])
    rows[1]["reward"] = True
    rows[2]["reward"] = "1.0"
    rows[3]["reward"] = math.nan

    summary = summarize(rows)

    assert (summary["graded"], summary["passed"]) == (1, 1)


def test_tokens_count_integers_only_and_include_skipped_attempts() -> None:
    rows = attempts([[1.0], ["skip"], ["fail"], [0.0]])
    for row, tokens in zip(rows, [10, 5, 7, 2.5], strict=True):
        row["tokens"] = tokens

    assert summarize(rows)["tokens_used"] == 22


def test_n_runs_and_pass_at_k_appear_only_for_multi_attempt_runs() -> None:
    single = summarize(attempts([[1.0], [0.0]]))
    double = summarize(attempts([[1.0, 0.0], [0.0, 0.0]]))

    assert "n_runs" not in single and "pass_at_k" not in single and "pass_hat_k" not in single
    assert double["n_runs"] == 2
    assert [point["k"] for point in double["pass_at_k"]] == [1, 2]


def test_pass_at_k_needs_two_points_even_when_n_runs_is_two() -> None:
    # Every second attempt was skipped, so no row has two scored attempts: only k=1 exists.
    summary = summarize(attempts([[1.0, "skip"], [0.0, "skip"]]))

    assert summary["n_runs"] == 2
    assert "pass_at_k" not in summary
    assert "pass_hat_k" not in summary


def test_k_runs_over_powers_of_two_up_to_n_runs() -> None:
    summary = summarize(attempts([[1.0, 0.0, 0.0, 0.0, 0.0, 1.0]]))

    assert [point["k"] for point in summary["pass_at_k"]] == [1, 2, 4]
    assert [point["k"] for point in summary["pass_hat_k"]] == [1, 2, 4]


def test_attempts_without_an_integer_row_index_count_but_join_no_row() -> None:
    rows = [*attempts([[1.0, 1.0]]), {"run_index": 0, "status": "success", "reward": 0.0}]

    summary = summarize(rows)

    assert (summary["total_samples"], summary["graded"]) == (3, 3)
    assert summary["pass_at_k"] == [{"k": 1, "value": 1.0}, {"k": 2, "value": 1.0}]
    assert list(tally_rows(rows)) == [0]


def test_an_empty_run_divides_by_nothing() -> None:
    summary = summarize([])

    assert reference_summary(summary) == {
        "total_samples": 0,
        "completed_samples": 0,
        "graded": 0,
        "passed": 0,
        "failed": 0,
        "skipped": 0,
        "pass_rate": 0.0,
        "pass_threshold": 1.0,
        "tokens_used": 0,
    }
    assert summary["confidence_intervals"] == {"mean_reward": None, "pass_rate": None}
    assert summary["errors_by_type"] == {}
    assert summary["cost_usd"] is None


def test_an_all_skipped_run_has_no_pass_rate_interval() -> None:
    summary = summarize(attempts([["skip", "skip"]]))

    assert (summary["completed_samples"], summary["pass_rate"]) == (0, 0.0)
    assert summary["confidence_intervals"]["pass_rate"] is None
    assert "pass_at_k" not in summary


@pytest.mark.parametrize("threshold", [math.nan, math.inf, "1.0", True])
def test_an_invalid_threshold_is_refused(threshold: Any) -> None:
    with pytest.raises(ValueError, match="pass_threshold"):
        summarize([], pass_threshold=threshold)


def test_summaries_accept_any_iterable_once() -> None:
    rows = load("local_smoke_run_5x2")["index"]

    assert summarize(iter(rows)) == summarize(rows)


# --------------------------------------------------------------------------- extras


def test_errors_are_counted_by_type_most_frequent_first() -> None:
    rows = attempts([["fail", "fail"], ["fail", 1.0], ["skip", "fail"]])
    rows[1]["error_type"] = "timeout"
    rows[2]["error_type"] = "timeout"
    del rows[5]["error_type"]

    summary = summarize(rows)

    assert summary["errors_by_type"] == {"timeout": 2, "agent_error": 1, "unknown": 1}
    assert list(summary["errors_by_type"]) == ["timeout", "agent_error", "unknown"]
    assert sum(summary["errors_by_type"].values()) == summary["failed"]


def test_an_error_type_outside_a_failure_is_not_an_error() -> None:
    # The platform's own contract rows can say error_type "none" on a success.
    rows = [{"row_index": 0, "run_index": 0, "status": "success", "error_type": "none"}]

    assert summarize(rows)["errors_by_type"] == {}


def test_cost_is_summed_over_every_attempt_that_knows_one() -> None:
    rows = attempts([[1.0], ["skip"], ["fail"], [0.0]])
    for row, cost in zip(rows, [0.25, 0.125, None, 0.5], strict=True):
        if cost is not None:
            row["cost_usd"] = cost

    assert summarize(rows)["cost_usd"] == 0.875
    assert summarize(attempts([[1.0]]))["cost_usd"] is None


def test_cost_comes_from_records_too() -> None:
    case = load("multi_attempt_pass_at_k")
    records = [
        record.model_copy(update={"cost_usd": 0.001}) for record in as_records(case["index"])
    ]

    assert summarize(records)["cost_usd"] == pytest.approx(0.008)


def test_pass_hat_k_is_reported_beside_pass_at_k() -> None:
    summary = summarize(load("multi_attempt_pass_at_k")["index"])

    # Row 0 has 1 pass in 4: pass^1 = 1/4, and no pair or quadruple is all passes.
    assert summary["pass_hat_k"] == [
        {"k": 1, "value": 0.125},
        {"k": 2, "value": 0.0},
        {"k": 4, "value": 0.0},
    ]


def test_smoke_run_pass_hat_k_equals_pass_at_k_when_rows_are_all_or_nothing() -> None:
    summary = summarize(load("local_smoke_run_5x2")["index"])

    assert summary["pass_hat_k"] == summary["pass_at_k"]


# --------------------------------------------------------------------------- pass@k, pass^k


@pytest.mark.parametrize(
    ("attempts_", "passes", "k", "expected"),
    [
        (4, 1, 1, 0.25),
        (4, 1, 2, 0.5),
        (4, 1, 4, 1.0),
        (4, 0, 4, 0.0),
        (4, 3, 2, 1.0),  # a - p < k: every pair holds a pass
        (2, 2, 2, 1.0),
        (10, 3, 3, 1 - 35 / 120),
    ],
)
def test_pass_at_k_estimate(attempts_: int, passes: int, k: int, expected: float) -> None:
    assert pass_at_k_estimate(attempts_, passes, k) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("attempts_", "passes", "k", "expected"),
    [
        (4, 2, 2, 1 / 6),
        (4, 1, 2, 0.0),
        (4, 4, 4, 1.0),
        (4, 3, 1, 0.75),
        (10, 5, 3, 10 / 120),
    ],
)
def test_pass_hat_k_estimate(attempts_: int, passes: int, k: int, expected: float) -> None:
    assert pass_hat_k_estimate(attempts_, passes, k) == pytest.approx(expected)


def test_the_estimators_match_their_binomial_definitions() -> None:
    for n in range(1, 13):
        for c in range(n + 1):
            for k in range(1, n + 1):
                at_k = 1 - math.comb(n - c, k) / math.comb(n, k)
                hat_k = math.comb(c, k) / math.comb(n, k)
                assert pass_at_k_estimate(n, c, k) == pytest.approx(at_k, abs=1e-12)
                assert pass_hat_k_estimate(n, c, k) == pytest.approx(hat_k, abs=1e-12)
                assert pass_hat_k_estimate(n, c, k) <= pass_at_k_estimate(n, c, k) + 1e-12
            assert pass_at_k_estimate(n, c, 1) == pytest.approx(c / n)
            assert pass_hat_k_estimate(n, c, 1) == pytest.approx(c / n)


@pytest.mark.parametrize(
    ("args", "message"),
    [((2, 1, 3), "must not exceed"), ((2, 1, 0), "at least 1"), ((2, 3, 1), "between 0")],
)
def test_the_estimators_refuse_impossible_arguments(
    args: tuple[int, int, int], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        pass_at_k_estimate(*args)
    with pytest.raises(ValueError, match=message):
        pass_hat_k_estimate(*args)


def test_pass_at_k_over_attempts_matches_the_reference_example() -> None:
    rows = load("multi_attempt_pass_at_k")["index"]

    assert [pass_at_k(rows, k=k) for k in (1, 2, 4)] == [0.125, 0.25, 0.5]
    assert pass_at_k(as_records(rows), k=2) == 0.25
    assert pass_at_k(rows) == 0.5  # k defaults to 4


def test_pass_hat_k_over_attempts() -> None:
    rows = attempts([[1.0, 1.0, 0.0, 1.0], [1.0, 1.0, 1.0, 1.0]])

    # Row 0: C(3,2)/C(4,2) = 1/2; row 1: 1.
    assert pass_hat_k(rows, k=2) == 0.75
    assert pass_hat_k(rows, k=1) == pass_at_k(rows, k=1) == 0.875
    assert pass_hat_k(rows, k=4) == 0.5


def test_pass_at_k_uses_the_threshold_and_ignores_skipped_attempts() -> None:
    rows = attempts([[0.5, "skip", 0.0], [0.0, 0.0, 0.0]])

    assert pass_at_k(rows, k=2) == 0.0
    assert pass_at_k(rows, k=2, pass_threshold=0.5) == 0.5  # row 0 has 2 scored attempts


def test_pass_at_k_is_undefined_when_no_row_has_k_attempts() -> None:
    with pytest.raises(ValueError, match="no row has 4 non-skipped attempts"):
        pass_at_k(attempts([[1.0, 1.0, 1.0, "skip"]]), k=4)
    with pytest.raises(ValueError, match="no row has 1 non-skipped attempts"):
        pass_hat_k([], k=1)
    with pytest.raises(ValueError, match="at least 1"):
        pass_at_k([], k=0)


def test_tally_rows_reduces_each_row_in_row_order() -> None:
    rows = attempts([[1.0, "fail", "skip"], [0.25, None]])

    assert tally_rows(list(reversed(rows))) == {
        0: RowTally(attempts=2, passes=1, rewards=1, reward_sum=1.0),
        1: RowTally(attempts=2, passes=0, rewards=1, reward_sum=0.25),
    }
    assert list(tally_rows(list(reversed(rows)))) == [0, 1]


def test_reward_stats_population_std_and_single_value() -> None:
    assert reward_stats([0.5]) == {"mean": 0.5, "median": 0.5, "std": 0.0, "min": 0.5, "max": 0.5}
    assert reward_stats([0.0, 1.0])["std"] == 0.5
    with pytest.raises(ValueError):
        reward_stats([])


# --------------------------------------------------------------------------- intervals


def test_an_all_pass_run_has_the_interval_one_to_one() -> None:
    summary = summarize(attempts([[1.0, 1.0, 1.0]] * 20))

    for name in ("pass_rate", "mean_reward"):
        interval = summary["confidence_intervals"][name]
        assert (interval["low"], interval["estimate"], interval["high"]) == (1.0, 1.0, 1.0)


def test_interval_estimates_match_the_summary() -> None:
    summary = summarize(load("local_smoke_run_5x2")["index"])
    intervals = summary["confidence_intervals"]

    assert intervals["pass_rate"]["estimate"] == summary["pass_rate"]
    assert intervals["mean_reward"]["estimate"] == pytest.approx(summary["reward_stats"]["mean"])
    described = {
        key: intervals["pass_rate"][key] for key in ("level", "method", "resamples", "seed")
    }
    assert described == {
        "level": 0.95,
        "method": "bootstrap",
        "resamples": 2000,
        "seed": metrics.DEFAULT_SEED,
    }


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


def test_the_same_input_and_seed_give_the_same_interval() -> None:
    rows = random_rows(11, count=40, attempts_per_row=4)
    shuffled = rows[:]
    random.Random(3).shuffle(shuffled)

    first = bootstrap_ci(rows)
    assert bootstrap_ci(rows) == first
    assert bootstrap_ci(shuffled) == first  # the row order does not matter either
    assert bootstrap_ci(rows, seed=first.seed + 1) != first


def test_summaries_are_deterministic() -> None:
    rows = attempts([[random.Random(row).random() for _ in range(3)] for row in range(30)])

    assert summarize(rows) == summarize(rows)
    assert summarize(rows, seed=1) != summarize(rows, seed=2)


def test_resampling_rows_keeps_their_attempts_together() -> None:
    # Ten rows always pass and ten always fail, four attempts each. Attempts of a row are not
    # independent, so the row bootstrap must be about twice (sqrt(4)) as wide as one that
    # pretends the 80 attempts were independent.
    rows = [(4.0, 4.0)] * 10 + [(0.0, 4.0)] * 10
    as_if_independent = [(1.0, 1.0)] * 40 + [(0.0, 1.0)] * 40

    clustered = bootstrap_ci(rows)
    naive = bootstrap_ci(as_if_independent)

    assert clustered.estimate == naive.estimate == 0.5
    width_ratio = (clustered.high - clustered.low) / (naive.high - naive.low)
    assert 1.6 < width_ratio < 2.4


def test_the_summary_interval_resamples_rows_not_attempts() -> None:
    summary = summarize(attempts([[1.0] * 4] * 10 + [[0.0] * 4] * 10))

    assert summary["confidence_intervals"]["pass_rate"] == (
        bootstrap_ci([(4.0, 4.0)] * 10 + [(0.0, 4.0)] * 10).as_dict()
    )


def test_a_bootstrap_pass_rate_interval_has_the_textbook_width() -> None:
    # 50 passes in 100 single-attempt rows: the standard error is 0.05, the interval ~ +-0.098.
    ci = bootstrap_ci([(1.0, 1.0)] * 50 + [(0.0, 1.0)] * 50)

    assert ci.low == pytest.approx(0.402, abs=0.02)
    assert ci.high == pytest.approx(0.598, abs=0.02)


def test_the_normal_form_agrees_with_the_bootstrap_on_a_moderate_sample() -> None:
    rows = random_rows(5, count=300, attempts_per_row=4)

    bootstrap = bootstrap_ci(rows, method="bootstrap")
    normal = bootstrap_ci(rows, method="normal")

    assert normal.method == "normal" and normal.resamples == 0
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

    wide = bootstrap_ci(rows, level=0.99)
    narrow = bootstrap_ci(rows, level=0.8)

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


# --------------------------------------------------------------------------- platform shapes


def test_platform_results_use_the_platform_names() -> None:
    summary = summarize(load("local_smoke_run_5x2")["index"])

    results = platform_results(summary, sampled_rows=5, total_dataset_rows=5, resumed_count=0)

    stats = summary["reward_stats"]
    assert list(results)[:13] == [
        "score",
        "pass_rate",
        "graded",
        "passed",
        "failed",
        "skipped",
        "total_runs",
        "sampled_rows",
        "pass_threshold",
        "total_tokens",
        "total_dataset_rows",
        "resumed_count",
        "reward_stats",
    ]
    assert results["score"] == stats["mean"]
    assert (results["total_runs"], results["total_tokens"]) == (8, 120)
    assert (results["sampled_rows"], results["total_dataset_rows"]) == (5, 5)
    assert results["reward_stats"] == {
        "mean": stats["mean"],
        "std": stats["std"],
        "min": 0.0,
        "median": 1.0,
        "max": 1.0,
        "pass_at_k": {"1": 0.5, "2": 0.5},
    }
    assert results["pass_hat_k"] == {"1": 0.5, "2": 0.5}
    assert results["errors_by_type"] == {"agent_error": 2}
    assert results["confidence_intervals"] == summary["confidence_intervals"]


def test_platform_results_without_rewards() -> None:
    summary = summarize(load("all_failed_no_rewards")["index"])

    results = platform_results(summary)

    assert results["score"] is None
    assert results["reward_stats"] is None
    assert results["resumed_count"] is None


def test_platform_results_of_a_reference_summary_carry_no_extras() -> None:
    summary = reference_summary(summarize(load("multi_attempt_pass_at_k")["index"]))

    results = platform_results(summary)

    assert len(results) == 13
    assert results["reward_stats"]["pass_at_k"] == {"1": 0.125, "2": 0.25, "4": 0.5}


def test_platform_metrics_body() -> None:
    case = load("skipped_excluded_from_scored")
    summary = summarize(case["index"], pass_threshold=case["pass_threshold"])

    body = platform_metrics(summary, status="finished", duration_ms=65.0)

    expected = case["expected"]
    assert body == {
        "status": "finished",
        "overview": {
            "duration_ms": 65.0,
            "total_samples": 4,
            "completed_samples": 3,
            "graded": 2,
            "passed": 1,
            "failed": 1,
            "skipped": 1,
            "pass_rate": expected["pass_rate"],
            "pass_threshold": 0.5,
            "tokens_used": 305,
        },
        "reward_stats": expected["reward_stats"],
        "pass_at_k": [],  # a single-attempt run has no curve
    }
    assert list(body["overview"]) == ["duration_ms", *REFERENCE_SUMMARY_KEYS[:9]]


def test_platform_metrics_of_a_run_without_rewards() -> None:
    body = platform_metrics(summarize([]), status="running", duration_ms=None)

    assert body["reward_stats"] is None
    assert body["overview"]["duration_ms"] is None


# --------------------------------------------------------------------------- scale


def test_a_hundred_thousand_attempts_summarise_quickly() -> None:
    rng = random.Random(99)
    rows = []
    for row_index in range(25_000):
        skill = rng.random()
        for run_index in range(4):
            roll = rng.random()
            row: dict[str, Any] = {"row_index": row_index, "run_index": run_index, "tokens": 10}
            if roll < 0.03:
                row |= {"status": "skipped"}
            elif roll < 0.08:
                row |= {"status": "failed", "error_type": "timeout"}
            else:
                row |= {"status": "success", "reward": rng.random() * skill}
            rows.append(row)

    started = time.perf_counter()
    summary = summarize(rows, pass_threshold=0.5)
    elapsed = time.perf_counter() - started

    assert summary["total_samples"] == 100_000
    assert summary["tokens_used"] == 1_000_000
    assert [point["k"] for point in summary["pass_at_k"]] == [1, 2, 4]
    intervals = summary["confidence_intervals"]
    assert intervals["pass_rate"]["low"] < summary["pass_rate"] < intervals["pass_rate"]["high"]
    # Resampling every attempt 2000 times would take minutes; a few seconds is the budget
    # even on a busy machine.
    assert elapsed < 15
