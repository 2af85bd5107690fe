"""Aggregate metrics over finished attempts: the reference summary, pass@k, pass^k and intervals.

Intervals (`confidence_intervals`) name their method: Wilson on rows for the pass rate
(clustered by row when n > 1), the same for mean rewards in [0, 1], and Student's t or the row
bootstrap for other rewards (see `osmosis.eval.results.intervals`).

Everything here is a pure function of the attempts, so the local engine (over `AttemptRecord`s)
and the platform (over `index.jsonl` rows) compute the same numbers from the same results.
`summarize` reproduces the reference `aggregate_metrics` summary key for key and value for value,
then appends a few keys of our own (`EXTRA_SUMMARY_KEYS`).

    summary = summarize(records, pass_threshold=1.0)
    summary["pass_rate"], summary["pass_at_k"]  # (0.5, [{"k": 1, "value": 0.5}, ...])
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Protocol, TypeAlias, TypeGuard

from osmosis.eval.results.intervals import (
    DEFAULT_LEVEL,
    DEFAULT_RESAMPLES,
    DEFAULT_SEED,
    ConfidenceInterval,
    bootstrap_ci,
    is_finite_number,
    mean_ci,
    proportion_ci,
)
from osmosis.vocabulary import DEFAULT_PASS_THRESHOLD, OUTCOMES, Outcome, outcome, passes

__all__ = [
    "DEFAULT_LEVEL",
    "DEFAULT_PASS_THRESHOLD",
    "DEFAULT_RESAMPLES",
    "DEFAULT_SEED",
    "EXTRA_SUMMARY_KEYS",
    "REFERENCE_SUMMARY_KEYS",
    "Attempt",
    "AttemptLike",
    "ConfidenceInterval",
    "RowTally",
    "bootstrap_ci",
    "pass_at_k",
    "pass_at_k_estimate",
    "pass_hat_k",
    "pass_hat_k_estimate",
    "platform_metrics",
    "platform_results",
    "reference_summary",
    "reward_stats",
    "summarize",
    "tally_rows",
]

REFERENCE_SUMMARY_KEYS: Final = (
    "total_samples",
    "completed_samples",
    "graded",
    "passed",
    "failed",
    "skipped",
    "pass_rate",
    "pass_threshold",
    "tokens_used",
    "reward_stats",
    "n_runs",
    "pass_at_k",
)
"""Keys the reference summary can hold, in its order; the optional ones appear only when due."""

EXTRA_SUMMARY_KEYS: Final = (
    "pass_hat_k",
    "confidence_intervals",
    "errors_by_type",
    "cost_usd",
    "outcomes",
)
"""Keys `summarize` adds after the reference ones; `reference_summary` strips them."""


class AttemptLike(Protocol):
    """What the metrics read from one attempt; `AttemptRecord` satisfies it.

    def summary_for(attempts: list[AttemptLike]) -> dict: return summarize(attempts)
    summary_for(records)
    """

    @property
    def row_index(self) -> int: ...
    @property
    def run_index(self) -> int: ...
    @property
    def status(self) -> str: ...
    @property
    def reward(self) -> float | None: ...
    @property
    def tokens(self) -> int | None: ...
    @property
    def error_type(self) -> str | None: ...
    @property
    def cost_usd(self) -> float | None: ...


Attempt: TypeAlias = AttemptLike | Mapping[str, Any]
"""An attempt as a record object or as an `index.jsonl` row dict (missing keys read as None)."""


@dataclass(frozen=True, slots=True)
class RowTally:
    """One dataset row's attempts, reduced to what pass@k, pass^k and the intervals need.

    tally = tally_rows(records)[0]
    tally.attempts, tally.passes  # (2, 1)
    """

    attempts: int
    """Non-skipped attempts of the row."""
    passes: int
    """Attempts whose reward reached the pass threshold."""
    rewards: int
    """Non-skipped attempts that carry a reward."""
    reward_sum: float
    """Sum of those rewards."""


# --------------------------------------------------------------------------- reading attempts


def _read(item: Attempt) -> tuple[object, object, object, object, object, object, object]:
    # Dicts come from index.jsonl or a database row; records come from the engine. The dict
    # test comes first because it is far cheaper than the Mapping ABC check.
    if isinstance(item, (dict, Mapping)):
        get = item.get
        return (
            get("row_index"),
            get("run_index"),
            get("status"),
            get("reward"),
            get("tokens"),
            get("error_type"),
            get("cost_usd"),
        )
    return (
        item.row_index,
        item.run_index,
        item.status,
        item.reward,
        item.tokens,
        item.error_type,
        item.cost_usd,
    )


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_threshold(pass_threshold: float) -> float:
    if not is_finite_number(pass_threshold):
        raise ValueError(f"pass_threshold must be a finite number, got {pass_threshold!r}")
    return float(pass_threshold)


@dataclass(slots=True)
class _Scan:
    """Everything one pass over the attempts collects."""

    total: int = 0
    skipped: int = 0
    failed: int = 0
    passed: int = 0
    tokens: int = 0
    max_run_index: int = -1
    rewards: list[float] = field(default_factory=list)
    # row key -> [attempts, passes, rewards, reward_sum]; lists, because a tally changes per
    # attempt and a frozen RowTally per update would allocate 100,000 objects for nothing.
    rows: dict[Hashable, list[Any]] = field(default_factory=dict)
    errors: Counter[str] = field(default_factory=Counter)
    cost: float | None = None
    outcomes: dict[Outcome, int] = field(default_factory=lambda: dict.fromkeys(OUTCOMES, 0))


class _Loose:
    """Key of an attempt without an integer row_index: its own row, left out of pass@k."""

    __slots__ = ()


def _scan(attempts: Iterable[Attempt], pass_threshold: float) -> _Scan:
    # One pass, locals only: this loop is the whole cost of summarising 100,000 attempts.
    scan = _Scan()
    rows, rewards, errors, outcomes = scan.rows, scan.rewards, scan.errors, scan.outcomes
    total = skipped = failed = passed = tokens_used = 0
    max_run_index = -1
    costs: list[float] = []
    for item in attempts:
        row_index, run_index, status, reward, tokens, error_type, cost = _read(item)
        total += 1
        if _is_int(run_index) and run_index > max_run_index:
            max_run_index = run_index
        if _is_int(tokens):
            tokens_used += tokens
        if cost is not None and is_finite_number(cost):
            costs.append(float(cost))
        graded = float(reward) if reward is not None and is_finite_number(reward) else None
        outcomes[outcome(str(status), graded, pass_threshold)] += 1
        if status == "skipped":
            # remove_sample: out of every denominator; its tokens and cost were still spent.
            skipped += 1
            continue
        if status == "failed":
            failed += 1
            errors[error_type if isinstance(error_type, str) else "unknown"] += 1
        key: Hashable = row_index if _is_int(row_index) else _Loose()
        tally = rows.get(key)
        if tally is None:
            tally = rows[key] = [0, 0, 0, 0.0]
        tally[0] += 1
        if reward is not None and is_finite_number(reward):
            value = float(reward)
            rewards.append(value)
            tally[2] += 1
            tally[3] += value
            if passes(value, pass_threshold):
                passed += 1
                tally[1] += 1
    scan.total, scan.skipped, scan.failed, scan.passed = total, skipped, failed, passed
    scan.tokens, scan.max_run_index = tokens_used, max_run_index
    scan.cost = math.fsum(costs) if costs else None
    return scan


def tally_rows(
    attempts: Iterable[Attempt], pass_threshold: float = DEFAULT_PASS_THRESHOLD
) -> dict[int, RowTally]:
    """Reduce attempts to one `RowTally` per `row_index`, in row order; skipped ones drop out.

    tally_rows([{"row_index": 0, "run_index": 0, "status": "success", "reward": 1.0}])
    # {0: RowTally(attempts=1, passes=1, rewards=1, reward_sum=1.0)}
    """
    scan = _scan(attempts, _check_threshold(pass_threshold))
    by_index = {key: tally for key, tally in scan.rows.items() if _is_int(key)}
    return {key: RowTally(*by_index[key]) for key in sorted(by_index)}


# --------------------------------------------------------------------------- pass@k and pass^k


def _check_k(attempts: int, passes: int, k: int) -> None:
    if k < 1:
        raise ValueError(f"k must be at least 1, got {k}")
    if not 0 <= passes <= attempts:
        raise ValueError(f"passes must be between 0 and attempts ({attempts}), got {passes}")
    if k > attempts:
        raise ValueError(f"k ({k}) must not exceed the row's attempts ({attempts})")


def pass_at_k_estimate(attempts: int, passes: int, k: int) -> float:
    """Unbiased pass@k of one row (Chen et al. 2021): chance that k of its attempts hold a pass.

    pass_at_k_estimate(attempts=4, passes=1, k=2)  # 0.5
    pass_at_k_estimate(attempts=4, passes=3, k=2)  # 1.0
    """
    _check_k(attempts, passes, k)
    failures = attempts - passes
    if failures < k:
        return 1.0  # every k-subset must contain a pass
    # 1 - C(failures, k) / C(attempts, k), as a product so large counts never overflow.
    all_fail = 1.0
    for i in range(k):
        all_fail *= (failures - i) / (attempts - i)
    return 1.0 - all_fail


def pass_hat_k_estimate(attempts: int, passes: int, k: int) -> float:
    """Unbiased pass^k of one row: chance that k of its attempts, drawn together, all pass.

    pass_hat_k_estimate(attempts=4, passes=2, k=2)  # 1/6
    pass_hat_k_estimate(attempts=4, passes=1, k=2)  # 0.0
    """
    _check_k(attempts, passes, k)
    if passes < k:
        return 0.0
    # C(passes, k) / C(attempts, k), as a product for the same reason as pass@k.
    all_pass = 1.0
    for i in range(k):
        all_pass *= (passes - i) / (attempts - i)
    return all_pass


_Estimator: TypeAlias = Callable[[int, int, int], float]


def _mean_over_rows(rows: Iterable[list[Any]], k: int, estimator: _Estimator) -> float | None:
    # Rows with fewer than k non-skipped attempts have no k-subset; the reference leaves them
    # out of the average rather than counting them as zero.
    values = [estimator(tally[0], tally[1], k) for tally in rows if tally[0] >= k]
    return statistics.fmean(values) if values else None


def _by_row(scan: _Scan) -> list[list[Any]]:
    return [tally for key, tally in scan.rows.items() if _is_int(key)]


def _powers_of_two(limit: int) -> list[int]:
    return [1 << power for power in range(limit.bit_length()) if 1 << power <= limit]


def _curve(rows: list[list[Any]], n_runs: int, estimator: _Estimator) -> list[dict[str, Any]]:
    points = []
    for k in _powers_of_two(n_runs):
        value = _mean_over_rows(rows, k, estimator)
        if value is not None:
            points.append({"k": k, "value": value})
    return points


def _row_average(
    attempts: Iterable[Attempt], k: int, pass_threshold: float, estimator: _Estimator
) -> float:
    if k < 1:
        raise ValueError(f"k must be at least 1, got {k}")
    scan = _scan(attempts, _check_threshold(pass_threshold))
    value = _mean_over_rows(_by_row(scan), k, estimator)
    if value is None:
        raise ValueError(f"no row has {k} non-skipped attempts, so the value is undefined")
    return value


def pass_at_k(
    attempts: Iterable[Attempt], k: int = 4, pass_threshold: float = DEFAULT_PASS_THRESHOLD
) -> float:
    """Mean unbiased pass@k over rows with at least k non-skipped attempts.

    pass_at_k(records, k=4)  # 0.5
    pass_at_k(records, k=8)  # ValueError when no row has 8 attempts
    """
    return _row_average(attempts, k, pass_threshold, pass_at_k_estimate)


def pass_hat_k(
    attempts: Iterable[Attempt], k: int = 4, pass_threshold: float = DEFAULT_PASS_THRESHOLD
) -> float:
    """Mean unbiased pass^k (all k attempts pass) over rows with at least k attempts.

    pass_hat_k(records, k=2)  # 0.25
    pass_hat_k(records, k=1) == pass_at_k(records, k=1)  # True
    """
    return _row_average(attempts, k, pass_threshold, pass_hat_k_estimate)


# --------------------------------------------------------------------------- summaries


def reward_stats(rewards: Sequence[float]) -> dict[str, float]:
    """Mean, median, population std (0.0 for one value), min and max of graded rewards.

    reward_stats([1.0, 0.0, 1.0])
    # {"mean": 0.666…, "median": 1.0, "std": 0.471…, "min": 0.0, "max": 1.0}
    """
    if not rewards:
        raise ValueError("reward_stats needs at least one reward")
    return {
        "mean": statistics.fmean(rewards),
        "median": statistics.median(rewards),
        "std": statistics.pstdev(rewards) if len(rewards) > 1 else 0.0,
        "min": min(rewards),
        "max": max(rewards),
    }


def summarize(
    attempts: Iterable[Attempt],
    pass_threshold: float = DEFAULT_PASS_THRESHOLD,
    *,
    level: float = DEFAULT_LEVEL,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = DEFAULT_SEED,
) -> dict[str, Any]:
    """Aggregate attempts into the reference `metrics.json` summary, plus our extra keys.

    Skipped attempts leave every denominator but still count tokens and cost; a failed attempt
    without a reward is a non-pass. Callers pass one attempt per `(row_index, run_index)`.

    summary = summarize(index_rows, pass_threshold=1.0)
    reference_summary(summary)  # exactly what the reference aggregate_metrics returns
    """
    threshold = _check_threshold(pass_threshold)
    scan = _scan(attempts, threshold)
    completed = scan.total - scan.skipped
    summary: dict[str, Any] = {
        "total_samples": scan.total,
        "completed_samples": completed,
        "graded": len(scan.rewards),
        "passed": scan.passed,
        "failed": scan.failed,
        "skipped": scan.skipped,
        # A failed attempt stays in the denominator: dropping it would let a run where most
        # attempts failed report the pass rate of the few that worked.
        "pass_rate": scan.passed / completed if completed else 0.0,
        "pass_threshold": threshold,
        "tokens_used": scan.tokens,
    }
    if scan.rewards:
        summary["reward_stats"] = reward_stats(scan.rewards)
    n_runs = scan.max_run_index + 1
    at_k: list[dict[str, Any]] = []
    hat_k: list[dict[str, Any]] = []
    if n_runs >= 2:
        summary["n_runs"] = n_runs
        by_row = _by_row(scan)
        at_k = _curve(by_row, n_runs, pass_at_k_estimate)
        hat_k = _curve(by_row, n_runs, pass_hat_k_estimate)
    # A curve needs two points; a single k is already pass_rate (k=1) or meaningless.
    if len(at_k) >= 2:
        summary["pass_at_k"] = at_k
        summary["pass_hat_k"] = hat_k
    tallies = list(scan.rows.values())
    # Intervals treat the dataset row as the unit (its attempts share a prompt); see
    # `osmosis.eval.results.intervals` for which method applies when.
    bounded = bool(scan.rewards) and min(scan.rewards) >= 0.0 and max(scan.rewards) <= 1.0
    mean_reward = (
        mean_ci(
            ((t[3], t[2]) for t in tallies if t[2]),
            bounded=bounded,
            level=level,
            resamples=resamples,
            seed=seed,
        )
        if scan.rewards
        else None
    )
    pass_rate = proportion_ci(((t[1], t[0]) for t in tallies), level=level) if completed else None
    summary["confidence_intervals"] = {
        "mean_reward": mean_reward.as_dict() if mean_reward is not None else None,
        "pass_rate": pass_rate.as_dict() if pass_rate is not None else None,
    }
    summary["errors_by_type"] = dict(
        sorted(scan.errors.items(), key=lambda item: (-item[1], item[0]))
    )
    summary["cost_usd"] = scan.cost
    # The four outcomes (`osmosis.vocabulary.outcome`): `failed` above counts errors only, so a
    # wrong answer shows here as `not_passed`, never as a failure.
    summary["outcomes"] = dict(scan.outcomes)
    return summary


def reference_summary(summary: Mapping[str, Any]) -> dict[str, Any]:
    """Drop our extra keys, leaving the summary exactly as the reference writes it.

    reference_summary(summarize(rows))
    # {"total_samples": 10, "completed_samples": 8, ..., "pass_at_k": [...]}
    """
    return {key: value for key, value in summary.items() if key not in EXTRA_SUMMARY_KEYS}


def _keyed_by_k(points: Iterable[Mapping[str, Any]]) -> dict[str, float]:
    return {str(point["k"]): point["value"] for point in points}


def platform_results(
    summary: Mapping[str, Any],
    *,
    sampled_rows: int | None = None,
    total_dataset_rows: int | None = None,
    resumed_count: int | None = None,
) -> dict[str, Any]:
    """Reshape a summary into the platform's `eval_run.results` (pass@k keyed by k).

    platform_results(summary, sampled_rows=5, total_dataset_rows=5, resumed_count=0)
    # {"score": 0.667, "pass_rate": 0.5, ..., "reward_stats": {..., "pass_at_k": {"1": 0.5}}}
    """
    stats = summary.get("reward_stats")
    platform_stats: dict[str, Any] | None = None
    if stats is not None:
        platform_stats = {key: stats[key] for key in ("mean", "std", "min", "median", "max")}
        if "pass_at_k" in summary:
            platform_stats["pass_at_k"] = _keyed_by_k(summary["pass_at_k"])
    results: dict[str, Any] = {
        "score": stats["mean"] if stats is not None else None,
        "pass_rate": summary["pass_rate"],
        "graded": summary["graded"],
        "passed": summary["passed"],
        "failed": summary["failed"],
        "skipped": summary["skipped"],
        "total_runs": summary["completed_samples"],
        "sampled_rows": sampled_rows,
        "pass_threshold": summary["pass_threshold"],
        "total_tokens": summary["tokens_used"],
        "total_dataset_rows": total_dataset_rows,
        "resumed_count": resumed_count,
        "reward_stats": platform_stats,
    }
    # Our extras ride after the platform's own keys, in the same keyed-by-k style.
    if "pass_hat_k" in summary:
        results["pass_hat_k"] = _keyed_by_k(summary["pass_hat_k"])
    for key in ("confidence_intervals", "errors_by_type", "cost_usd"):
        if key in summary:
            results[key] = summary[key]
    return results


def platform_metrics(
    summary: Mapping[str, Any], *, status: str, duration_ms: float | None
) -> dict[str, Any]:
    """Reshape a summary into the platform's `GET /metrics` body.

    platform_metrics(summary, status="finished", duration_ms=1234.5)
    # {"status": "finished", "overview": {...}, "reward_stats": {...}, "pass_at_k": [...]}
    """
    overview_keys = REFERENCE_SUMMARY_KEYS[:9]  # the counts, rates and tokens
    return {
        "status": status,
        "overview": {"duration_ms": duration_ms} | {key: summary[key] for key in overview_keys},
        "reward_stats": summary.get("reward_stats"),
        "pass_at_k": list(summary.get("pass_at_k", [])),
    }
