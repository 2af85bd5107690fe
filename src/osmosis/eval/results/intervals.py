"""Confidence intervals that stay honest on small samples and at 0 % or 100 %.

A run's pass rate is a proportion over dataset rows, and a row's attempts are not independent
(same prompt, same model), so every interval here treats the row as the unit:

- `proportion_ci` — pass rate, and mean reward when every reward lies in [0, 1]: the Wilson
  score interval (`wilson`) when each row has one attempt; with several attempts per row, the
  Wilson interval at the design-effect effective sample size (`wilson_cluster`, as Korn &
  Graubard 1998 do for clustered samples). Neither collapses to a point at 0 or 1: 3 rows
  that all pass give 0.438 to 1.000 at 95 %.
- `mean_ci` — mean reward: `proportion_ci` for rewards in [0, 1]; otherwise Student's t on the
  cluster-robust standard error (`t_cluster`, < 30 rows) or the row bootstrap (`bootstrap`,
  >= 30 rows, `normal` being its large-sample form), and no interval at all when every row
  has the same mean (without a bound on rewards nothing honest can be said).
- `bootstrap_ci` — the seeded percentile bootstrap over rows: valid only with enough rows
  (`BOOTSTRAP_MIN_ROWS`), which is where `mean_ci` and the compare differences use it.
- `mover_difference` — a difference of two paired proportions from each one's interval
  (MOVER, Zou & Donner 2008; Newcombe 1998's method 10 for one attempt per row).

    ci = proportion_ci([(1, 1), (1, 1), (1, 1)])   # (passes, attempts) per row
    (ci.method, round(ci.low, 4), ci.high)          # ('wilson', 0.4385, 1.0)
"""

from __future__ import annotations

import math
import random
import statistics
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Final, Literal, TypeGuard

__all__ = [
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


def is_finite_number(value: object) -> TypeGuard[float]:
    """A finite int or float, never a bool: what counts as a reward or a count here."""
    # The reference counts any non-bool int or float; a NaN or infinity cannot come out of a
    # valid record or a JSON index line, so treating one as "no number" only guards odd input.
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


DEFAULT_LEVEL: Final = 0.95
DEFAULT_RESAMPLES: Final = 2000
DEFAULT_SEED: Final = 20_240_817
"""Fixed so that the same attempts always give the same interval, run after run."""

BOOTSTRAP_MIN_ROWS: Final = 30
"""Fewer rows than this and a percentile bootstrap is too narrow (it cannot see values it
never drew, and 3 rows that all pass resample to exactly 1.0): a small-sample method is used."""

# Relative cost of one binomial draw against one direct row draw, and the most work one
# interval may take before the large-sample normal form of the same bootstrap is used instead.
# Measured on CPython 3.11: a binomial draw costs about as much as eight row draws, and a
# million row draws take about a third of a second.
_BINOMIAL_COST: Final = 8
_WORK_LIMIT: Final = 1_000_000

Method = Literal[
    "wilson",
    "wilson_cluster",
    "t_cluster",
    "bootstrap",
    "normal",
    "newcombe_paired",
    "t_paired",
    "bootstrap_paired",
    "normal_paired",
]


@dataclass(frozen=True, slots=True)
class ConfidenceInterval:
    """An interval for a pass rate, a mean reward, or a difference of two of them.

    ci = proportion_ci([(2, 2), (0, 2), (1, 2)])
    ci.low <= ci.estimate <= ci.high  # True
    """

    estimate: float
    """The point estimate, e.g. sum of passes over sum of attempts."""
    low: float
    high: float
    level: float
    """Nominal coverage, such as 0.95."""
    method: Method
    """How it was computed; see the module docstring (and docs/platform.md)."""
    resamples: int = 0
    """Bootstrap resamples drawn (0 for every other method)."""
    seed: int | None = None
    """The bootstrap's seed (None for every other method)."""
    effective_n: float | None = None
    """Sample size the Wilson or t interval used: rows, or rows adjusted for clustering."""

    def as_dict(self) -> dict[str, Any]:
        """Return the interval as a JSON-ready dict.

        proportion_ci([(1, 1), (0, 1), (1, 1)]).as_dict()
        # {"estimate": 0.666…, "low": 0.208…, "high": 0.938…, "method": "wilson", ...}
        """
        return asdict(self)


def _check_level(level: float) -> float:
    if not (is_finite_number(level) and 0.0 < level < 1.0):
        raise ValueError(f"level must be between 0 and 1, got {level!r}")
    return float(level)


def _z(level: float) -> float:
    return statistics.NormalDist().inv_cdf(0.5 + level / 2.0)


def _rows(rows: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    checked = []
    for numerator, denominator in rows:
        if not (is_finite_number(numerator) and is_finite_number(denominator) and denominator > 0):
            raise ValueError(
                "each row needs a finite numerator and a positive denominator, "
                f"got ({numerator!r}, {denominator!r})"
            )
        checked.append((float(numerator), float(denominator)))
    if not checked:
        raise ValueError("an interval needs at least one row")
    return checked


# --------------------------------------------------------------------------- Wilson


def wilson_bounds(
    estimate: float, n: float, *, level: float = DEFAULT_LEVEL
) -> tuple[float, float]:
    """The Wilson score interval for a proportion `estimate` observed on `n` (may be fractional).

    wilson_bounds(1.0, 3)  # (0.4385, 1.0): 3 of 3 is far from proof of 100 %
    wilson_bounds(0.0, 20)  # (0.0, 0.1611)
    """
    level = _check_level(level)
    if not (is_finite_number(n) and n > 0):
        raise ValueError(f"n must be positive, got {n!r}")
    if not (is_finite_number(estimate) and 0.0 <= estimate <= 1.0):
        raise ValueError(f"a proportion lies in [0, 1], got {estimate!r}")
    z2 = _z(level) ** 2
    scale = 1.0 + z2 / n
    centre = (estimate + z2 / (2.0 * n)) / scale
    half = math.sqrt(z2) / scale * math.sqrt(estimate * (1.0 - estimate) / n + z2 / (4.0 * n * n))
    # Exact at the edges (the formula gives 1 - 1e-17 for 3 of 3), and never outside [0, 1].
    low = 0.0 if estimate == 0.0 else max(0.0, centre - half)
    high = 1.0 if estimate == 1.0 else min(1.0, centre + half)
    return low, high


def _cluster(rows: list[tuple[float, float]]) -> tuple[float, float, float]:
    """(estimate, total denominator, cluster-robust variance of the ratio of sums)."""
    total = math.fsum(y for _, y in rows)
    estimate = math.fsum(x for x, _ in rows) / total
    variance = math.fsum((x - estimate * y) ** 2 for x, y in rows) / (total * total)
    return estimate, total, variance


def proportion_ci(
    rows: Iterable[tuple[float, float]], *, level: float = DEFAULT_LEVEL
) -> ConfidenceInterval:
    """Interval for sum(numerators) / sum(denominators) of rows whose values lie in [0, 1].

    Each row is one dataset row's `(passes, attempts)` (or `(reward_sum, rewards)` for rewards
    in [0, 1]). One attempt per row: the Wilson interval on the rows. Several: the Wilson
    interval at the effective sample size `p(1-p) / V`, V being the cluster-robust variance of
    the ratio, kept between the number of rows (attempts of a row fully alike) and the number
    of attempts (independent). At 0 or 1 V says nothing about how alike a row's attempts are,
    so the row count is used: the cautious end.

    proportion_ci([(4, 4), (0, 4), (2, 4)]).effective_n  # 4.5
    """
    level = _check_level(level)
    checked = _rows(rows)
    if any(x < 0.0 or x > y for x, y in checked):
        raise ValueError("a proportion needs 0 <= numerator <= denominator in every row")
    estimate, total, variance = _cluster(checked)
    count = len(checked)
    if all(y == 1.0 for _, y in checked):
        method: Method = "wilson"
        n = float(count)  # here V is exactly p(1-p)/n: the plain Wilson interval
    else:
        method = "wilson_cluster"
        spread = estimate * (1.0 - estimate)
        if spread == 0.0:
            n = float(count)  # all pass or all fail: assume a row's attempts fully alike
        elif variance == 0.0:
            n = total  # every row has exactly the overall rate: nothing clusters
        else:
            n = min(total, max(float(count), spread / variance))
    low, high = wilson_bounds(min(1.0, max(0.0, estimate)), n, level=level)
    return ConfidenceInterval(
        estimate=estimate,
        low=min(low, estimate),
        high=max(high, estimate),
        level=level,
        method=method,
        effective_n=n,
    )


# --------------------------------------------------------------------------- Student's t


def _incomplete_beta(a: float, b: float, x: float) -> float:
    """The regularised incomplete beta function I_x(a, b) (continued fraction, Lentz)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    if x > (a + 1.0) / (a + b + 2.0):
        return 1.0 - _incomplete_beta(b, a, 1.0 - x)  # the fraction converges fast below here
    front = math.exp(
        math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    )
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    result = d
    for m in range(1, 300):
        for numerator in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            result *= c * d
        if abs(c * d - 1.0) < 1e-15:
            break
    return front * result / a


def student_t_quantile(probability: float, df: float) -> float:
    """The `probability` quantile of Student's t with `df` degrees of freedom.

    student_t_quantile(0.975, 2)  # 4.302653
    student_t_quantile(0.975, 9)  # 2.262157
    """
    if not 0.0 < probability < 1.0 or df <= 0:
        raise ValueError("need 0 < probability < 1 and df > 0")
    if probability < 0.5:
        return -student_t_quantile(1.0 - probability, df)

    def upper_tail(t: float) -> float:  # P(T > t) for t >= 0
        return 0.5 * _incomplete_beta(df / 2.0, 0.5, df / (df + t * t))

    target = 1.0 - probability
    low, high = 0.0, 1.0
    while upper_tail(high) > target:
        high *= 2.0
    for _ in range(200):  # bisection: slow but sure, and run a handful of times per run
        middle = (low + high) / 2.0
        if upper_tail(middle) > target:
            low = middle
        else:
            high = middle
        if high - low < 1e-12 * max(1.0, high):
            break
    return (low + high) / 2.0


def t_ci(
    rows: Iterable[tuple[float, float]], *, level: float = DEFAULT_LEVEL
) -> ConfidenceInterval | None:
    """Student's t interval for a ratio of row sums with a cluster-robust standard error on
    `rows - 1` degrees of freedom; None with fewer than 2 rows or when every row is alike.

    t_ci([(3.0, 1), (5.0, 1), (4.0, 1)])  # mean 4, t(2) 4.303 x 0.577: 1.516 to 6.484
    """
    level = _check_level(level)
    checked = _rows(rows)
    count = len(checked)
    if count < 2:
        return None
    estimate, _, variance = _cluster(checked)
    variance *= count / (count - 1)  # the usual small-sample correction of the robust form
    if variance <= 0.0:
        return None
    half = student_t_quantile(0.5 + level / 2.0, count - 1) * math.sqrt(variance)
    return ConfidenceInterval(
        estimate=estimate,
        low=estimate - half,
        high=estimate + half,
        level=level,
        method="t_cluster",
        effective_n=float(count),
    )


# --------------------------------------------------------------------------- mean reward


def mean_ci(
    rows: Iterable[tuple[float, float]],
    *,
    bounded: bool,
    level: float = DEFAULT_LEVEL,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = DEFAULT_SEED,
) -> ConfidenceInterval | None:
    """Interval for a mean reward from `(reward_sum, rewards)` per row.

    `bounded`: every reward lies in [0, 1], so the proportion interval is valid (a variable in
    [0, 1] never varies more than a pass/fail one with the same mean). Otherwise Student's t
    below `BOOTSTRAP_MIN_ROWS` rows and the row bootstrap from there on; None when every row
    has the same mean, since nothing honest can be said without a bound.

    mean_ci([(0.5, 1), (1.0, 1)], bounded=True).method  # 'wilson'
    """
    checked = _rows(rows)
    if bounded:
        return proportion_ci(checked, level=level)
    if len({x / y for x, y in checked}) < 2:
        return None
    if len(checked) < BOOTSTRAP_MIN_ROWS:
        return t_ci(checked, level=level)
    return bootstrap_ci(checked, level=level, resamples=resamples, seed=seed)


# --------------------------------------------------------------------------- differences


def mover_difference(
    baseline: ConfidenceInterval,
    other: ConfidenceInterval,
    *,
    correlation: float,
    bounds: tuple[float, float] = (-1.0, 1.0),
) -> ConfidenceInterval:
    """Interval for `other - baseline` from each estimate's own interval and their correlation
    (MOVER: Zou & Donner 2008; with Wilson limits and one attempt per row this is Newcombe
    1998's method 10 for paired proportions).

    a = proportion_ci([(1, 1)] * 8 + [(0, 1)] * 2)
    b = proportion_ci([(1, 1)] * 5 + [(0, 1)] * 5)
    mover_difference(a, b, correlation=0.5).estimate  # -0.3
    """
    r = max(-1.0, min(1.0, correlation)) if math.isfinite(correlation) else 0.0
    d = other.estimate - baseline.estimate
    other_down, other_up = other.estimate - other.low, other.high - other.estimate
    base_down, base_up = baseline.estimate - baseline.low, baseline.high - baseline.estimate
    # max(0, ...): rounding must not take a square root of a tiny negative number.
    below = math.sqrt(max(0.0, other_down**2 - 2 * r * other_down * base_up + base_up**2))
    above = math.sqrt(max(0.0, other_up**2 - 2 * r * other_up * base_down + base_down**2))
    return ConfidenceInterval(
        estimate=d,
        low=max(bounds[0], d - below),
        high=min(bounds[1], d + above),
        level=baseline.level,
        method="newcombe_paired",
    )


def correlation(pairs: Sequence[tuple[float, float]]) -> float:
    """Pearson's r of paired values; 0 when either side does not vary (Newcombe's rule)."""
    if len(pairs) < 2:
        return 0.0
    mean_a = math.fsum(a for a, _ in pairs) / len(pairs)
    mean_b = math.fsum(b for _, b in pairs) / len(pairs)
    cov = math.fsum((a - mean_a) * (b - mean_b) for a, b in pairs)
    var_a = math.fsum((a - mean_a) ** 2 for a, _ in pairs)
    var_b = math.fsum((b - mean_b) ** 2 for _, b in pairs)
    if var_a <= 0.0 or var_b <= 0.0:
        return 0.0
    return cov / math.sqrt(var_a * var_b)


# --------------------------------------------------------------------------- bootstrap


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


def _resample_sums(
    patterns: list[tuple[tuple[float, ...], int]], resamples: int, rng: random.Random
) -> Iterator[tuple[float, ...]]:
    """Per resample of the rows (with replacement), the column sums of the drawn rows."""
    total = sum(count for _, count in patterns)
    width = len(patterns[0][0])
    if len(patterns) * _BINOMIAL_COST < total:
        # Few distinct rows (binary rewards, few attempts): a resample is a multinomial draw of
        # how often each distinct row recurs, done as a chain of conditional binomials.
        for _ in range(resamples):
            remaining, weight_left = total, total
            sums = [0.0] * width
            for values, count in patterns:
                if remaining == 0:
                    break
                drawn = (
                    remaining
                    if count == weight_left
                    else _binomial(rng, remaining, count / weight_left)
                )
                weight_left -= count
                remaining -= drawn
                for column, value in enumerate(values):
                    sums[column] += drawn * value
            yield tuple(sums)
        return
    # Many distinct rows: draw rows directly. Complex numbers carry two columns each, so one
    # C-level sum adds both.
    rows = [values for values, count in patterns for _ in range(count)]
    columns = [
        [complex(row[i], row[i + 1] if i + 1 < width else 0.0) for row in rows]
        for i in range(0, width, 2)
    ]
    positions = range(total)
    for _ in range(resamples):
        picked = rng.choices(positions, k=total)
        column_sums: list[float] = []
        for values_of in columns:
            pair = sum(map(values_of.__getitem__, picked), 0j)
            column_sums += [pair.real, pair.imag]
        yield tuple(column_sums[:width])


def _patterns(rows: Iterable[tuple[float, ...]]) -> list[tuple[tuple[float, ...], int]]:
    # Identical rows are interchangeable, so the bootstrap can work on the distinct rows and
    # their counts: far cheaper for binary rewards, and blind to the order rows arrived in.
    patterns = [(tuple(float(v) for v in values), count) for values, count in Counter(rows).items()]
    patterns.sort(key=lambda item: (-item[1], item[0]))  # a canonical order for the seed
    return patterns


def _percentiles(values: list[float], level: float) -> tuple[float, float]:
    ordered = sorted(values)
    tail = (1.0 - level) / 2.0
    return _quantile(ordered, tail), _quantile(ordered, 1.0 - tail)


def _bootstrap_method(patterns: list[Any], resamples: int) -> Literal["bootstrap", "normal"]:
    total = sum(count for _, count in patterns)
    work = min(len(patterns) * _BINOMIAL_COST, total) * resamples
    return "bootstrap" if work <= _WORK_LIMIT or len(patterns) == 1 else "normal"


def bootstrap_ci(
    rows: Iterable[tuple[float, float]],
    *,
    level: float = DEFAULT_LEVEL,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = DEFAULT_SEED,
    method: Literal["auto", "bootstrap", "normal"] = "auto",
) -> ConfidenceInterval:
    """Interval for sum(numerators) / sum(denominators), resampling whole rows with replacement.

    Each row is one dataset row's `(numerator, denominator)`, so a row's attempts always travel
    together. The percentile bootstrap is seeded; `auto` switches to its large-sample normal
    form only when many distinct rows would make resampling slow. Valid only with enough rows
    (`BOOTSTRAP_MIN_ROWS`): on 3 rows that all pass it says 1.0 to 1.0, which is why run
    intervals use `proportion_ci` and this serves unbounded mean rewards on many rows.

    ci = bootstrap_ci([(2, 2), (0, 2), (1, 2)] * 20, seed=7)
    ci.low < ci.estimate < ci.high  # True
    """
    level = _check_level(level)
    if resamples < 1:
        raise ValueError(f"resamples must be at least 1, got {resamples!r}")
    patterns = _patterns(_rows(rows))
    numerator_sum = math.fsum(v[0] * count for v, count in patterns)
    denominator_sum = math.fsum(v[1] * count for v, count in patterns)
    if len(patterns) == 1:
        (x, y), _ = patterns[0]
        estimate = x / y  # every row alike: the exact ratio, free of the sums' rounding
    else:
        estimate = numerator_sum / denominator_sum
    chosen = _bootstrap_method(patterns, resamples) if method == "auto" else method
    if chosen == "bootstrap":
        rng = random.Random(seed)
        if len(patterns) > 1:
            ratios = [x / y for x, y in _resample_sums(patterns, resamples, rng)]
            low, high = _percentiles(ratios, level)
        else:
            low = high = estimate
        used, used_seed = resamples, seed
    else:
        # Linearised ratio: a resample's ratio moves by sum(x - estimate*y) / sum(y), whose
        # spread over resamples of `total` rows is sqrt(sum((x - estimate*y)^2)) / sum(y).
        spread = math.fsum(count * (v[0] - estimate * v[1]) ** 2 for v, count in patterns)
        half_width = _z(level) * math.sqrt(spread) / denominator_sum
        # A ratio of row sums is a weighted mean of the row ratios, so it cannot leave their range.
        ratios = [v[0] / v[1] for v, _ in patterns]
        low = max(estimate - half_width, min(ratios))
        high = min(estimate + half_width, max(ratios))
        used, used_seed = 0, None
    # Percentiles and the estimate are summed in different orders; keep an ulp of rounding
    # from putting the estimate outside its own interval.
    return ConfidenceInterval(
        estimate=estimate,
        low=min(low, estimate),
        high=max(high, estimate),
        level=level,
        method=chosen,
        resamples=used,
        seed=used_seed,
    )


def paired_bootstrap_ci(
    rows: Iterable[tuple[float, float, float, float]],
    *,
    level: float = DEFAULT_LEVEL,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = DEFAULT_SEED,
    bounds: tuple[float, float] = (-math.inf, math.inf),
) -> ConfidenceInterval:
    """Interval for the difference of two ratios of row sums over the same rows, resampling
    rows with both runs' values together (a paired bootstrap, seeded).

    Each row is `(base_numerator, base_denominator, other_numerator, other_denominator)`; the
    estimate is sum(other_num)/sum(other_den) - sum(base_num)/sum(base_den).

    ci = paired_bootstrap_ci([(1, 1, 0, 1)] * 12 + [(1, 1, 1, 1)] * 28)
    ci.estimate  # -0.3
    """
    level = _check_level(level)
    if resamples < 1:
        raise ValueError(f"resamples must be at least 1, got {resamples!r}")
    checked = []
    for row in rows:
        xa, ya, xb, yb = row
        _rows([(xa, ya), (xb, yb)])  # the same checks as one run's rows
        checked.append((float(xa), float(ya), float(xb), float(yb)))
    if not checked:
        raise ValueError("an interval needs at least one row")
    patterns = _patterns(checked)
    xa_sum, ya_sum, xb_sum, yb_sum = (
        math.fsum(v[i] * count for v, count in patterns) for i in range(4)
    )
    base, other = xa_sum / ya_sum, xb_sum / yb_sum
    estimate = other - base
    if _bootstrap_method(patterns, resamples) == "bootstrap":
        rng = random.Random(seed)
        drawn = [b / yb - a / ya for a, ya, b, yb in _resample_sums(patterns, resamples, rng)]
        low, high = _percentiles(drawn, level)
        method: Method = "bootstrap_paired"
        used, used_seed = resamples, seed
    else:
        # Linearised: each row moves the difference by its share of each run's ratio.
        spread = math.fsum(
            count * ((v[2] - other * v[3]) / yb_sum - (v[0] - base * v[1]) / ya_sum) ** 2
            for v, count in patterns
        )
        half = _z(level) * math.sqrt(spread)
        low, high = estimate - half, estimate + half
        method, used, used_seed = "normal_paired", 0, None
    return ConfidenceInterval(
        estimate=estimate,
        low=max(bounds[0], min(low, estimate)),
        high=min(bounds[1], max(high, estimate)),
        level=level,
        method=method,
        resamples=used,
        seed=used_seed,
    )
