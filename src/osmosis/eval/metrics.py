"""Aggregate metrics over finished attempts: the reference summary, pass@k, pass^k and intervals.

Everything here is a pure function of the attempts, so the local engine (over `AttemptRecord`s)
and the platform (over `index.jsonl` rows) compute the same numbers from the same results.
`summarize` reproduces the reference `aggregate_metrics` summary key for key and value for value,
then appends a few keys of our own (`EXTRA_SUMMARY_KEYS`).

    summary = summarize(records, pass_threshold=1.0)
    summary["pass_rate"], summary["pass_at_k"]  # (0.5, [{"k": 1, "value": 0.5}, ...])
"""

from __future__ import annotations

import math
import random
import statistics
from collections import Counter
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Final, Literal, Protocol, TypeAlias, TypeGuard

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

DEFAULT_PASS_THRESHOLD: Final = 1.0
DEFAULT_LEVEL: Final = 0.95
DEFAULT_RESAMPLES: Final = 2000
DEFAULT_SEED: Final = 20_240_817
"""Fixed so that the same attempts always give the same interval, run after run."""

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

EXTRA_SUMMARY_KEYS: Final = ("pass_hat_k", "confidence_intervals", "errors_by_type", "cost_usd")
"""Keys `summarize` adds after the reference ones; `reference_summary` strips them."""

# Relative cost of one binomial draw against one direct row draw, and the most work one
# interval may take before the large-sample normal form of the same bootstrap is used instead.
# Measured on CPython 3.11: a binomial draw costs about as much as eight row draws, and a
# million row draws take about a third of a second.
_BINOMIAL_COST: Final = 8
_WORK_LIMIT: Final = 1_000_000


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


@dataclass(frozen=True, slots=True)
class ConfidenceInterval:
    """An interval for a ratio of row sums, such as pass rate or mean reward.

    ci = bootstrap_ci([(1, 1), (0, 1), (1, 1)])
    ci.low <= ci.estimate <= ci.high  # True
    """

    estimate: float
    """The point estimate: sum of numerators over sum of denominators."""
    low: float
    high: float
    level: float
    """Nominal coverage, such as 0.95."""
    method: Literal["bootstrap", "normal"]
    """`bootstrap`: percentile interval over resampled rows. `normal`: its large-sample form."""
    resamples: int
    """Bootstrap resamples drawn (0 for `normal`)."""
    seed: int

    def as_dict(self) -> dict[str, Any]:
        """Return the interval as a JSON-ready dict.

        bootstrap_ci([(1, 1), (0, 1), (1, 1)]).as_dict()
        # {"estimate": 0.666…, "low": 0.0, "high": 1.0, "level": 0.95, "method": "bootstrap", ...}
        """
        return asdict(self)


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


def _is_number(value: object) -> TypeGuard[float]:
    # The reference counts any non-bool int or float; a NaN or infinity cannot come out of a
    # valid record or a JSON index line, so treating one as "no reward" only guards odd input.
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _check_threshold(pass_threshold: float) -> float:
    if not _is_number(pass_threshold):
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


class _Loose:
    """Key of an attempt without an integer row_index: its own row, left out of pass@k."""

    __slots__ = ()


def _scan(attempts: Iterable[Attempt], pass_threshold: float) -> _Scan:
    # One pass, locals only: this loop is the whole cost of summarising 100,000 attempts.
    scan = _Scan()
    rows, rewards, errors = scan.rows, scan.rewards, scan.errors
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
        if cost is not None and _is_number(cost):
            costs.append(float(cost))
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
        if reward is not None and _is_number(reward):
            value = float(reward)
            rewards.append(value)
            tally[2] += 1
            tally[3] += value
            if value >= pass_threshold:
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


# --------------------------------------------------------------------------- intervals


def _binomial(rng: random.Random, trials: int, p: float) -> int:
    """Draw from Binomial(trials, p) in O(1) expected time (Hörmann's BTRS for large means)."""
    if trials <= 0 or p <= 0.0:
        return 0
    if p >= 1.0:
        return trials
    if p > 0.5:
        return trials - _binomial(rng, trials, 1.0 - p)  # BTRS wants p <= 1/2
    if trials * p < 10.0:
        # Few successes expected: jump from success to success by geometric waiting times.
        log_q = math.log1p(-p)
        successes = position = 0
        while True:
            position += math.floor(math.log(1.0 - rng.random()) / log_q) + 1
            if position > trials:
                return successes
            successes += 1
    # Transformed rejection with squeeze (W. Hörmann, 1993), as in numpy's sampler.
    q = 1.0 - p
    spq = math.sqrt(trials * p * q)
    b = 1.15 + 2.53 * spq
    a = -0.0873 + 0.0248 * b + 0.01 * p
    c = trials * p + 0.5
    v_r = 0.92 - 4.2 / b
    exact: tuple[float, float, int, float] | None = None  # set up on the first rejection only
    while True:
        u = rng.random() - 0.5
        v = rng.random()
        us = 0.5 - abs(u)
        if us <= 0.0:
            continue  # u hit -0.5 exactly; the transform is undefined there
        k = math.floor((2.0 * a / us + b) * u + c)
        if k < 0 or k > trials:
            continue
        if us >= 0.07 and v <= v_r:
            return k  # inside the squeeze: accept without evaluating the density
        if exact is None:
            mode = math.floor((trials + 1) * p)
            exact = (
                (2.83 + 5.1 / b) * spq,
                math.log(p / q),
                mode,
                math.lgamma(mode + 1) + math.lgamma(trials - mode + 1),
            )
        alpha, log_odds, mode, log_h = exact
        v *= alpha / (a / (us * us) + b)
        if v <= 0.0 or math.log(v) <= (
            log_h - math.lgamma(k + 1) - math.lgamma(trials - k + 1) + (k - mode) * log_odds
        ):
            return k


def _quantile(ordered: Sequence[float], q: float) -> float:
    # Linear interpolation between order statistics (numpy's default "linear" rule).
    position = q * (len(ordered) - 1)
    below = math.floor(position)
    above = min(below + 1, len(ordered) - 1)
    return ordered[below] + (position - below) * (ordered[above] - ordered[below])


def _resample_ratios(
    patterns: list[tuple[tuple[float, float], int]], resamples: int, rng: random.Random
) -> list[float]:
    total = sum(count for _, count in patterns)
    ratios: list[float] = []
    if len(patterns) * _BINOMIAL_COST < total:
        # Few distinct rows (binary rewards, few attempts): a resample is a multinomial draw of
        # how often each distinct row recurs, done as a chain of conditional binomials.
        for _ in range(resamples):
            remaining, weight_left = total, total
            numerator = denominator = 0.0
            for (x, y), count in patterns:
                if remaining == 0:
                    break
                drawn = (
                    remaining
                    if count == weight_left
                    else _binomial(rng, remaining, count / weight_left)
                )
                weight_left -= count
                remaining -= drawn
                numerator += drawn * x
                denominator += drawn * y
            ratios.append(numerator / denominator)
        return ratios
    # Many distinct rows: draw rows directly. A complex number carries (numerator, denominator)
    # so one C-level sum adds both.
    population = [complex(x, y) for (x, y), count in patterns for _ in range(count)]
    for _ in range(resamples):
        pair = sum(rng.choices(population, k=total), 0j)
        ratios.append(pair.real / pair.imag)
    return ratios


def bootstrap_ci(
    rows: Iterable[tuple[float, float]],
    *,
    level: float = DEFAULT_LEVEL,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = DEFAULT_SEED,
    method: Literal["auto", "bootstrap", "normal"] = "auto",
) -> ConfidenceInterval:
    """Interval for sum(numerators) / sum(denominators), resampling whole rows with replacement.

    Each row is one dataset row's `(numerator, denominator)`, e.g. `(passes, attempts)` for the
    pass rate or `(reward_sum, rewards)` for the mean reward, so a row's attempts always travel
    together. The percentile bootstrap is exact and seeded; `auto` switches to its large-sample
    normal form only when many distinct rows would make resampling slow.

    ci = bootstrap_ci([(2, 2), (0, 2), (1, 2)], seed=7)
    (ci.low, ci.estimate, ci.high)  # (0.0, 0.5, 1.0)
    """
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be between 0 and 1, got {level!r}")
    if resamples < 1:
        raise ValueError(f"resamples must be at least 1, got {resamples!r}")
    # Identical rows are interchangeable, so the bootstrap can work on the distinct rows and
    # their counts: far cheaper for binary rewards, and blind to the order rows arrived in.
    patterns: list[tuple[tuple[float, float], int]] = []
    for (numerator, denominator), count in Counter(rows).items():
        if not (_is_number(numerator) and _is_number(denominator) and denominator > 0):
            raise ValueError(
                "each row needs a finite numerator and a positive denominator, "
                f"got ({numerator!r}, {denominator!r})"
            )
        patterns.append(((float(numerator), float(denominator)), count))
    if not patterns:
        raise ValueError("an interval needs at least one row")
    total = sum(count for _, count in patterns)
    numerator_sum = math.fsum(x * count for (x, _), count in patterns)
    denominator_sum = math.fsum(y * count for (_, y), count in patterns)
    if len(patterns) == 1:
        (x, y), _ = patterns[0]
        estimate = x / y  # every row alike: the exact ratio, free of the sums' rounding
    else:
        estimate = numerator_sum / denominator_sum
    if method == "auto":
        work = min(len(patterns) * _BINOMIAL_COST, total) * resamples
        method = "bootstrap" if work <= _WORK_LIMIT or len(patterns) == 1 else "normal"
    if method == "bootstrap":
        patterns.sort(key=lambda item: (-item[1], item[0]))  # a canonical order for the seed
        rng = random.Random(seed)
        drawn = sorted(_resample_ratios(patterns, resamples, rng)) if len(patterns) > 1 else []
        tail = (1.0 - level) / 2.0
        low = _quantile(drawn, tail) if drawn else estimate
        high = _quantile(drawn, 1.0 - tail) if drawn else estimate
        used = resamples
    else:
        # Linearised ratio: a resample's ratio moves by sum(x - estimate*y) / sum(y), whose
        # spread over resamples of `total` rows is sqrt(sum((x - estimate*y)^2)) / sum(y).
        spread = math.fsum(count * (x - estimate * y) ** 2 for (x, y), count in patterns)
        half_width = (
            statistics.NormalDist().inv_cdf(0.5 + level / 2.0) * math.sqrt(spread) / denominator_sum
        )
        # A ratio of row sums is a weighted mean of the row ratios, so it cannot leave their range.
        ratios = [x / y for (x, y), _ in patterns]
        low = max(estimate - half_width, min(ratios))
        high = min(estimate + half_width, max(ratios))
        used = 0
    # Percentiles and the estimate are summed in different orders; keep an ulp of rounding
    # from putting the estimate outside its own interval.
    return ConfidenceInterval(
        estimate=estimate,
        low=min(low, estimate),
        high=max(high, estimate),
        level=level,
        method=method,
        resamples=used,
        seed=seed,
    )


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
    options: dict[str, Any] = {"level": level, "resamples": resamples, "seed": seed}
    summary["confidence_intervals"] = {
        "mean_reward": (
            bootstrap_ci(((t[3], t[2]) for t in tallies if t[2]), **options).as_dict()
            if scan.rewards
            else None
        ),
        "pass_rate": (
            bootstrap_ci(((t[1], t[0]) for t in tallies), **options).as_dict()
            if completed
            else None
        ),
    }
    summary["errors_by_type"] = dict(
        sorted(scan.errors.items(), key=lambda item: (-item[1], item[0]))
    )
    summary["cost_usd"] = scan.cost
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
