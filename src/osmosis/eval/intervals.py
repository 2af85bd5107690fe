"""Confidence intervals for ratios of row sums (pass rate, mean reward): a bootstrap over
rows, so the attempts of one row stay together, seeded so the same results give the same
interval every time.

    ci = bootstrap_ci([(1, 1), (0, 1), (1, 1)])   # (numerator, denominator) per row
    ci.low <= ci.estimate <= ci.high              # True
"""

from __future__ import annotations

import math
import random
import statistics
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Final, Literal, TypeGuard

__all__ = [
    "DEFAULT_LEVEL",
    "DEFAULT_RESAMPLES",
    "DEFAULT_SEED",
    "ConfidenceInterval",
    "bootstrap_ci",
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

# Relative cost of one binomial draw against one direct row draw, and the most work one
# interval may take before the large-sample normal form of the same bootstrap is used instead.
# Measured on CPython 3.11: a binomial draw costs about as much as eight row draws, and a
# million row draws take about a third of a second.
_BINOMIAL_COST: Final = 8
_WORK_LIMIT: Final = 1_000_000


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
        if not (is_finite_number(numerator) and is_finite_number(denominator) and denominator > 0):
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
