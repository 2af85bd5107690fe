"""Two or more runs on the same dataset, row by row: which rows regressed or improved against
the first run (the baseline), and how much the pass rate and mean reward moved, each with an
interval over the rows scored in both runs.

Pure functions: the CLI (`osmosis eval compare`) feeds them attempts read from run
directories or the platform, the dashboard feeds them row tallies from SQL.

    outcomes = [row_outcomes(base_attempts), row_outcomes(new_attempts)]
    result = compare_outcomes(["base", "new"], outcomes)
    result.differences[0].counts["regressed"], result.differences[0].pass_rate.interval.low

A difference's interval (`Difference.interval.method`):

- `bootstrap_paired`: rows resampled with both runs' values together (seeded), used only with
  at least `BOOTSTRAP_MIN_ROWS` paired rows of which at least `MIN_CHANGED_ROWS` changed —
  below that the bootstrap cannot see the changes it never drew and comes out too narrow
  (identical runs would "prove" a difference of exactly 0).
- `newcombe_paired`: otherwise, for pass rates and mean rewards in [0, 1]: MOVER from each
  run's Wilson interval and the correlation of their row values (Newcombe 1998, method 10,
  when each row has one attempt). It never collapses to a point.
- `t_paired`: otherwise, for rewards outside [0, 1]: Student's t on the row differences.

A gate (`regression_gate`) trusts the interval, not row flips: a run regressed only when the
interval of its change lies wholly below `-margin`. Two runs of one config on a sampling model
flip rows both ways by chance; those flips stay listed, and a row whose attempts disagree
within one run is *flaky* (`RowOutcome.flaky`, `Comparison.flaky_rows`).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Final, Literal

from osmosis.eval.results.intervals import (
    BOOTSTRAP_MIN_ROWS,
    DEFAULT_LEVEL,
    DEFAULT_RESAMPLES,
    DEFAULT_SEED,
    ConfidenceInterval,
    correlation,
    mover_difference,
    paired_bootstrap_ci,
    proportion_ci,
    t_ci,
)
from osmosis.eval.results.metrics import DEFAULT_PASS_THRESHOLD, Attempt, tally_rows

__all__ = [
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

ROW_KINDS: Final = ("regressed", "improved", "same", "missing")
"""How a row of a run compares with the baseline's row (see `classify`)."""

MIN_CHANGED_ROWS: Final = 10
"""Rows whose value must differ between the runs before a paired bootstrap is trusted."""

RowKind = Literal["regressed", "improved", "same", "missing"]
Measure = Literal["pass_rate", "mean_reward"]


@dataclass(frozen=True, slots=True)
class RowOutcome:
    """One dataset row of one run, reduced to what a comparison needs.

    outcome = RowOutcome(attempts=4, passes=3, failed=1, rewards=3, reward_sum=3.0)
    outcome.rate, outcome.mean_reward  # (0.75, 1.0)
    """

    attempts: int
    """Non-skipped attempts (the pass-rate denominator, as `summarize` counts)."""
    passes: int
    """Attempts whose reward reached the pass threshold."""
    failed: int = 0
    """Attempts that ended `failed`."""
    rewards: int = 0
    """Non-skipped attempts that carry a reward."""
    reward_sum: float = 0.0

    @property
    def rate(self) -> float | None:
        """The row's pass rate; None when no attempt was scored (all skipped)."""
        return self.passes / self.attempts if self.attempts else None

    @property
    def mean_reward(self) -> float | None:
        return self.reward_sum / self.rewards if self.rewards else None

    @property
    def flaky(self) -> bool:
        """The row's scored attempts disagree within the run: some passed, some did not.

        RowOutcome(attempts=4, passes=2).flaky, RowOutcome(attempts=4, passes=4).flaky
        # (True, False)
        """
        return 0 < self.passes < self.attempts

    def as_dict(self) -> dict[str, Any]:
        return {
            "attempts": self.attempts,
            "passes": self.passes,
            "failed": self.failed,
            "pass_rate": self.rate,
            "mean_reward": self.mean_reward,
            "flaky": self.flaky,
        }


def row_outcomes(
    attempts: Iterable[Attempt], pass_threshold: float = DEFAULT_PASS_THRESHOLD
) -> dict[int, RowOutcome]:
    """Reduce a run's attempts (records or index/API row dicts) to one outcome per row.

    row_outcomes([{"row_index": 0, "run_index": 0, "status": "success", "reward": 1.0}])
    # {0: RowOutcome(attempts=1, passes=1, failed=0, rewards=1, reward_sum=1.0)}
    """
    items = list(attempts)
    failed: dict[int, int] = {}
    for item in items:
        row, status = _field(item, "row_index"), _field(item, "status")
        if status == "failed" and isinstance(row, int):
            failed[row] = failed.get(row, 0) + 1
    return {
        row: RowOutcome(
            attempts=tally.attempts,
            passes=tally.passes,
            failed=failed.get(row, 0),
            rewards=tally.rewards,
            reward_sum=tally.reward_sum,
        )
        for row, tally in tally_rows(items, pass_threshold).items()
    }


def source_rows(attempts: Iterable[Attempt]) -> dict[int, int]:
    """Each row's position in the dataset file (`source_row_index`), where attempts carry it.

    Rows are paired across runs by `row_index`, their position in each run's selection; this
    says whether a pair is one dataset row (see `check_alignment`).

    source_rows([{"row_index": 0, "source_row_index": 13}])  # {0: 13}
    """
    found: dict[int, int] = {}
    for item in attempts:
        row, source = _field(item, "row_index"), _field(item, "source_row_index")
        if isinstance(row, int) and isinstance(source, int):
            found.setdefault(row, source)
    return found


def _field(item: Attempt, name: str) -> object:
    return item.get(name) if isinstance(item, Mapping) else getattr(item, name, None)


def classify(base: RowOutcome | None, other: RowOutcome | None) -> RowKind:
    """`regressed` / `improved`: the row's pass rate fell / rose against the baseline;
    `same`: equal; `missing`: the row is absent, or has no scored attempt, in either run.

    Rewards below the threshold do not move a row: a CI gate on "any regressed row" must not
    trip on noise in partial credit (the mean-reward difference reports that).

    classify(RowOutcome(1, 1), RowOutcome(1, 0))  # 'regressed'
    """
    if base is None or other is None or base.rate is None or other.rate is None:
        return "missing"
    if other.rate < base.rate:
        return "regressed"
    if other.rate > base.rate:
        return "improved"
    return "same"


# --------------------------------------------------------------------------- alignment


@dataclass(frozen=True, slots=True)
class RunIdentity:
    """What says two runs evaluated the same thing; None where a source cannot tell."""

    label: str
    dataset_sha256: str | None = None
    rows_digest: str | None = None
    """Identity of the selected rows (a local manifest's `inputs.dataset.selected_source_rows`)."""
    pass_threshold: float | None = None


def check_alignment(
    identities: Sequence[RunIdentity],
    outcomes: Sequence[Mapping[int, RowOutcome]],
    *,
    source_rows: Sequence[Mapping[int, int] | None] | None = None,
) -> list[str]:
    """Every reason the runs cannot be compared row for row; empty when they line up.

    `source_rows` (one per run, None where a run cannot tell; see `source_rows()`) catches
    rows paired by index that are different dataset rows, as two random samples are.

    check_alignment([RunIdentity("a", "sha1"), RunIdentity("b", "sha2")], [{}, {}])
    # ["dataset differs: a has sha256 sha1…, b has sha2…"]
    """
    if len(identities) != len(outcomes) or (
        source_rows is not None and len(source_rows) != len(identities)
    ):
        raise ValueError("one identity per run")
    problems: list[str] = []
    base = identities[0]
    for ident in identities[1:]:
        if (
            base.dataset_sha256
            and ident.dataset_sha256
            and base.dataset_sha256 != ident.dataset_sha256
        ):
            problems.append(
                f"dataset differs: {base.label} has sha256 {base.dataset_sha256[:12]}…, "
                f"{ident.label} has {ident.dataset_sha256[:12]}…"
            )
        if base.rows_digest and ident.rows_digest and base.rows_digest != ident.rows_digest:
            problems.append(
                f"selected rows differ: {base.label} and {ident.label} ran different rows "
                "of the dataset (limit, sample or --rows)"
            )
        if (
            base.pass_threshold is not None
            and ident.pass_threshold is not None
            and base.pass_threshold != ident.pass_threshold
        ):
            problems.append(
                f"pass threshold differs: {base.label} {base.pass_threshold:g}, "
                f"{ident.label} {ident.pass_threshold:g}"
            )
    base_rows = set(outcomes[0])
    for ident, rows in zip(identities[1:], outcomes[1:], strict=True):
        only_base, only_other = sorted(base_rows - set(rows)), sorted(set(rows) - base_rows)
        if only_base or only_other:
            parts = []
            if only_base:
                parts.append(f"{len(only_base)} only in {base.label} ({_some(only_base)})")
            if only_other:
                parts.append(f"{len(only_other)} only in {ident.label} ({_some(only_other)})")
            problems.append(f"rows differ: {'; '.join(parts)}")
    if source_rows is not None and source_rows[0] is not None:
        base_sources = source_rows[0]
        for ident, sources in zip(identities[1:], source_rows[1:], strict=True):
            if sources is None:
                continue
            paired = sorted(set(base_sources) & set(sources))
            moved = [row for row in paired if base_sources[row] != sources[row]]
            if moved:
                shown = "; ".join(
                    f"row {row}: {base_sources[row]} in {base.label}, {sources[row]} in "
                    f"{ident.label}"
                    for row in moved[:2]
                )
                problems.append(
                    f"rows are other dataset rows: {len(moved)} of {len(paired)} rows paired by "
                    f"index ran different source rows ({shown}{'; …' if len(moved) > 2 else ''})"
                )
    return problems


def _some(rows: Sequence[int], limit: int = 5) -> str:
    shown = ", ".join(str(row) for row in rows[:limit])
    return shown + (", …" if len(rows) > limit else "")


# --------------------------------------------------------------------------- comparing


@dataclass(frozen=True, slots=True)
class Difference:
    """How a measure moved from the baseline to another run, over rows scored in both."""

    baseline: float
    other: float
    interval: ConfidenceInterval
    """`interval.estimate` is `other - baseline`."""

    def as_dict(self) -> dict[str, Any]:
        return {
            "baseline": self.baseline,
            "other": self.other,
            "difference": self.interval.estimate,
            "interval": self.interval.as_dict(),
        }


@dataclass(frozen=True, slots=True)
class RowComparison:
    """One row across the runs: `outcomes[i]` of run i, `kinds[i]` of run i+1 vs the baseline."""

    row_index: int
    outcomes: tuple[RowOutcome | None, ...]
    kinds: tuple[RowKind, ...]

    def as_dict(self) -> dict[str, Any]:
        return {
            "row_index": self.row_index,
            "outcomes": [o.as_dict() if o is not None else None for o in self.outcomes],
            "kinds": list(self.kinds),
        }


@dataclass(frozen=True, slots=True)
class RunDifference:
    """One run against the baseline: row counts by kind and the two measured differences."""

    label: str
    paired_rows: int
    """Rows scored in both runs: the rows the differences are computed over."""
    counts: dict[str, int]
    pass_rate: Difference | None
    mean_reward: Difference | None

    def as_dict(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "paired_rows": self.paired_rows,
            "counts": dict(self.counts),
            "pass_rate": self.pass_rate.as_dict() if self.pass_rate else None,
            "mean_reward": self.mean_reward.as_dict() if self.mean_reward else None,
        }


@dataclass(frozen=True, slots=True)
class Comparison:
    """The runs (baseline first), every row of any run, and each run's difference."""

    labels: tuple[str, ...]
    rows: list[RowComparison]
    differences: list[RunDifference]
    problems: list[str] = field(default_factory=list)
    """Alignment problems the caller chose to proceed past (see `check_alignment`)."""

    @property
    def regressed_rows(self) -> list[int]:
        """Rows that regressed in any run against the baseline (information: a sampling
        model flips rows both ways by chance; `regression_gate` decides)."""
        return [row.row_index for row in self.rows if "regressed" in row.kinds]

    @property
    def flaky_rows(self) -> dict[str, list[int]]:
        """Each run's rows whose attempts disagree within that run (`RowOutcome.flaky`)."""
        return {
            label: [
                row.row_index
                for row in self.rows
                if (found := row.outcomes[position]) is not None and found.flaky
            ]
            for position, label in enumerate(self.labels)
        }

    def as_dict(self) -> dict[str, Any]:
        return {
            "baseline": self.labels[0],
            "runs": list(self.labels),
            "problems": list(self.problems),
            "differences": [d.as_dict() for d in self.differences],
            "regressed_rows": self.regressed_rows,
            "flaky_rows": self.flaky_rows,
            "rows": [row.as_dict() for row in self.rows],
        }


@dataclass(frozen=True, slots=True)
class GateResult:
    """`regression_gate`'s verdict: which runs' intervals lie wholly below `-margin`."""

    measure: Measure
    margin: float
    regressed: list[RunDifference]
    """Runs whose interval of the change has its high end below `-margin`."""
    ungated: list[str]
    """Labels of runs with no interval for the measure (no paired rows, no rewards)."""

    @property
    def failed(self) -> bool:
        return bool(self.regressed)

    def as_dict(self) -> dict[str, Any]:
        return {
            "measure": self.measure,
            "margin": self.margin,
            "failed": self.failed,
            "regressed_runs": [d.label for d in self.regressed],
            "ungated_runs": list(self.ungated),
        }


def regression_gate(
    comparison: Comparison, *, margin: float = 0.0, measure: Measure = "pass_rate"
) -> GateResult:
    """A run regressed when the whole interval of its change lies below `-margin`: noise that
    flips rows both ways keeps the interval across 0 and passes.

    gate = regression_gate(compare_outcomes(["a", "b"], [a, b]), margin=0.02)
    gate.failed, [d.label for d in gate.regressed]
    """
    if not math.isfinite(margin) or margin < 0:
        raise ValueError(f"margin must be a finite number >= 0, got {margin!r}")
    regressed, ungated = [], []
    for difference in comparison.differences:
        found = getattr(difference, measure)
        if found is None:
            ungated.append(difference.label)
        elif found.interval.high < -margin:
            regressed.append(difference)
    return GateResult(measure=measure, margin=margin, regressed=regressed, ungated=ungated)


def compare_outcomes(
    labels: Sequence[str],
    outcomes: Sequence[Mapping[int, RowOutcome]],
    *,
    problems: Sequence[str] = (),
    level: float = DEFAULT_LEVEL,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = DEFAULT_SEED,
) -> Comparison:
    """Compare runs 2..N with run 1, row by row (rows keyed by `row_index`).

    result = compare_outcomes(["a", "b", "c"], [row_outcomes(a), row_outcomes(b), ...])
    [d.counts["regressed"] for d in result.differences]  # one per run after the first
    """
    if len(labels) < 2 or len(labels) != len(outcomes):
        raise ValueError("compare needs two or more runs, one label per run")
    every_row = sorted(set().union(*(set(o) for o in outcomes)))
    base = outcomes[0]
    rows = []
    for row_index in every_row:
        found = tuple(o.get(row_index) for o in outcomes)
        rows.append(
            RowComparison(
                row_index=row_index,
                outcomes=found,
                kinds=tuple(classify(found[0], other) for other in found[1:]),
            )
        )
    differences = []
    for position, (label, other) in enumerate(zip(labels[1:], outcomes[1:], strict=True)):
        counts = dict.fromkeys(ROW_KINDS, 0)
        for compared in rows:
            counts[compared.kinds[position]] += 1
        paired = [
            (base[row], other[row])
            for row in every_row
            if row in base and row in other and base[row].attempts and other[row].attempts
        ]
        pass_rate, mean_reward = (
            _difference(paired, measure, level=level, resamples=resamples, seed=seed)
            for measure in ("pass_rate", "mean_reward")
        )
        differences.append(
            RunDifference(
                label=label,
                paired_rows=len(paired),
                counts=counts,
                pass_rate=pass_rate,
                mean_reward=mean_reward,
            )
        )
    return Comparison(
        labels=tuple(labels), rows=rows, differences=differences, problems=list(problems)
    )


def _values(outcome: RowOutcome, measure: Measure) -> tuple[float, float]:
    if measure == "pass_rate":
        return float(outcome.passes), float(outcome.attempts)
    return outcome.reward_sum, float(outcome.rewards)


def _difference(
    paired: Sequence[tuple[RowOutcome, RowOutcome]],
    measure: Measure,
    *,
    level: float,
    resamples: int,
    seed: int,
) -> Difference | None:
    if measure == "mean_reward":
        paired = [(a, b) for a, b in paired if a.rewards and b.rewards]
    if not paired:
        return None
    base_rows = [_values(a, measure) for a, _ in paired]
    other_rows = [_values(b, measure) for _, b in paired]
    ratios = [(x / y, u / v) for (x, y), (u, v) in zip(base_rows, other_rows, strict=True)]
    bounded = measure == "pass_rate" or all(0.0 <= r <= 1.0 for pair in ratios for r in pair)
    changed = sum(1 for a, b in ratios if a != b)
    base_value = math.fsum(x for x, _ in base_rows) / math.fsum(y for _, y in base_rows)
    other_value = math.fsum(x for x, _ in other_rows) / math.fsum(y for _, y in other_rows)
    if len(paired) >= BOOTSTRAP_MIN_ROWS and changed >= MIN_CHANGED_ROWS:
        interval = paired_bootstrap_ci(
            [(x, y, u, v) for (x, y), (u, v) in zip(base_rows, other_rows, strict=True)],
            level=level,
            resamples=resamples,
            seed=seed,
            bounds=(-1.0, 1.0) if bounded else (-math.inf, math.inf),
        )
    elif bounded:
        interval = mover_difference(
            proportion_ci(base_rows, level=level),
            proportion_ci(other_rows, level=level),
            correlation=correlation(ratios),
        )
    else:
        t_interval = _t_paired([b - a for a, b in ratios], level=level)
        if t_interval is None:
            return None
        interval = t_interval
        # t works on row means, so the two values are the runs' mean row means here.
        base_value = statistics.fmean(a for a, _ in ratios)
        other_value = statistics.fmean(b for _, b in ratios)
    return Difference(baseline=base_value, other=other_value, interval=interval)


def _t_paired(deltas: Sequence[float], *, level: float) -> ConfidenceInterval | None:
    """Student's t on per-row differences; None when they cannot vary (under 2 rows, or all
    equal with unbounded rewards: no honest interval without a bound)."""
    if len(set(deltas)) < 2:
        return None
    interval = t_ci([(delta, 1.0) for delta in deltas], level=level)
    return replace(interval, method="t_paired") if interval is not None else None
