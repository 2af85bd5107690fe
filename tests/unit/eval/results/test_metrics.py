"""Metrics: the reference summary (golden cases), pass@k, pass^k, intervals and the extras."""

from __future__ import annotations

import json
import math
import random
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from osmosis.eval.results.metrics import (
    EXTRA_SUMMARY_KEYS,
    REFERENCE_SUMMARY_KEYS,
    RowTally,
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
from osmosis.eval.results.records import AttemptRecord

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


@pytest.mark.parametrize("path", GOLDEN_CASES, ids=lambda path: path.stem)
def test_summary_intervals_match_the_hand_computed_golden_values(path: Path) -> None:
    case = json.loads(path.read_text(encoding="utf-8"))

    summary = summarize(case["index"], pass_threshold=case["pass_threshold"])

    for name, expected in case["intervals"].items():
        interval = summary["confidence_intervals"][name]
        if expected is None:
            assert interval is None
            continue
        assert interval["method"] == expected["method"]
        assert interval["effective_n"] == pytest.approx(expected["effective_n"])
        assert interval["low"] == pytest.approx(expected["low"], abs=1e-6)
        assert interval["high"] == pytest.approx(expected["high"], abs=1e-6)
        assert interval["level"] == 0.95


def test_three_rows_that_all_pass_are_no_proof_of_a_perfect_pass_rate() -> None:
    # The case: the old row bootstrap said "95% CI 1.000 to 1.000" here.
    for n in (1, 4):
        interval = summarize(attempts([[1.0] * n] * 3))["confidence_intervals"]["pass_rate"]

        assert interval["estimate"] == interval["high"] == 1.0
        assert interval["low"] < 0.5  # 0.4385: Wilson on 3 rows, however many attempts each


def test_an_all_fail_run_keeps_an_upper_bound_well_above_zero() -> None:
    summary = summarize(attempts([["fail"]] * 3 + [[0.0]] * 2))

    interval = summary["confidence_intervals"]["pass_rate"]
    assert interval["low"] == interval["estimate"] == 0.0
    assert interval["high"] > 0.4  # z^2 / (5 + z^2) = 0.4345
    reward = summary["confidence_intervals"]["mean_reward"]
    assert (reward["low"], reward["high"]) == (0.0, pytest.approx(3.841459 / 5.841459))


def test_every_interval_names_its_method_and_the_bootstrap_only_where_it_ran() -> None:
    summary = summarize(load("local_smoke_run_5x2")["index"])
    intervals = summary["confidence_intervals"]

    assert intervals["pass_rate"]["estimate"] == summary["pass_rate"]
    assert intervals["mean_reward"]["estimate"] == pytest.approx(summary["reward_stats"]["mean"])
    for interval in intervals.values():
        assert set(interval) == {
            "estimate",
            "low",
            "high",
            "level",
            "method",
            "resamples",
            "seed",
            "effective_n",
        }
        assert (interval["method"], interval["resamples"], interval["seed"]) == (
            "wilson_cluster",
            0,
            None,
        )


def test_attempts_of_a_row_count_as_one_row_when_they_agree() -> None:
    # Ten rows always pass and ten always fail, four attempts each: as informative as 20 rows,
    # not 80 attempts, so the interval is about twice (sqrt(4)) as wide as the naive one.
    clustered = summarize(attempts([[1.0] * 4] * 10 + [[0.0] * 4] * 10))
    single = summarize(attempts([[1.0]] * 10 + [[0.0]] * 10))
    naive = summarize(attempts([[1.0]] * 40 + [[0.0]] * 40))

    def width(summary: dict[str, Any]) -> float:
        interval = summary["confidence_intervals"]["pass_rate"]
        return float(interval["high"] - interval["low"])

    assert clustered["confidence_intervals"]["pass_rate"]["effective_n"] == 20
    assert width(clustered) == pytest.approx(width(single))
    assert 1.8 < width(clustered) / width(naive) < 2.2


def test_independent_looking_attempts_earn_up_to_the_attempt_count() -> None:
    # Every row passes half its attempts: nothing clusters, so n_eff is every attempt.
    summary = summarize(attempts([[1.0, 0.0, 1.0, 0.0]] * 5))

    assert summary["confidence_intervals"]["pass_rate"]["effective_n"] == 20


def test_rewards_outside_zero_to_one_use_t_on_few_rows_and_the_bootstrap_on_many() -> None:
    few = summarize(attempts([[3.0], [5.0], [4.0]]))
    many = summarize(attempts([[float(row % 7)] for row in range(40)]))
    alike = summarize(attempts([[5.0], [5.0]]))

    interval = few["confidence_intervals"]["mean_reward"]
    assert interval["method"] == "t_cluster"
    assert (interval["low"], interval["high"]) == (
        pytest.approx(1.515862, abs=1e-6),
        pytest.approx(6.484138, abs=1e-6),
    )
    assert many["confidence_intervals"]["mean_reward"]["method"] == "bootstrap"
    assert many["confidence_intervals"]["mean_reward"]["resamples"] == 2000
    # Every row scored 5 with no bound on rewards: no honest interval exists, so none is given.
    assert alike["confidence_intervals"]["mean_reward"] is None
    # The pass rate stays a proportion whatever the reward scale.
    assert few["confidence_intervals"]["pass_rate"]["method"] == "wilson"


def test_summaries_are_deterministic_and_the_seed_matters_only_to_a_bootstrap() -> None:
    bounded = attempts([[random.Random(row).random() for _ in range(3)] for row in range(30)])
    unbounded = attempts(
        [[random.Random(row).random() * 10 for _ in range(3)] for row in range(30)]
    )

    assert summarize(bounded) == summarize(bounded)
    assert summarize(bounded, seed=1) == summarize(bounded, seed=2)
    assert summarize(unbounded, seed=1) != summarize(unbounded, seed=2)


def test_a_narrower_level_gives_a_narrower_summary_interval() -> None:
    rows = attempts([[1.0, 0.0], [1.0, 1.0], [0.0, 0.0], [1.0, 0.0]])

    wide = summarize(rows, level=0.99)["confidence_intervals"]["pass_rate"]
    narrow = summarize(rows, level=0.8)["confidence_intervals"]["pass_rate"]

    assert wide["low"] < narrow["low"] <= narrow["high"] < wide["high"]


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


def test_outcomes_count_wrong_answers_apart_from_errors() -> None:
    rows = [
        {"row_index": 0, "run_index": 0, "status": "success", "reward": 1.0},
        {"row_index": 1, "run_index": 0, "status": "success", "reward": 0.0},
        {"row_index": 2, "run_index": 0, "status": "success"},  # not graded
        {"row_index": 3, "run_index": 0, "status": "failed", "error_type": "timeout"},
        {"row_index": 4, "run_index": 0, "status": "skipped"},
    ]

    summary = summarize(rows, pass_threshold=1.0)

    assert summary["outcomes"] == {"passed": 1, "not_passed": 2, "errored": 1, "skipped": 1}
    assert summary["failed"] == 1  # today's key keeps its meaning: errored attempts
    assert "outcomes" not in reference_summary(summary)
